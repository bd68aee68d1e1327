"""Quality gates on golden samples. Light to import (no torch): sample and output files, metrics, policy.

Modules that run models import torch when used: `golden_generation` (golden samples through a local model, greedy,
always the whole sample file in one run, a subset selected from it; and batch invariance), `scoring` (teacher-forced
log-probabilities of a fixed continuation, one row per forward; KL / top-1 / NLL; and THE comparison of a
candidate's outputs with the reference's), `regression` (against a precision's own accepted
outputs: near-tie or drift; and the gates' failure messages), `golden_machines` (what golden outputs depend on, and
which accepted file is this machine's). The object behind the `infergate_golden` fixture is `gates.golden.GoldenGate`.
"""

from pytest_infergate.quality.golden_files import GoldenError, GoldenOutput, GoldenOutputs, GoldenSample
from pytest_infergate.quality.metrics import SampleQuality, TokenStats
from pytest_infergate.quality.policy import POLICY_KEYS, QualityPolicyError, parse_policy, resolve_policy

__all__ = ["POLICY_KEYS", "GoldenError", "GoldenOutput", "GoldenOutputs", "GoldenSample", "QualityPolicyError",
           "SampleQuality", "TokenStats", "parse_policy", "resolve_policy"]
