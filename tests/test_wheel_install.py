"""The package as a user installs it (issues #44, #45): the wheel built from this checkout, installed into a
scratch venv, gates from an empty folder outside the checkout, with the golden sample set shipped inside it."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

GATE = """
import pytest

import pytest_infergate
from pytest_infergate.engine import EngineConfig

def test_the_plugin_is_the_installed_wheel():
    assert "site-packages" in pytest_infergate.__file__ and {checkout!r} not in pytest_infergate.__file__

def test_speed(infergate_bench):
    m = infergate_bench(config=EngineConfig(max_model_len=512), repeats=1, warmup=0)
    assert m.num_requests > 0 and m.num_failed == 0

# 4 samples: an interval too wide for the 8-bit default (min_top1=0.9) to decide; this test wants a decided gate
@pytest.mark.infergate_quality(min_top1=0.5, max_mean_kl=0.5)
def test_quality(infergate_golden):
    infergate_golden.check(limit=4)
"""


def test_the_wheel_ships_the_sample_set_the_corpus_and_the_report_templates(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "pytest_infergate/quality/samples/default.jsonl" in names
    assert "pytest_infergate/report/templates/report.html" in names
    assert "pytest_infergate/report/templates/_corpus.html" in names
    for name in ("constitution.txt", "alice.txt", "README.md"):  # check_corpus()'s text, its source and licence
        assert f"pytest_infergate/quality/corpus/{name}" in names


@pytest.fixture(scope="module")
def base_gguf(cache_dir, tmp_path_factory) -> Path:
    """A real base-model GGUF: the embedded SmolLM2's (real weights, Q4_1) copied without its chat template by
    gguf's own metadata tool, as a model that never had one reaches the plugin."""
    from pytest_infergate.models.sources import ensure_smollm2_gguf

    out = tmp_path_factory.mktemp("base") / "smollm2-135m-base.Q4_1.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(ensure_smollm2_gguf(cache_dir)),
                    str(out), "--remove-metadata", "tokenizer.chat_template", "--force"], check=True,
                   capture_output=True, timeout=300)
    return out


@pytest.mark.slow
def test_the_installed_wheel_gates_a_base_gguf_from_an_empty_folder_on_the_builtin_samples(wheel, base_gguf,
                                                                                          tmp_path, cache_dir):
    """Issue #44's done-when: from an empty folder outside the checkout, the plugin installed from its wheel runs a
    base-model GGUF's default workload and golden check (fp32 vs int8), both decided, saying that prompts went as
    plain text and that the built-in sample set was used."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    scratch_site = Path(subprocess.run([str(python), "-c", where], check=True, capture_output=True,
                                       text=True).stdout.strip())
    # the wheel into the scratch venv; its dependencies (torch & co.) from this venv's site-packages, listed after
    # it (a .pth names folders only: the checkout's editable install is not among them)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(scratch_site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    (scratch_site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    project = tmp_path / "project"  # no golden/, no conftest, outside the checkout
    project.mkdir()
    (project / "test_gate.py").write_text(GATE.format(checkout=str(REPO)))
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--infergate-model={base_gguf}", f"--infergate-cache-dir={cache_dir}",
                           "--infergate-precisions=fp32,int8", "--infergate-json=out.json"], cwd=project,
                          capture_output=True, text=True, timeout=1200)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert " passed" in out and "failed" not in out and "golden samples: using the built-in 48-sample set" in out
    assert "infergate init-golden" in out
    assert "base model: prompts sent as plain text (the tokenizer has no chat template)" in out
    records = json.loads((project / "out.json").read_text())
    assert all(m["plain_text_prompts"] for m in records["models"].values())
    decided = {(r["kind"], r["precision"]) for r in records["records"] if r["status"] in ("pass", "fail")}
    assert {("perf", "fp32"), ("perf", "int8"), ("quality", "int8")} <= decided, records["records"]
    assert not (project / "golden").exists()  # nothing written unasked
