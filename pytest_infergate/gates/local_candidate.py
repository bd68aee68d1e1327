"""A local precision as the candidate of a golden gate (gates.golden.Candidate): its golden outputs generated once
per session in the fixed composition, compared with the reference precision, its accepted outputs' path and
provenance, and its batch invariance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_infergate.quality.golden_comparison import ScoreCache
from pytest_infergate.quality.golden_files import GoldenSample, outputs_path
from pytest_infergate.quality.metrics import QualityResult


@dataclass
class LocalCandidate:
    """A local precision: outputs generated once per session per sample set in the fixed composition
    (`generated` is the session's shared cache, so the reference's outputs are computed once for every precision
    compared with it)."""

    loaded: object
    device: str
    generated: dict
    max_model_len: int = 2048  # of the engine that generates golden outputs
    reference_scores: ScoreCache | None = None  # the session's: the reference's log-probabilities, scored once

    @property
    def precision(self) -> str:
        return self.loaded.record.requested_precision

    @property
    def backend(self):
        """The BackendChoice its golden outputs are generated on (the engine, or HF generate and why)."""
        from pytest_infergate.engine.backends import choice_for

        return choice_for(self.loaded)

    def outputs(self, samples: list[GoldenSample]) -> list:
        from pytest_infergate.quality.golden_generation import fixed_outputs

        return fixed_outputs(self.loaded, samples, self.generated, self.max_model_len)

    def compare(self, reference, samples, reference_outputs) -> QualityResult:
        from pytest_infergate.quality.golden_comparison import compare_precision

        return compare_precision(reference, self.loaded, samples, reference_outputs, self.outputs(samples),
                                 self.reference_scores)

    def accepted(self, golden_dir: Path, model_name: str) -> tuple[Path, dict]:
        record = self.loaded.record
        path = outputs_path(golden_dir, model_name, record.fingerprint, self.device, self.precision)
        return path, {"model": model_name, "fingerprint": record.fingerprint, "device": self.device,
                      "precision": self.precision, "versions": record.versions}

    def provenance(self, samples: list[GoldenSample]) -> dict:
        """What this precision's golden outputs depend on now: environment, method, sample-set compositions."""
        from pytest_infergate.quality.golden_generation import composition_id, fixed_runs, golden_method, sample_sets_of
        from pytest_infergate.quality.golden_machines import golden_environment

        runs = fixed_runs(self.loaded, samples, self.generated, self.max_model_len)
        compositions = {Path(source).name or "(in code)": composition_id(whole)
                        for source, whole in sample_sets_of(samples).items()}
        return {"environment": golden_environment(self.loaded, runs[0].threads if runs else None),
                "method": golden_method(self.backend.name), "compositions": compositions}

    def regression(self, samples, current, accepted):
        from pytest_infergate.quality.regression import compare_with_golden

        return compare_with_golden(self.loaded.tokenizer, samples, current, accepted, self.precision,
                                   self.loaded.model)

    def to_accept(self, samples, current):
        from pytest_infergate.quality.regression import outputs_to_accept

        return outputs_to_accept(samples, current, self.loaded.model)

    def batch_invariance(self, samples, max_new_tokens: int | None = None):
        from pytest_infergate.quality.golden_generation import check_variants, fixed_outputs

        fixed = fixed_outputs(self.loaded, samples, self.generated, self.max_model_len)
        return check_variants(self.loaded, samples, fixed, self.max_model_len, max_new_tokens=max_new_tokens)
