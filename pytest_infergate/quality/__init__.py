"""Quality gates on golden samples. Light to import (no torch): sample and output files, metrics, policy.

Modules that run models import torch when used:
- `generation`: golden samples through a local model on the engine (greedy), always in the fixed composition:
  the whole sample file in one run, a subset selected from it;
- `scoring`: teacher-forced log-probabilities of a fixed continuation, one row per forward; KL / top-1 / NLL;
- `compare`: THE comparison of a candidate's outputs with the reference's (local precisions and endpoints);
- `regression`: current outputs against a precision's own accepted outputs, changes classified near-tie or drift;
- `provenance`: what golden outputs depend on (CPU flags, GPU, libraries, kernels, method), for headers;
- `batch_invariance`: a precision's outputs alone, in the fixed batch and in another composition;
- `golden_report`: the failure messages of the regression and batch-invariance gates;
- the object behind the `infergate_golden` fixture is `gates.golden.GoldenGate`.
"""

from pytest_infergate.quality.golden_files import GoldenError, GoldenOutput, GoldenOutputs, GoldenSample
from pytest_infergate.quality.metrics import SampleQuality, TokenStats
from pytest_infergate.quality.policy import POLICY_KEYS, QualityPolicyError, parse_policy, resolve_policy

__all__ = ["POLICY_KEYS", "GoldenError", "GoldenOutput", "GoldenOutputs", "GoldenSample", "QualityPolicyError",
           "SampleQuality", "TokenStats", "parse_policy", "resolve_policy"]
