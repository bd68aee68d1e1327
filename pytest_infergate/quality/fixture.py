"""GoldenGate, the object behind the `infergate_golden` fixture: a candidate (a local precision, or an endpoint)
against the reference precision under the quality policy, and against its own accepted golden outputs.
No pytest here: the test is reached through a TestContext."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pytest_infergate.context import TestContext
from pytest_infergate.errors import InfergateError
from pytest_infergate.quality.golden_files import (
    GoldenError,
    GoldenOutputs,
    GoldenSample,
    diff_outputs,
    find_sample_sets,
    load_samples,
    outputs_path,
    read_outputs,
    write_outputs,
)
from pytest_infergate.quality.metrics import QualityResult, describe_sample, worst_samples
from pytest_infergate.quality.policy import policy_violations, resolve_policy
from pytest_infergate.results.records import GoldenRecord, QualityRecord
from pytest_infergate.status import Status

QUALITY_PROPERTIES = ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio")


class Candidate(Protocol):
    """What the gate compares: a local precision (LocalCandidate) or a server (endpoint.golden.EndpointCandidate)."""

    precision: str

    def outputs(self, samples: list[GoldenSample]) -> list: ...  # greedy outputs, each with token_ids and text

    def compare(self, reference, samples: list[GoldenSample], reference_outputs: list) -> QualityResult: ...

    def accepted(self, golden_dir: Path, model_name: str) -> tuple[Path, dict]: ...  # file and its header

    def regression(self, samples, current: list, accepted: GoldenOutputs): ...  # -> GoldenRegression

    def to_accept(self, samples, current: list) -> list: ...  # -> [GoldenOutput]


@dataclass
class LocalCandidate:
    """A local precision: outputs generated once per session on the reference engine (`generated` is the
    session's shared cache, so the reference's outputs are computed once for every precision compared with it)."""

    loaded: object
    device: str
    generated: dict
    max_model_len: int = 2048  # of the engine that generates golden outputs

    @property
    def precision(self) -> str:
        return self.loaded.record.requested_precision

    def outputs(self, samples: list[GoldenSample]) -> list:
        return generated_outputs(self.loaded, samples, self.generated, self.max_model_len)

    def compare(self, reference, samples, reference_outputs) -> QualityResult:
        from pytest_infergate.quality.compare import compare_precision

        return compare_precision(reference, self.loaded, samples, reference_outputs, self.outputs(samples))

    def accepted(self, golden_dir: Path, model_name: str) -> tuple[Path, dict]:
        record = self.loaded.record
        path = outputs_path(golden_dir, model_name, record.fingerprint, self.device, self.precision)
        return path, {"model": model_name, "fingerprint": record.fingerprint, "device": self.device,
                      "precision": self.precision, "versions": record.versions}

    def regression(self, samples, current, accepted):
        from pytest_infergate.quality.regression import compare_with_golden

        return compare_with_golden(self.loaded.tokenizer, samples, current, accepted, self.precision,
                                   self.loaded.model)

    def to_accept(self, samples, current):
        from pytest_infergate.quality.regression import outputs_to_accept

        return outputs_to_accept(samples, current, self.loaded.model)


def generated_outputs(loaded, samples: list[GoldenSample], cache: dict, max_model_len: int) -> list:
    """The greedy outputs of a local model on `samples`, generated once per session."""
    from pytest_infergate.quality.generation import generate_golden_outputs

    key = (loaded.record.requested_precision, tuple(s.id for s in samples))
    if key not in cache:
        cache[key] = generate_golden_outputs(loaded, samples, max_model_len)
    return cache[key]


class GoldenGate:
    """Returned by the `infergate_golden` fixture; see its docstring in the plugin's fixtures."""

    def __init__(self, ctx: TestContext, candidate: Candidate, reference, golden_dir: Path, model_name,
                 comparisons: dict, generated: dict):
        self.ctx = ctx
        self.candidate = candidate
        self._reference = reference  # callable: the reference precision's LoadedModel, loaded on first use
        self.golden_dir = Path(golden_dir)
        self._model_name = model_name  # callable: the local model's name (golden files are kept under it)
        self.comparisons = comparisons  # the session's: one comparison per precision and sample set
        self.generated = generated  # the session's: local models' golden outputs

    @property
    def precision(self) -> str:
        return self.candidate.precision

    def samples(self, limit: int | None = None, categories=None) -> list[GoldenSample]:
        try:
            samples = [s for path in find_sample_sets(self.golden_dir) for s in load_samples(path)]
        except GoldenError as exc:
            self.ctx.fail(str(exc))
        if categories:
            samples = [s for s in samples if s.category in set(categories)]
        return samples[:limit] if limit else samples

    def check(self, limit: int | None = None, categories=None, policy: dict | None = None) -> QualityResult:
        """Candidate vs the reference precision on the golden samples, decided by the policy (marker
        `infergate_quality`, ini `infergate_quality_policy`, or `policy`). Returns the QualityResult."""
        from pytest_infergate.quality.policy import parse_policy

        samples = self.samples(limit, categories)
        key = (self.precision, tuple(s.id for s in samples))
        if key not in self.comparisons:  # one comparison per precision and sample set per session
            reference = self._reference()
            try:
                reference_outputs = generated_outputs(reference, samples, self.generated,
                                                      self.ctx.options.golden_max_len)
                self.comparisons[key] = self.candidate.compare(reference, samples, reference_outputs)
            except InfergateError as exc:  # e.g. an endpoint that did not answer every sample
                self.ctx.fail(str(exc))
        result = self.comparisons[key]
        if policy is None:
            rules, scopes = resolve_policy(self.ctx.scoped_lines("infergate_quality_policy"),
                                           self.ctx.markers("infergate_quality"), self.precision, self.ctx.test_id)
            self.ctx.note_scopes("infergate_quality_policy", scopes)
        else:
            rules = parse_policy(policy)
        problems = policy_violations(result.summary, rules) + result.flags
        status = Status.FAIL if problems else Status.PASS
        self.ctx.record(QualityRecord(self.ctx.test_id, status, result, rules, problems))
        for name in QUALITY_PROPERTIES:
            if name in result.summary:
                self.ctx.add_property(f"infergate.quality.{name}", round(result.summary[name], 4))
        if problems:
            worst = "\n".join("  " + describe_sample(s) for s in worst_samples(result.samples))
            self.ctx.fail(f"quality of {result.precision} vs {result.reference_precision} breaks the policy:\n  "
                          + "\n  ".join(problems) + f"\nworst samples:\n{worst}")
        return result

    def check_regression(self, limit: int | None = None, categories=None):
        """This precision's current outputs vs its own accepted golden outputs, token for token. With
        --infergate-update-golden the accepted outputs are rewritten instead (and the changes printed)."""
        samples = self.samples(limit, categories)
        try:
            current = self.candidate.outputs(samples)
        except InfergateError as exc:
            self.ctx.fail(str(exc))
        path, header = self.candidate.accepted(self.golden_dir, self._model_name())
        update = self.ctx.options.update_golden
        old = None
        if path.exists():
            try:
                old = read_outputs(path)
            except GoldenError as exc:
                if not update:
                    self.ctx.fail(str(exc))
        if update:
            outputs = self.candidate.to_accept(samples, current)
            changes = diff_outputs(old, outputs)
            write_outputs(path, header, outputs)
            self.ctx.record(GoldenRecord(self.ctx.test_id, Status.PASS, self.precision, str(path), updated=True,
                                         changes=changes))
            return None
        if old is None:
            message = (f"no accepted golden outputs at {path}: review a run with --infergate-update-golden and "
                       "commit the file")
            if self.ctx.options.strict:  # under strict a check that cannot run fails
                self.ctx.fail(message)
            self.ctx.skip(message)
        regression = self.candidate.regression(samples, current, old)
        status = Status.PASS if regression.ok else Status.FAIL
        self.ctx.record(GoldenRecord(self.ctx.test_id, status, regression.precision, str(path),
                                     compared=regression.compared, missing=regression.missing,
                                     mean_topk_kl=regression.mean_topk_kl, changed=regression.changed))
        if not regression.ok:
            lines = [describe_sample(s) for s in regression.changed[:5]]
            if regression.missing:
                lines.append(f"samples without accepted output: {', '.join(regression.missing)}")
            self.ctx.fail(f"{len(regression.changed)} of {regression.compared} golden outputs of "
                          f"{regression.precision} changed (accepted: {path}; library versions then: "
                          f"{old.header.get('versions')}):\n  " + "\n  ".join(lines))
        return regression
