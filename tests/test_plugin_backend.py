"""--infergate-backend through pytest: the gates on HF generate (asked for, or where the engine refuses the model),
engine-only experiments skipped with the reason, the backend in every record, the summary and the report."""

import json
import shutil
from pathlib import Path

import pytest

SAMPLES = [{"id": f"q{i}", "category": "chat", "messages": [{"role": "user", "content": text}], "max_new_tokens": 8}
           for i, text in enumerate(["capital?", "def f():", "hello there"])]

TEST_FILE = """
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(prompt_token_ids=[5 + i] * (8 + i), max_new_tokens=6, ignore_eos=True) for i in range(4)]
CONFIG = dict(max_model_len=256, kv_budget_bytes=8 << 20)

def test_bench(infergate_bench, infergate_backend):
    m = infergate_bench(REQS, EngineConfig(**CONFIG), repeats=1, warmup=1)
    assert m.num_requests == 4 and m.num_failed == 0
    assert m.engine["backend"] == infergate_backend.name

def test_prefix_caching(infergate_bench):
    infergate_bench(REQS, EngineConfig(**CONFIG, prefix_caching=True), repeats=1, warmup=0)

def test_golden(infergate_golden):
    infergate_golden.check_regression()
"""


@pytest.fixture
def project(pytester, cache_dir):
    golden = pytester.mkdir("golden")
    (golden / "set.jsonl").write_text("\n".join(json.dumps(s) for s in SAMPLES) + "\n")
    pytester.makepyfile(TEST_FILE)

    def run(*args, model="tiny-random-llama"):
        return pytester.runpytest(f"--infergate-model={model}", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32", "-p", "no:cacheprovider", "-rs",
                                  "--infergate-json=out.json", "--infergate-update-golden", *args)

    return pytester, run


def outcome(pytester, test: str) -> str:
    outcomes = json.loads((pytester.path / "out.json").read_text())["outcomes"]
    return next(value for nodeid, value in outcomes.items() if f"::{test}[" in nodeid)


def records(pytester) -> tuple[dict, dict[str, dict]]:
    data = json.loads((pytester.path / "out.json").read_text())
    return data["models"]["fp32"], {r["test"].split("::")[-1].split("[")[0]: r for r in data["records"]}


def test_hf_backend_asked_for_runs_the_gates_and_skips_engine_only_experiments(project):
    pytester, run = project
    result = run("--infergate-backend=hf", "--infergate-report=report.html")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines([
        "*fp32: load * s, weights*", "*backend: hf-generate, because asked for (--infergate-backend hf)*",
        "*perf PASS*test_bench?fp32? ?backend: hf-generate?: ttft_ms_p50*",  # ? for [ ]: fnmatch's classes
        "*golden UPDATED fp32 ?backend: hf-generate?*",
        "SKIPPED*prefix caching needs the infergate engine; this run uses the hf-generate backend: asked for "
        "(--infergate-backend hf)"])
    assert outcome(pytester, "test_prefix_caching") == "skipped"
    model, by_test = records(pytester)
    assert (model["backend"], model["backend_reason"], model["self_check_s"]) == (
        "hf-generate", "asked for (--infergate-backend hf)", None)  # no self-check: the engine was not asked for
    for test in ("test_bench", "test_golden"):
        assert by_test[test]["backend"] == "hf-generate" and "asked for" in by_test[test]["backend_reason"]
    assert "test_prefix_caching" not in by_test
    perf = by_test["test_bench"]
    # what HF generate really ran (static batches, its own cache), and a fingerprint no engine baseline matches
    assert (perf["engine_config"]["batching"], perf["engine_config"]["cache_mode"]) == ("static", "contiguous")
    assert perf["fingerprint"]["backend"] == "hf-generate"
    accepted = json.loads(Path(by_test["test_golden"]["path"]).read_text().splitlines()[0])  # the file's header
    assert accepted["key"]["under_test"]["method"]["backend"].startswith("hf-generate: static batches")
    report = (pytester.path / "report.html").read_text()
    assert "Run on HF generate, not the engine" in report and "<b>hf-generate</b> · static" in report


def test_auto_runs_the_engine_and_states_the_self_check_cost(project):
    pytester, run = project
    result = run()
    result.assert_outcomes(passed=3)
    model, by_test = records(pytester)
    assert model["backend"] == "engine" and model["backend_reason"] == "" and model["self_check_s"] > 0
    assert {r["backend"] for r in by_test.values()} == {"engine"}
    result.stdout.fnmatch_lines(["*fp32: load * s, self-check * s, weights*"])
    result.stdout.no_fnmatch_line("*hf-generate*")  # quiet on the engine


@pytest.fixture
def refused_model(tmp_path_factory, tiny_source):
    """A model directory of a family the engine refuses (BLOOM: attention outside AttentionInterface), with
    tiny-random-llama's tokenizer."""
    from zoo_models import build_model

    directory = tmp_path_factory.mktemp("bloom")
    build_model("bloom").save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(Path(tiny_source.path) / name, directory / name)
    return directory


def test_a_refused_model_falls_back_under_auto_and_fails_under_engine(project, refused_model):
    pytester, run = project
    result = run(model=str(refused_model))
    result.assert_outcomes(passed=2, skipped=1)
    model, by_test = records(pytester)
    assert model["backend"] == "hf-generate" and "model family 'bloom'" in model["backend_reason"]
    assert model["self_check_s"] > 0  # what the refusal cost
    assert by_test["test_bench"]["backend_reason"] == model["backend_reason"]
    result.stdout.fnmatch_lines(["*backend: hf-generate, because model family 'bloom'*",
                                 "SKIPPED*prefix caching needs the infergate engine; this run uses the hf-generate "
                                 "backend: model family 'bloom'*"])
    assert outcome(pytester, "test_prefix_caching") == "skipped"

    result = run("--infergate-backend=engine", "-k", "test_bench", model=str(refused_model))
    result.assert_outcomes(errors=1)  # at setup, as a model that fails to load
    result.stdout.fnmatch_lines(["*--infergate-backend engine, but the engine refuses * in fp32: model family "
                                 "'bloom' does not call transformers' attention interface*"])


def test_an_unknown_backend_is_a_usage_error(project):
    pytester, run = project
    result = run("--infergate-backend=bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--infergate-backend / infergate_backend = 'bogus' is not a backend: choose from "
                                 "auto, engine, hf*"])
