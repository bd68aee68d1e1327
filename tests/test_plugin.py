"""Plugin behaviour, exercised through pytester like a user's own test suite would."""

import pytest


@pytest.fixture
def run(pytester, cache_dir):
    def run(*args, **kwargs):
        return pytester.runpytest("--infergate-model", "tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  *args, **kwargs)

    return run


def test_help_lists_every_option(pytester):
    from pytest_infergate.options import OPTION_SPECS

    result = pytester.runpytest("--help")
    for spec in OPTION_SPECS:
        result.stdout.fnmatch_lines([f"*{spec.flag}*"])
    result.stdout.fnmatch_lines(["*infergate_model (string)*"])


def test_precision_parametrization_ids(pytester, run):
    pytester.makepyfile("""
        def test_p(infergate_precision):
            assert infergate_precision in ("fp32", "int8", "nf4")
    """)
    result = run("-v")
    result.stdout.fnmatch_lines(["*test_p?fp32? PASSED*", "*test_p?int8? PASSED*", "*test_p?nf4? PASSED*"])
    result.assert_outcomes(passed=3)


def test_precisions_option_and_ini(pytester, run):
    pytester.makeini("[pytest]\ninfergate_precisions = fp16\n")
    pytester.makepyfile("def test_p(infergate_precision): pass")
    run("-v").stdout.fnmatch_lines(["*test_p?fp16? PASSED*"])
    run("-v", "--infergate-precisions", "bf16,fp32").assert_outcomes(passed=2)


def test_unknown_precision_is_usage_error(pytester, run):
    pytester.makepyfile("def test_x(): pass")
    result = run("--infergate-precisions", "fp32,int2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown precision*'int2'*choose from fp32, fp16, bf16, int8, nf4*"])


def test_gpu_without_cuda_is_usage_error(pytester, run):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pytester.makepyfile("def test_x(): pass")
    result = run("--infergate-gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--infergate-gpu was given but torch sees no CUDA device*drop --infergate-gpu*"])


def test_model_loaded_once_per_precision(pytester, run):
    pytester.makepyfile("""
        import pytest
        seen = {}

        @pytest.mark.parametrize("i", range(3))
        def test_m(infergate_model, infergate_precision, infergate_tokenizer, i):
            assert infergate_model.precision == infergate_precision
            assert infergate_model.tokenizer is infergate_tokenizer
            seen.setdefault(infergate_precision, set()).add(id(infergate_model.model))

        def test_once():
            assert {p: len(ids) for p, ids in seen.items()} == {"fp32": 1, "int8": 1, "nf4": 1}
    """)
    result = run("-p", "no:randomly")
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(["*infergate*", "*model: tiny-random-llama*", "*fp32: load*", "*nf4: load*"])


def test_reference_model_fixture(pytester, run):
    pytester.makepyfile("""
        def test_ref(infergate_reference_model, infergate_device, infergate_options):
            assert infergate_reference_model.precision == infergate_options.reference_precision == "fp16"
            assert infergate_device == "cpu"
    """)
    run("--infergate-reference-precision", "fp16").assert_outcomes(passed=1)


def test_fixtures_are_documented(pytester):
    result = pytester.runpytest("--fixtures")
    for name in ("infergate_model", "infergate_precision", "infergate_device", "infergate_tokenizer",
                 "infergate_reference_model"):
        result.stdout.fnmatch_lines([f"{name}*", "    *"])


def test_bad_model_is_a_test_error_with_the_reason(pytester, cache_dir):
    pytester.makepyfile("def test_m(infergate_model): pass")
    result = pytester.runpytest("--infergate-model", "no-such-alias", "--infergate-precisions", "fp32",
                                f"--infergate-cache-dir={cache_dir}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*could not load the model*not a built-in alias*"])


def test_failed_precision_errors_or_falls_back(pytester, run, monkeypatch):
    pytester.makeconftest("""
        import pytest_infergate.models.load as pool
        real = pool.load_model
        def fake(source, precision, *a, **k):
            if precision == "nf4":
                from pytest_infergate.errors import ModelLoadError
                raise ModelLoadError("nf4 kernels missing on this device")
            return real(source, precision, *a, **k)
        def pytest_configure(config):
            pool.load_model = fake
        def pytest_unconfigure(config):
            pool.load_model = real  # the module outlives this in-process run
    """)
    pytester.makepyfile("""
        def test_m(infergate_model, infergate_precision):
            if infergate_precision == "nf4":
                assert infergate_model.record.fallback and infergate_model.precision == "fp32"
                assert "kernels missing" in infergate_model.record.fallback_reason
    """)
    strict = run("-p", "no:cacheprovider")
    strict.assert_outcomes(passed=2, errors=1)
    strict.stdout.fnmatch_lines(["*nf4 kernels missing on this device*"])
    lenient = run("--infergate-fallback")
    lenient.assert_outcomes(passed=3)
    lenient.stdout.fnmatch_lines(["*FALLBACK from nf4*"])


def test_plugin_import_does_not_import_torch(pytester):
    pytester.makepyfile("""
        import sys
        def test_lazy():
            assert "torch" not in sys.modules and "transformers" not in sys.modules
    """)
    pytester.runpytest_subprocess("-p", "no:hypothesispytest").assert_outcomes(passed=1)


def test_importing_the_plugin_loads_no_torch():
    # issue #33 point 2: every pytest run of a project that installs the plugin imports it; torch loads only when
    # an infergate fixture is used (pytest_infergate/requirements.py draws the line)
    import subprocess
    import sys

    # the engine's records too (a test file's `from pytest_infergate.engine import EngineConfig`): the engine's
    # names are imported on first use, and those two are plain records
    code = ("import sys, pytest_infergate.plugin, pytest_infergate.cli; "
            "from pytest_infergate.engine import EngineConfig, Request; "
            "print(sorted(m for m in ('torch', 'transformers', 'bitsandbytes') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


OUTBOX_TEST = """
import pytest
from pytest_infergate.session import session_of
from pytest_infergate.results.records import GoldenRecord
from pytest_infergate.status import RELATIVE_CHECK, Finding, Status


@pytest.fixture
def ctx(request):
    return session_of(request.config).context(request.node)


def test_says_a_check_did_not_run(ctx):
    ctx.say(Finding(RELATIVE_CHECK, ctx.test_id, "relative check not run: no entry", "save a baseline"))


@pytest.mark.xfail(reason="a known regression", strict=True)
def test_known_regression(ctx):
    ctx.record(GoldenRecord(ctx.test_id, Status.FAIL, "fp32", "p", problems=["drifted"]))
    raise AssertionError("drifted")
"""


def test_what_a_test_says_reaches_its_report_in_the_phase_and_strict_fails_it_there(pytester):
    """Issue #42 point 4: a fixture object's findings and records wait in the test's outbox until its phase ends,
    inside the phase: a warning that -W error turns into an error fails that test, not the session; under
    --infergate-strict a check that did not run fails its test, saying why; an xfailed test's failed gate fails
    neither the test nor the run."""
    pytester.makepyfile(OUTBOX_TEST)
    quiet = pytester.runpytest("-p", "no:cacheprovider")
    quiet.assert_outcomes(passed=1, xfailed=1)
    quiet.stdout.fnmatch_lines(["*InfergateWarning*relative check not run: no entry (what to do: the infergate "
                                "verdict below)*",
                                "*INCONCLUSIVE not run as asked: *relative check not run: no entry; save a baseline*"])
    assert quiet.ret == pytest.ExitCode.OK
    strict = pytester.runpytest("-p", "no:cacheprovider", "--infergate-strict")
    strict.assert_outcomes(failed=1, xfailed=1)
    strict.stdout.fnmatch_lines(["*::test_says_a_check_did_not_run: relative check not run: no entry; save a baseline",
                                 "(under --infergate-strict what did not decide fails)"])
    as_error = pytester.runpytest("-p", "no:cacheprovider", "-W", "error::pytest_infergate.session.InfergateWarning")
    as_error.assert_outcomes(failed=1, xfailed=1)  # the test, not an INTERNALERROR of the session
    assert "INTERNALERROR" not in as_error.stdout.str()
