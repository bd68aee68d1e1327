"""benchmarks/stored_replay.py: every unchanged trial of a gate_power --json file stands in as the baseline, and the
other trials are decided against it by the gate's own decision."""

import json
import subprocess
import sys
from pathlib import Path

from pytest_infergate.measurement import Measurement

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stored_replay.py"


def trial(itl_ms: float, reps: int, probe_ms: float) -> dict:
    m = Measurement(probe="p")
    for i in range(reps):
        m.samples.setdefault("itl_ms", []).extend(itl_ms * (1 + 0.01 * ((i + j) % 3)) for j in range(10))
        m.samples.setdefault("tokens_per_s", []).append(1000.0 / itl_ms)
        m.probe_s.append(probe_ms / 1000)
        m.probe_quiet_s.append(probe_ms / 1000 * (1 + 0.01 * (i % 2)))
        m.others_share.append(0.01)
        m.end_repetition()
    return {"measurement": m.to_dict(), "fingerprint": {"cpu": "X"}}


def test_unchanged_trials_stand_in_as_baselines(tmp_path):
    trials = [{"slowdown": 0.0, "trial": t, "record": trial(100.0 + t, 10, 30.0 + t)} for t in range(3)]
    trials += [{"slowdown": 0.5, "trial": t, "record": trial(150.0, 8, 30.0)} for t in range(3)]
    path = tmp_path / "trials.json"
    path.write_text(json.dumps({"trials": trials}))
    out = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, check=True).stdout
    assert "slowdown   0%: pass 100%, inconclusive   0%, fail   0% (6 pairs)" in out, out
    assert "slowdown  50%: pass   0%, inconclusive   0%, fail 100% (9 pairs)" in out, out
    assert "101 ms / 30 ms, 102 ms / 31 ms, 103 ms / 32 ms" in out and "r = 1.00" in out, out
