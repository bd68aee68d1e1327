"""The CUDA code paths, exercised on the CPU with torch.cuda's functions stood in for: worker pinning under xdist,
the memory split around a measured region, where quantized models are placed, and how CUDA graphs are captured.
The same paths run for real in tests/test_gpu.py (marked `gpu`, skipped without CUDA) and
benchmarks/gpu_check.sh."""

from types import SimpleNamespace

import pytest
import torch


class FakeCuda:
    """Records what the code under test asks of torch.cuda; memory figures are set by the test."""

    def __init__(self, monkeypatch, count: int = 2):
        self.calls: list[tuple] = []
        self.allocated = 100
        self.peak = 100
        self.reserved = 128
        for name, value in {"is_available": lambda: True, "device_count": lambda: count,
                            "set_device": lambda index: self.calls.append(("set_device", index)),
                            "synchronize": lambda device=None: self.calls.append(("synchronize", device)),
                            "reset_peak_memory_stats": lambda device=None: self.calls.append(("reset", device)),
                            "memory_allocated": lambda device=None: self.allocated,
                            "max_memory_allocated": lambda device=None: self.peak,
                            "max_memory_reserved": lambda device=None: self.reserved}.items():
            monkeypatch.setattr(torch.cuda, name, value)


@pytest.mark.parametrize("worker,count,expected", [("gw0", 2, 0), ("gw3", 2, 1), ("gw2", 4, 2), ("gw5", 1, 0)])
def test_xdist_workers_are_pinned_to_gpus_modulo_the_count(monkeypatch, worker, count, expected):
    from pytest_infergate.options import Options
    from pytest_infergate.plugin import _pin_gpu

    cuda = FakeCuda(monkeypatch, count)
    config = SimpleNamespace(workerinput={"workerid": worker, "workercount": 6})
    options = _pin_gpu(config, Options(gpu=True))
    assert options.gpu_index == expected and options.device == f"cuda:{expected}"
    assert options.reference_precision == "fp16"  # a pinned worker keeps the GPU reference
    assert cuda.calls == [("set_device", expected)]


def test_gpu_without_a_worker_is_not_pinned(monkeypatch):
    from pytest_infergate.options import Options
    from pytest_infergate.plugin import _pin_gpu

    cuda = FakeCuda(monkeypatch)
    assert _pin_gpu(SimpleNamespace(), Options(gpu=True)).device == "cuda"
    assert cuda.calls == []


def test_peak_memory_on_cuda_resets_and_synchronizes_around_the_region(monkeypatch):
    from pytest_infergate.process_meters import PeakMemory

    cuda = FakeCuda(monkeypatch)
    with PeakMemory("cuda:1") as peak:
        assert cuda.calls == [("synchronize", "cuda:1"), ("reset", "cuda:1")]  # the peak of this region only
        cuda.peak, cuda.reserved = 700, 1024
    assert cuda.calls[-1] == ("synchronize", "cuda:1")  # queued kernels finish before the counters are read
    result = peak.result
    assert result.method == "cuda.max_memory_allocated"
    assert (result.start_bytes, result.peak_bytes, result.delta_bytes, result.reserved_peak_bytes) == (100, 700, 600,
                                                                                                         1024)


@pytest.mark.parametrize("precision,device,placement", [
    ("int8", "cuda:1", {"": 1}), ("nf4", "cuda", {"": 0}), ("int8", "cpu", "cpu"), ("fp16", "cuda:1", None)])
def test_quantized_models_are_placed_on_the_pinned_gpu(monkeypatch, tiny_source, precision, device, placement):
    import transformers

    from pytest_infergate.errors import ModelLoadError
    from pytest_infergate.models import load_model

    FakeCuda(monkeypatch)  # the load's memory probe asks torch.cuda for its counters
    seen = {}

    def from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here: only the load arguments are under test")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(ModelLoadError, match="stop here"):
        load_model(tiny_source, precision, device, reference="fp16", tokenizer=object())
    assert seen.get("device_map") == placement
    assert seen["dtype"] == (torch.float16 if precision != "fp32" else torch.float32)


class FakeGraphs:
    """torch.cuda's graph and stream API, recording the order of what CudaCapture does."""

    def __init__(self, monkeypatch):
        import contextlib

        self.log: list = []
        self.current = "default"
        log = self.log
        fake = self

        class Graph:
            count = 0

            def __init__(self):
                Graph.count += 1
                self.name = f"graph{Graph.count}"

            def capture_begin(self, pool=None):
                log.append(("capture_begin", self.name, pool, fake.current))

            def capture_end(self):
                log.append(("capture_end", self.name))

            def pool(self):
                return f"pool-of-{self.name}"

            def replay(self):
                log.append(("replay", self.name))

        class Stream:
            def __init__(self, device=None):
                log.append(("new_stream", device))

            def wait_stream(self, other):
                log.append(("wait_stream", other))

        @contextlib.contextmanager
        def stream(s):
            previous, fake.current = fake.current, "side"
            try:
                yield
            finally:
                fake.current = previous

        for name, value in {"CUDAGraph": Graph, "Stream": Stream, "stream": stream,
                            "current_stream": lambda device=None: "default",
                            "synchronize": lambda device=None: log.append(("synchronize",)),
                            "empty_cache": lambda: log.append(("empty_cache",))}.items():
            monkeypatch.setattr(torch.cuda, name, value, raising=False)


def test_cuda_graphs_warm_up_and_capture_on_one_side_stream_into_one_pool(monkeypatch):
    from pytest_infergate.engine.decode_graphs import CudaCapture

    fake = FakeGraphs(monkeypatch)
    capture = CudaCapture(torch.device("cuda", 0))
    capture.begin()
    assert fake.log == [("synchronize",), ("empty_cache",), ("new_stream", torch.device("cuda", 0))]
    runs = []
    first = capture.capture(lambda: runs.append(fake.current))
    second = capture.capture(lambda: runs.append(fake.current))
    assert runs == ["side"] * 4  # warm-up and capture of each, all on the side stream
    begins = [entry for entry in fake.log if entry[0] == "capture_begin"]
    assert begins == [("capture_begin", "graph1", None, "side"), ("capture_begin", "graph2", "pool-of-graph1", "side")]
    assert [entry for entry in fake.log if entry[0] == "capture_end"] == [("capture_end", "graph1"),
                                                                          ("capture_end", "graph2")]
    second()
    first()
    assert fake.log[-2:] == [("replay", "graph2"), ("replay", "graph1")]


def test_a_failing_capture_is_ended_and_its_error_raised(monkeypatch):
    from pytest_infergate.engine.decode_graphs import CudaCapture

    fake = FakeGraphs(monkeypatch)
    capture = CudaCapture(torch.device("cuda", 0))
    capture.begin()
    calls = []

    def forward():
        calls.append(len(calls))
        if len(calls) == 2:  # the warm-up runs; the capture hits something a graph cannot hold
            raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        capture.capture(forward)
    assert fake.log[-1] == ("capture_end", "graph1") and capture.pool is None


def test_a_forward_on_cuda_adds_the_device_time_between_two_cuda_events(monkeypatch):
    """The runner records an event before and after the forward's kernels, waits for them, and adds the span
    (elapsed_time is in ms) to its device total; off CUDA nothing is recorded."""
    from pytest_infergate.engine.runner import ModelRunner

    log = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.index = sum(1 for entry in log if entry[0] == "new")
            log.append(("new", self.index))

        def record(self):
            log.append(("record", self.index))

        def elapsed_time(self, end):
            assert end.index == self.index + 1  # begin.elapsed_time(end)
            return 12.5

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("synchronize", device)))
    runner = ModelRunner.__new__(ModelRunner)
    runner.is_cuda, runner.device, runner.device_s, runner.last_device_s = True, torch.device("cuda", 0), 0.0, None
    for _ in range(2):
        with runner._device_timer():
            log.append(("forward",))
    assert log[:6] == [("new", 0), ("new", 1), ("record", 0), ("forward",), ("record", 1),
                       ("synchronize", torch.device("cuda", 0))]
    assert runner.last_device_s == 0.0125 and runner.device_s == pytest.approx(0.025)

    cpu = ModelRunner.__new__(ModelRunner)
    cpu.is_cuda, cpu.device_s, cpu.last_device_s = False, None, None
    with cpu._device_timer():
        pass
    assert cpu.device_s is None and cpu.last_device_s is None


def test_the_load_free_time_on_a_gpu_is_the_engines_device_time_and_on_the_cpu_the_run_queues():
    """process_meters.LoadFreeTimer: on a CUDA device the engine's device-time total over the stretch (capped at the
    wall time), named as device time; a backend without device time (HF generate) is not measured there; on the
    CPU the run-queue estimate."""
    from pytest_infergate import process_meters
    from pytest_infergate.perf import interference
    from pytest_infergate.process_meters import LoadFreeTimer

    engine = SimpleNamespace(device_s=3.0)
    timer = LoadFreeTimer(engine, "cuda:0")
    engine.device_s = 3.4
    assert timer.by == interference.DEVICE_TIME and timer.seconds(1.0) == pytest.approx(0.4)
    assert timer.seconds(0.3) == 0.3  # never more than the wall time
    assert LoadFreeTimer(SimpleNamespace(), "cuda").seconds(1.0) is None
    cpu = LoadFreeTimer(engine, "cpu")
    assert cpu.by == interference.RUN_QUEUE
    seconds = cpu.seconds(1.0)
    assert seconds is None if not process_meters.threads() else 0 <= seconds <= 1.0
