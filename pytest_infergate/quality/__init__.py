"""Quality gates on golden samples. Light to import (no torch): sample and output files, metrics, policy.

Modules that run models import torch when used:
- `generation`: golden samples through a local model on the engine (greedy);
- `scoring`: teacher-forced log-probabilities of a fixed continuation (`continuation_logprobs`), KL / top-1 / NLL;
- `compare`: THE comparison of a candidate's outputs with the reference's (local precisions and endpoints);
- `regression`: current outputs against a precision's own accepted outputs;
- `fixture`: `GoldenGate`, the object behind the `infergate_golden` fixture.
"""

from pytest_infergate.quality.golden_files import GoldenError, GoldenOutput, GoldenOutputs, GoldenSample
from pytest_infergate.quality.metrics import SampleQuality, TokenStats
from pytest_infergate.quality.policy import POLICY_KEYS, QualityPolicyError, parse_policy, resolve_policy

__all__ = ["POLICY_KEYS", "GoldenError", "GoldenOutput", "GoldenOutputs", "GoldenSample", "QualityPolicyError",
           "SampleQuality", "TokenStats", "parse_policy", "resolve_policy"]
