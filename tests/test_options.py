from pathlib import Path

import pytest

from pytest_infergate.errors import OptionError
from pytest_infergate.options import OPTION_SPECS, Options
from pytest_infergate.requirements import parse_precisions


def from_dicts(cli=None, ini=None):
    cli, ini = cli or {}, ini or {}
    return Options.from_sources(cli.get, ini.get)


def test_defaults_on_cpu():
    options = from_dicts()
    assert options.device == "cpu"
    assert options.reference_precision == "fp32"
    assert options.precisions == ("fp32", "int8", "nf4")
    assert options.model == "smollm2-135m"


def test_gpu_reference_defaults_to_fp16():
    assert from_dicts({"gpu": True}).reference_precision == "fp16"


def test_cli_wins_over_ini():
    options = from_dicts({"model": "tiny-random-llama"}, {"model": "smollm2-135m", "precisions": "fp32,bf16"})
    assert options.model == "tiny-random-llama"
    assert options.precisions == ("fp32", "bf16")


def test_ini_bool_strings():
    assert from_dicts(ini={"fallback": "true"}).fallback is True
    with pytest.raises(OptionError, match="infergate_fallback"):
        from_dicts(ini={"fallback": "maybe"})


def test_unknown_precision_lists_valid_names():
    with pytest.raises(OptionError,
                       match=r"unknown precision in --infergate-precisions 'int3'.*fp32, fp16, bf16, int8, nf4"):
        parse_precisions("fp32,int3")


def test_duplicate_precisions_collapse_in_order():
    assert parse_precisions(" nf4, fp32 ,nf4") == ("nf4", "fp32")


def test_paths_expand_user():
    options = from_dicts({"cache_dir": "~/x", "report": "out/r.html"})
    assert options.cache_dir == Path.home() / "x"
    assert options.report == Path("out/r.html")


def test_every_option_has_help_and_prefix():
    for spec in OPTION_SPECS:
        assert spec.flag.startswith("--infergate-") and spec.ini_key.startswith("infergate_")
        assert len(spec.help) > 20
