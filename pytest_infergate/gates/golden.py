"""GoldenGate, the object behind the `infergate_golden` fixture: a candidate (a local precision, or an endpoint)
against the reference precision under the quality policy, against its own accepted golden outputs, and against
itself in other batches. No pytest here: the test is reached through a TestContext."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Protocol

from pytest_infergate.context import TestContext
from pytest_infergate.errors import InfergateError
from pytest_infergate.quality.corpus_figures import CHUNK_TOKENS
from pytest_infergate.quality.golden_files import (
    BUILTIN_NOTICE,
    BUILTIN_SAMPLE_SET,
    GoldenError,
    GoldenOutputs,
    GoldenSample,
    find_sample_sets,
    holds_accepted_outputs,
    load_samples,
    read_outputs,
    update_outputs,
)
from pytest_infergate.quality.golden_files import (
    schema_note as golden_schema_note,
)
from pytest_infergate.quality.golden_machines import (
    SAME_MACHINE,
    accepted_for_another_model,
    path_to_update,
    recorded_elsewhere,
    select_accepted,
    with_figures,
)
from pytest_infergate.quality.metrics import QualityResult, describe_sample, worst_samples
from pytest_infergate.quality.policy import (
    ARGUMENT,
    RegressionPolicy,
    ResolvedPolicy,
    decide_batch_invariance,
    decide_quality,
    default_failure_advice,
    parse_policy,
    resolve_policy,
)
from pytest_infergate.quality.travel import SampleFigures, decide_against
from pytest_infergate.results.records import BatchInvarianceRecord, GoldenRecord, QualityRecord
from pytest_infergate.status import GOLDEN_CHECK, QUALITY_CHECK, Decision, Finding, Status


class Candidate(Protocol):
    """What the gate compares: a local precision or a server (gates.golden_candidates: LocalCandidate,
    EndpointCandidate). A candidate may also have `provenance(samples) -> dict` (header keys it records and checks:
    environment, method, compositions) and `batch_invariance(samples)`; a local precision has both."""

    precision: str

    def outputs(self, samples: list[GoldenSample]) -> list: ...  # greedy outputs, each with token_ids and text

    def compare(self, reference, samples: list[GoldenSample], reference_outputs: list) -> QualityResult: ...

    def accepted(self, golden_dir: Path, model_name: str) -> tuple[Path, dict]: ...  # file and its header

    def regression(self, samples, current: list, accepted: GoldenOutputs): ...  # -> GoldenRegression

    def to_accept(self, samples, current: list) -> list: ...  # -> [GoldenOutput]


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
        self.generated = generated  # the session's: local models' fixed-composition golden runs

    @property
    def precision(self) -> str:
        return self.candidate.precision

    def backend(self) -> tuple[str, str]:
        """(name, why) of what generated the candidate's outputs, for its records: a local precision's backend,
        or "endpoint" for a server."""
        choice = getattr(self.candidate, "backend", None)
        return (choice.name, choice.reason) if choice is not None else ("endpoint", "")

    def samples(self, limit: int | None = None, categories=None) -> list[GoldenSample]:
        try:
            sets = find_sample_sets(self.golden_dir, explicit=self.ctx.options.golden_dir is not None)
            samples = [s for path in sets for s in load_samples(path)]
        except GoldenError as exc:
            self.ctx.fail(str(exc))
        # told once to a project that has accepted nothing yet; one whose folder holds accepted outputs of the
        # built-in set has adopted it
        if sets == [BUILTIN_SAMPLE_SET] and not holds_accepted_outputs(self.golden_dir):
            self.ctx.say(Finding(GOLDEN_CHECK, "", BUILTIN_NOTICE.format(folder=self.golden_dir), status=Status.PASS))
        if categories:
            samples = [s for s in samples if s.category in set(categories)]
        return samples[:limit] if limit else samples

    def policy(self, policy: dict | None) -> ResolvedPolicy:
        """`policy` if given, else the marker `infergate_quality` over the ini lines, each key with its source."""
        if policy is not None:
            return ResolvedPolicy.given(parse_policy(policy, ARGUMENT))
        resolved = resolve_policy(self.ctx.scopes.lines("infergate_quality_policy"),
                                  self.ctx.marker_kwargs("infergate_quality"), self.precision, self.ctx.test_id)
        self.ctx.scopes.note("infergate_quality_policy", list(resolved.scopes))
        return resolved

    def check(self, limit: int | None = None, categories=None, policy: dict | None = None) -> QualityResult:
        """Candidate vs the reference precision on the golden samples under the policy (see `policy`; where it sets
        no threshold of this check, the default of the precision's class), each threshold decided on its
        aggregate's 95% interval. Returns the QualityResult."""
        samples = self.samples(limit, categories)
        result = self._comparison(samples)
        resolved = self.policy(policy).for_reference(self.precision)
        decided_by = resolved.decided_by()
        decision = decide_quality(result, resolved)
        for note in decision.notes:  # a point decided without an interval, a category below the floors the mean
            self.ctx.say(Finding(QUALITY_CHECK, self.ctx.test_id,  # passed: a note beside the gate
                                 f"{result.precision} vs {result.reference_precision}: {note}", status=Status.PASS))
        result = replace(result, notes=[*result.notes, *decision.notes])  # the session's cached comparison stays as is
        self.ctx.record(QualityRecord(self.ctx.test_id, decision.status, result, resolved.rules, decision.problems,
                                      *self.backend(), undecided=decision.undecided, decided_by=decided_by))
        if decision.problems:
            worst = "\n".join("  " + describe_sample(s) for s in worst_samples(result.samples))
            advice = default_failure_advice(result.precision, decided_by)
            self.ctx.fail(f"quality of {result.precision} vs {result.reference} breaks the policy "
                          f"({decided_by}):\n  " + "\n  ".join(decision.problems) + (f"\n{advice}" if advice else "")
                          + f"\nworst samples:\n{worst}")
        return result

    def _comparison(self, samples: list[GoldenSample]) -> QualityResult:
        """The candidate against the reference precision on `samples`: once per precision and sample set a
        session (check() and the other-machine decision of check_regression() share it)."""
        from pytest_infergate.quality.golden_generation import fixed_outputs

        key = (self.precision, tuple(s.id for s in samples))
        if key not in self.comparisons:
            reference = self._reference()
            try:
                reference_outputs = fixed_outputs(reference, samples, self.generated, self.ctx.options.golden_max_len)
                self.comparisons[key] = self.candidate.compare(reference, samples, reference_outputs)
            except InfergateError as exc:  # e.g. an endpoint that did not answer every sample
                self.ctx.fail(str(exc))
        return self.comparisons[key]

    def _no_figures(self) -> str:
        """Why this candidate has no figures against a reference precision ("" where it has): the reference itself,
        or an endpoint (its accepted outputs are per server, not per machine)."""
        if not hasattr(self.candidate, "provenance"):
            return "a served model's accepted outputs record no figures: its tokens decide"
        if self._reference().record.requested_precision == self.precision:
            return f"{self.precision} is the reference precision: its tokens decide"
        return ""

    def _figures(self, samples: list[GoldenSample]) -> tuple[str, dict[str, SampleFigures]]:
        """(reference precision, sample id -> this run's figures against it): the comparison check() makes."""
        return (self._reference().record.requested_precision,
                {sample.id: SampleFigures.of(sample) for sample in self._comparison(samples).samples})

    def _by_quality(self, samples, default_path: Path, environment, accepted: GoldenOutputs, path: Path,
                    regression) -> tuple[Decision | None, str, str]:
        """(the quality decision (quality.travel), the file whose figures it used, why there is none). The figures
        of `accepted` when it records them; on another machine else those of the file beside it that does (what
        travels is the same on every machine). On this machine a file without figures keeps the token rule."""
        if why := self._no_figures():
            return None, "", why
        source, recorded = path, accepted
        if not accepted.header.get("figures_against"):
            found = with_figures(default_path, environment) if regression.other_machine else None
            if found is None:
                return None, "", (f"{path.name} was accepted before quality figures were stored: its tokens decide "
                                  "until its outputs are accepted again with --infergate-update-golden")
            source, recorded = found, self._read_or_fail(found)
        decision, why = decide_against(recorded, source.name, *self._figures(samples),
                                       {s.id: s.category for s in samples}, regression.policy.travel,
                                       bool(regression.other_machine))
        return decision, source.name, why

    def check_regression(self, limit: int | None = None, categories=None, policy: dict | None = None):
        """This precision's current outputs vs its own accepted golden outputs. Each changed sample is a near-tie
        (numerics at a tie) or drift. For int8 and nf4 (`gate_tokens=0`) quality against the reference precision,
        compared with the figures recorded when the outputs were accepted, decides and the changes are listed; for
        the reference precision (and `gate_tokens=1`, or an accepted file without figures) drift fails beyond
        `max_drift_share`; `exact=1` fails on any change. With --infergate-update-golden the accepted outputs are
        rewritten instead (and the changes printed). Returns the GoldenRegression (None after an update)."""
        from pytest_infergate.quality.regression import regression_failure

        samples = self.samples(limit, categories)
        try:
            current = self.candidate.outputs(samples)
            provenance = self.candidate.provenance(samples) if hasattr(self.candidate, "provenance") else {}
        except InfergateError as exc:
            self.ctx.fail(str(exc))
        default_path, header = self.candidate.accepted(self.golden_dir, self._model_name())
        header = {**header, **provenance}
        update = self.ctx.options.update_golden
        environment = provenance.get("environment")  # the accepted file of this machine (golden_machines)
        path, match = ((path_to_update(default_path, environment), SAME_MACHINE) if update
                       else select_accepted(default_path, environment))
        if update:
            return self._update(path, default_path, header, samples, current)
        backend, why = self.backend()
        old = self._read_or_fail(path) if path.exists() else None
        model_change = ""
        if old is None and (previous := accepted_for_another_model(default_path)) is not None:
            path, match = select_accepted(previous, environment)  # the accepted release, before the new weights
            old = self._read_or_fail(path)
            model_change = (f"model fingerprint {previous.parent.name} → {default_path.parent.name}: compared with "
                            "the accepted outputs of the weights before these")
        if old is None:
            missing = Finding(GOLDEN_CHECK, self.ctx.test_id, f"golden regression check not run: no accepted golden "
                              f"outputs at {path}", "review a run with --infergate-update-golden and commit the file")
            self.ctx.say(missing)  # under --infergate-strict the session fails the test on it
            self.ctx.skip(missing)
        environment_moved = self._environment_mismatch(old.header, provenance)
        mismatch = ([model_change] if model_change else []) + environment_moved
        rules = RegressionPolicy.of(self.policy(policy).rules, self.precision)
        other = recorded_elsewhere(old.header, match) if provenance else ""
        regression = self.candidate.regression(samples, current, old).classify(rules, mismatch, other)
        if environment_moved:
            self._say_environment_moved(environment_moved, path, len(regression.changed), regression.compared)
        if regression.by_quality:  # where quality cannot decide, the verdict's decided_by says why the tokens do
            regression.travel, regression.travel_source, regression.token_rule_why = self._by_quality(
                samples, default_path, environment, old, path, regression)
        decision = Decision(regression.problems(), regression.undecided())
        problems, undecided = decision.problems, decision.undecided
        self.ctx.record(GoldenRecord(self.ctx.test_id, decision.status, regression.precision,
                                     str(path), compared=regression.compared, missing=regression.missing,
                                     mean_topk_kl=regression.mean_topk_kl, changed=regression.changed,
                                     policy=rules.to_dict(), problems=problems, environment_mismatch=mismatch,
                                     backend=backend, backend_reason=why, undecided=undecided,
                                     decided_by=regression.decided_by(),
                                     travel=regression.travel.notes[0] if regression.travel else "",
                                     model_change=model_change))
        if problems:
            self.ctx.fail((f"{model_change}\n" if model_change else "")
                          + regression_failure(regression, problems, path, old.header))
        return regression

    def _update(self, path: Path, default_path: Path, header: dict, samples: list[GoldenSample], current: list) -> None:
        """--infergate-update-golden: `path` rewritten with `current`, each output with this run's figures against the
        reference precision (what the quality decision compares with later), and what changed recorded."""
        outputs = self.candidate.to_accept(samples, current)
        if not self._no_figures():
            header["figures_against"], figures = self._figures(samples)
            for output in outputs:
                if output.id in figures:
                    output.figures = figures[output.id].to_dict()
        created = not path.exists()
        try:
            changes = update_outputs(path, header, outputs, [sample.id for sample in self.samples()])
        except (OSError, InfergateError) as exc:
            self.ctx.fail(f"--infergate-update-golden could not write {path}: {exc}; the accepted file is left as it "
                          "was")
        if path != default_path and created:
            changes.insert(0, f"a file for this machine, beside {default_path.name} (accepted on another machine, "
                              "kept)")
        backend, why = self.backend()
        self.ctx.record(GoldenRecord(self.ctx.test_id, Status.PASS, self.precision, str(path), updated=True,
                                     changes=changes, backend=backend, backend_reason=why))

    def _read_or_fail(self, path: Path):
        try:
            accepted = read_outputs(path)
        except GoldenError as exc:
            self.ctx.fail(str(exc))
        note = golden_schema_note(path, accepted.header.get("schema_version"))
        if note:
            self.ctx.say(Finding(GOLDEN_CHECK, "", note, status=Status.PASS))
        return accepted

    @staticmethod
    def _environment_mismatch(accepted: dict, provenance: dict) -> list[str]:
        if not provenance:  # the candidate records no environment (an endpoint)
            return []
        from pytest_infergate.quality.golden_machines import environment_mismatch

        return environment_mismatch(accepted, provenance)

    def _say_environment_moved(self, mismatch: list[str], path: Path, changed: int, compared: int) -> None:
        """Said, not counted: the gate still decides (by machine where it must: golden_machines). Accepting this
        machine's outputs is advised only where some changed: with none changed the other environment made no
        difference here."""
        moved = f"the accepted golden outputs {path} were recorded in another environment ({'; '.join(mismatch)})"
        if changed:
            self.ctx.say(Finding(GOLDEN_CHECK, self.ctx.test_id, f"{moved}; {changed} of {compared} changed outputs "
                                 "may come from it", "if the machine differs, accept this machine's outputs beside "
                                 "them with --infergate-update-golden (the check then picks the file by machine)",
                                 status=Status.PASS))
        else:
            self.ctx.say(Finding(GOLDEN_CHECK, self.ctx.test_id, f"{moved}; all {compared} outputs match it here",
                                 status=Status.PASS))

    def check_corpus(self, policy: dict | None = None, corpus=None, chunk_tokens: int = CHUNK_TOKENS):
        """Candidate vs the reference precision teacher-forced over a text corpus, prefill only (the built-in one,
        about 10,100 tokens of public-domain text, or `corpus=` a .txt file or a folder of them), in chunks of
        `chunk_tokens`: mean KL, top-1 agreement and Δ perplexity, each with a 95% interval over the chunks, and KL
        p99 / p99.9, under the policy's corpus keys (where none is set, the default of the precision's class).
        With --infergate-update-golden this run's figures are accepted beside the golden outputs; later runs gate
        their mean KL's rise over them with `max_corpus_kl_rise`. Returns the CorpusResult."""
        from pytest_infergate.gates.corpus import check_corpus

        return check_corpus(self, policy, corpus, chunk_tokens)

    def check_batch_invariance(self, limit: int | None = None, categories=None, policy: dict | None = None,
                               max_new_tokens: int | None = None):
        """Does this precision's greedy answer to a sample change with the batch it runs in? Each sample runs
        alone, inside the fixed-composition batch (the whole sample file), and rotated in half-size batches;
        records the share of samples whose tokens change and the KL between the variants, and fails above the
        policy's `max_batch_variant_share` (no gate unless set). `max_new_tokens`: compare each sample's first
        that many tokens only (the alone runs, one sample at a time, cost the most). Returns the BatchInvariance."""
        from pytest_infergate.quality.regression import batch_invariance_failure

        if not hasattr(self.candidate, "batch_invariance"):
            self.ctx.skip(f"batch invariance needs a local model; the {self.precision} candidate batches requests "
                          "its own way (a server's scheduler is not ours to vary)")
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                           or max_new_tokens < 1):
            self.ctx.fail(f"check_batch_invariance(max_new_tokens={max_new_tokens!r}): give a whole number of tokens "
                          ">= 1, or None to compare every token")
        samples = self.samples(limit, categories)
        try:
            result = self.candidate.batch_invariance(samples, max_new_tokens)
        except InfergateError as exc:
            self.ctx.fail(str(exc))
        rules = self.policy(policy).rules
        decision = decide_batch_invariance(result, rules)
        gate = {k: v for k, v in rules.items() if k == "max_batch_variant_share"}
        self.ctx.record(BatchInvarianceRecord(self.ctx.test_id, decision.status, result, gate, decision.problems,
                                              *self.backend()))
        if decision.problems:
            self.ctx.fail(batch_invariance_failure(result, decision.problems))
        return result
