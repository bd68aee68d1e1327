"""Limits and stability (guide, best practices 4 and 5: "控制上下文长度" and "超时、限流和异常回退"; pitfall 4):
context-length cap, max new tokens, deadlines, queue cap, KV budget exhaustion (preemption, nothing lost), and
the success rate under load. Every submitted request must end in exactly one terminal state. On HF generate
(the engine refused the model, or --infergate-backend hf) the caps and the success rate run on it; the queue,
submit-time rejection and preemption are the engine's scheduler's and are skipped."""

import pytest

from pytest_infergate.engine import EngineConfig, FinishReason, Request
from pytest_infergate.workloads import chat_workload
from pytest_infergate.workloads.request import RequestError


@pytest.fixture
def engine(infergate_model, infergate_backend, infergate_options, infergate_precision):
    """`engine(**config)`: the model's backend (the engine, or HF generate) on EngineConfig(**config)."""
    if infergate_precision != infergate_options.reference_precision:
        pytest.skip("the limits suite runs on the reference precision")

    def make(**kw):
        kw.setdefault("max_model_len", 1024)
        if "kv_budget_blocks" not in kw:
            kw.setdefault("kv_budget_bytes", 256 << 20)
        return infergate_backend.build(infergate_model.model, infergate_model.tokenizer, EngineConfig(**kw))

    return make


def test_context_length_cap(engine, needs_engine):
    needs_engine("submit-time rejection (Engine.submit)")
    with engine(max_input_tokens=64) as e:
        rid = e.submit(Request(prompt_token_ids=[10] * 100, max_new_tokens=4))
        assert e.result(rid).finish_reason is FinishReason.REJECTED and "max_input_tokens is 64" in e.result(rid).reason
        with pytest.raises(RequestError, match="over the context window of 1024"):
            e.submit(Request(prompt_token_ids=[10] * 2000, max_new_tokens=4))
    with engine(max_input_tokens=64, truncate_input=True) as e:
        (result,) = e.generate([Request(prompt_token_ids=list(range(100, 200)), max_new_tokens=4)])
        assert result.prompt_token_ids == list(range(136, 200)) and result.ok


def test_max_new_tokens_cap(engine):
    with engine(max_new_tokens_limit=8) as e:
        (result,) = e.generate([Request(prompt="Tell me a long story.", max_new_tokens=500, ignore_eos=True)])
        assert result.num_output_tokens == 8 and result.finish_reason is FinishReason.LENGTH


def test_deadline_and_queue_cap(engine, needs_engine, infergate_tokenizer):
    needs_engine("the request queue (max_queue_len)")
    with engine(max_queue_len=4, max_batch_size=2) as e:
        ids = [e.submit(r) for r in chat_workload(infergate_tokenizer, 8, max_new_tokens=(16, 16), seed=5)]
        fast = e.submit(Request(prompt="Hi", max_new_tokens=200, ignore_eos=True, deadline_s=0.2))
        e.run_until_done()
        reasons = [e.result(i).finish_reason for i in ids + [fast]]
        assert reasons.count(FinishReason.REJECTED) >= 4  # the queue held 4
        assert e.result(fast).finish_reason in (FinishReason.REJECTED, FinishReason.TIMED_OUT)
        assert all(r is not None for r in reasons)
        e.check_drained()


def test_kv_exhaustion_preempts_and_loses_nothing(engine, needs_engine, infergate_tokenizer, record_property):
    needs_engine("preemption on KV exhaustion")
    requests = chat_workload(infergate_tokenizer, 8, prompt_tokens=(100, 300), max_new_tokens=(16, 32), seed=6)
    with engine(kv_budget_blocks=40, block_size=16, max_model_len=512, max_batch_size=8) as e:
        results = e.generate(requests)
        preemptions = sum(r.num_preemptions for r in results)
        record_property("preemptions", preemptions)
        assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
        assert preemptions > 0, "the KV budget was never exhausted; lower kv_budget_blocks"
        e.check_drained()


def test_success_rate_under_load(engine, infergate_tokenizer, record_property):
    from pytest_infergate.workloads import with_poisson_arrivals

    requests = with_poisson_arrivals(chat_workload(infergate_tokenizer, 16, max_new_tokens=(8, 24), seed=7),
                                     rate_per_s=8.0, seed=8)
    for r in requests:
        r.deadline_s = 60.0
    with engine(max_batch_size=8, max_queue_len=32) as e:
        results = e.generate(requests)
    ok = sum(r.ok for r in results) / len(results)
    record_property("success_rate", ok)
    assert len(results) == len(requests)
    assert ok >= 0.99, {r.finish_reason.value for r in results}
