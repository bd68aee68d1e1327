"""An output either completes or the previous one is untouched (issue #32, interrupts at every output write): a
Ctrl-C while the new file's bytes are written, or just before it takes the old one's place, leaves the accepted
file as it was and no stray temporary file beside it."""

import json
import os

import pytest

from pytest_infergate import atomic
from pytest_infergate.history.page import write_history
from pytest_infergate.history.series import build_history
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.baseline import BaselineEntry, save_baseline
from pytest_infergate.quality.golden_files import write_outputs
from pytest_infergate.report import write_report
from pytest_infergate.results.run import RunResults


def _measurement():
    m = Measurement(samples={"ttft_ms": [1.0, 2.0]})
    m.end_repetition()
    return m


WRITERS = {
    "report": lambda path: write_report(RunResults(), path),
    "json results": lambda path: atomic.write_json_atomic(path, RunResults().to_dict()),
    "baseline": lambda path: save_baseline(path, {"t::x": BaselineEntry({"cpu": "x"}, _measurement())}),
    "golden outputs": lambda path: write_outputs(path, {"precision": "fp32"}, []),
    "history page": lambda path: write_history(build_history([]), path),
}


@pytest.mark.parametrize("when", ["while writing", "before the rename"])
@pytest.mark.parametrize("output", list(WRITERS))
def test_an_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch, output, when):
    target = tmp_path / "out" / "file"
    target.parent.mkdir()
    target.write_text("the accepted file\n")
    if when == "while writing":
        real_fdopen = os.fdopen

        def half_then_ctrl_c(fd, *args, **kwargs):
            handle = real_fdopen(fd, *args, **kwargs)
            real_write = handle.write

            def write(text):
                real_write(text[: len(text) // 2])
                raise KeyboardInterrupt

            handle.write = write
            return handle

        monkeypatch.setattr(atomic.os, "fdopen", half_then_ctrl_c)
    else:
        def ctrl_c(src, dst):
            raise KeyboardInterrupt

        monkeypatch.setattr(atomic.os, "replace", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        WRITERS[output](target)
    assert target.read_text() == "the accepted file\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file"]  # no temporary file left behind


def test_a_completed_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    atomic.write_json_atomic(target, {"kind": "results", "n": 1})
    assert json.loads(target.read_text()) == {"kind": "results", "n": 1}
