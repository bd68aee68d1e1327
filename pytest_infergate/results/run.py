"""A run's results (its environment, models and records) as one versioned JSON file, which is also the baseline a
later run compares with (saved and read back by the store of runs, history.store); and the run's one
verdict — can this ship? — computed once from every gate and every pytest outcome, shown first by the terminal, the
HTML report and the JSON. FAIL when a test failed or errored or a gate failed; else INCONCLUSIVE when a gate could
not decide or a check did not run as asked; else PASS (--infergate-strict: inconclusive fails). The schema
versions: docs/reference/outputs.md. And the checks that did not run as asked, as one table a reviewer reads
(`not_run`: check, test, why, and how to make it run)."""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_infergate.environment import run_fingerprint
from pytest_infergate.errors import InfergateError
from pytest_infergate.results.reasons import (
    BASELINE_SAVED,
    EVIDENCE,
    NOTHING_COMPARED,
    REFERENCE_ITSELF,
    ChangeFailure,
    change_failure,
    no_baseline_message,
    record_message,
    reference_itself_message,
)
from pytest_infergate.results.records import (
    BatchInvarianceRecord,
    CorpusRecord,
    GoldenRecord,
    PerfRecord,
    QualityRecord,
    Record,
    record_from_dict,
)
from pytest_infergate.status import Finding, Status, under_strict

KIND = "results"
SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (strict JSON has no Infinity or NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def new_run_id(started: float) -> str:
    """Sortable by time (UTC), unique across machines: `20250101T120000Z-1a2b3c`."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started)) + "-" + secrets.token_hex(3)


@dataclass
class RunResults:
    started: float = field(default_factory=time.time)
    finished: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict] = field(default_factory=dict)  # precision -> load record
    records: list[Record] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed / failed / skipped / error
    failures: dict[str, str] = field(default_factory=dict)  # nodeid -> short message and location of a failure
    skips: dict[str, str] = field(default_factory=dict)  # nodeid -> why it was skipped
    strict: bool = False  # --infergate-strict: an inconclusive check fails the run
    # checks that did not run or decide as asked (a warning each: the summary, the verdict's reasons, strict)
    findings: list[Finding] = field(default_factory=list)
    # tests skipped with what would make them run (not warnings: a skip is the test's own outcome), by test id
    skipped_findings: dict[str, Finding] = field(default_factory=dict)
    run_id: str = ""  # new_run_id(started) when written; "" in files before version 3
    commit: str | None = None  # git commit of the rootdir, when it is a git checkout
    # where this run saved itself as the baseline (--infergate-save-baseline, once written): its relative checks had
    # nothing to compare with, and its verdict says so with the path rather than advising a save it has just made
    saved_baseline: str | None = None
    # not in the file: this run's report kept beside its results file in a history folder, when read from one
    report_copy: str | None = field(default=None, compare=False, repr=False)

    @property
    def warnings(self) -> list[str]:
        """The findings as the lines every output prints."""
        return [finding.text() for finding in self.findings]

    @property
    def fingerprint(self) -> str:
        return run_fingerprint(self.environment)

    def of_type(self, record_type: type) -> list:
        return [r for r in self.records if isinstance(r, record_type)]

    @property
    def perf(self) -> list[PerfRecord]:
        return self.of_type(PerfRecord)

    @property
    def quality(self) -> list[QualityRecord]:
        return self.of_type(QualityRecord)

    @property
    def golden(self) -> list[GoldenRecord]:
        return self.of_type(GoldenRecord)

    @property
    def batch_invariance(self) -> list[BatchInvarianceRecord]:
        return self.of_type(BatchInvarianceRecord)

    @property
    def corpus(self) -> list[CorpusRecord]:
        return self.of_type(CorpusRecord)

    def verdict(self) -> RunVerdict:
        """The run's one verdict from every gate and every pytest outcome (run_verdict)."""
        return run_verdict(self)

    def gate_counts(self) -> dict[str, dict[str, int]]:
        """Per gate kind, its records by the status the verdict counts them with (RunVerdict.counts)."""
        return {kind: c for kind, c in self.verdict().counts.items() if kind not in (FAILED_TESTS, NOT_RUN_AS_ASKED)}

    def to_dict(self) -> dict:
        if not self.run_id:
            self.run_id = new_run_id(self.started)
        return finite_json({
            "kind": KIND, "schema_version": SCHEMA_VERSION, **self.verdict().to_dict(), "strict": self.strict,
            "run_id": self.run_id, "commit": self.commit, "saved_baseline": self.saved_baseline,
            "fingerprint": self.fingerprint, "started": self.started,
            "finished": self.finished if self.finished is not None else time.time(),
            "environment": self.environment, "models": self.models, "records": [r.to_dict() for r in self.records],
            "outcomes": self.outcomes, "failures": self.failures, "skips": self.skips, "warnings": self.warnings,
            "findings": [f.to_dict() for f in self.findings],
            "skipped_findings": {test: f.to_dict() for test, f in self.skipped_findings.items()},
            "gate_counts": self.gate_counts()})

    @classmethod
    def from_dict(cls, data: dict, source: str = "results file") -> RunResults:
        from pytest_infergate.perf.baseline import a_kind, file_kind

        kind = file_kind(data)
        if kind != KIND:
            hint = (" (the format --infergate-save-baseline wrote before a baseline was a saved run); `infergate "
                    "migrate FILE` rewrites it as a results file" if kind == "baseline"
                    else "; write one with pytest --infergate-json PATH")
            raise InfergateError(f"{source} is {a_kind(kind)} file, not a results file{hint}")
        if data.get("schema_version") not in READABLE_VERSIONS:
            raise InfergateError(f"{source} has schema version {data.get('schema_version')!r}; this "
                                 f"pytest-infergate reads {', '.join(map(str, READABLE_VERSIONS))}")
        try:
            records = [record_from_dict(r) for r in data.get("records", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise InfergateError(f"{source}: a record is incomplete ({type(exc).__name__}: {exc}); was the file "
                                 "edited by hand or cut short? Re-run pytest with --infergate-json") from None
        return cls(started=data.get("started", 0.0), finished=data.get("finished"),
                   environment=dict(data.get("environment", {})), models=dict(data.get("models", {})),
                   records=records, outcomes=dict(data.get("outcomes", {})),
                   # an older file has only the warnings' lines: each read whole, never parsed back
                   findings=[Finding.from_dict(f) for f in data.get("findings", data.get("warnings", []))],
                   skipped_findings={test: Finding.from_dict(f)
                                     for test, f in (data.get("skipped_findings") or {}).items()},
                   failures=dict(data.get("failures", {})), skips=dict(data.get("skips", {})),
                   strict=bool(data.get("strict", False)),
                   run_id=str(data.get("run_id") or ""), commit=data.get("commit"),
                   saved_baseline=data.get("saved_baseline"))


@dataclass(frozen=True)
class Reason:
    """One thing that made the verdict what it is."""

    status: Status
    what: str  # "test", "perf gate", "golden gate", "quality gate", "batch invariance", "not run as asked" (a warning)
    name: str  # the test id ("" for a check not run: its message names it)
    message: str

    def text(self, lead_only: bool = False) -> str:
        said = self.lead if lead_only else self.message
        return f"{self.status.upper()} {self.what}{' ' + self.name if self.name else ''}: {said}"

    @property
    def lead(self) -> str:
        """What a reviewer acts on: the message up to its evidence (results.reasons.EVIDENCE)."""
        return self.message.partition(EVIDENCE)[0]

    @property
    def evidence(self) -> str:
        """How it was decided (load correction, probe, repetitions): one click away in the report."""
        return self.message.partition(EVIDENCE)[2]

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status.value, "lead": self.lead}


# what the verdict counts besides each gate kind's records (RunVerdict.counts), as the summaries name them
FAILED_TESTS, NOT_RUN_AS_ASKED = "test", "not run as asked"


@dataclass(frozen=True)
class RunVerdict:
    status: Status
    reasons: list[Reason]
    saved_baseline: str | None = None  # RunResults.saved_baseline
    # what the verdict was made of, by group (a gate kind's records; FAILED_TESTS: tests that failed outside a gate;
    # NOT_RUN_AS_ASKED: checks that did not run as asked), status -> how many: the one source of every count shown
    # beside the verdict, so that the headline's "3 inconclusive" is found in the lines below it
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    # the perf gates that failed a comparison with a baseline naming what changed since it (reasons.change_failure)
    change: ChangeFailure | None = None
    # quality comparisons of the reference precision with itself: passes that gated nothing, counted apart
    reference_itself: int = 0

    def headline(self) -> str:
        """'infergate verdict: FAIL: tokens/s 65.9% lower (time per token ×2.93 [2.9–3.01], limit ×1.1) since
        engine_config.max_batch_size 8 → 1 (2 perf gates)' where a failure rests on a named change: the change, not
        the gate, leads (the_change); else 'infergate verdict: FAIL (1 fail: quality gate) — 2 perf gates on budgets
        only, …': what did not pass, by what it is, before what the verdict rests on (a quality failure must not read
        as the perf gates')."""
        led = self.change.gates if self.the_change() else 0
        parts = []
        for status in (Status.FAIL, Status.INCONCLUSIVE):
            groups = {group: n for group, c in self.counts.items()
                      if (n := c.get(status.value, 0) - (led if (group, status) == ("perf", Status.FAIL) else 0))}
            if groups:
                names = ", ".join(GATE_NAMES.get(group, group) for group in groups)
                parts.append(f"{sum(groups.values())} {status.value}: {names}")
        if led:
            parts = [f"{led} perf gate{'s' if led != 1 else ''}"] + (["also " + "; ".join(parts)] if parts else [])
        return f"infergate verdict: {self.status.upper()}{self.the_change()}" \
            + (f" ({'; '.join(parts)})" if parts else "") + self.qualifier()

    def the_change(self) -> str:
        """': tokens/s 65.9% lower (…) since engine_config.max_batch_size 8 → 1' where the run failed and a perf gate's
        failure rests on a change since the baseline (model, precision, libraries, engine config): what the verdict
        line and the report's verdict heading lead with; "" otherwise."""
        return f": {self.change.lead()}" if self.change is not None and self.status == Status.FAIL else ""

    @property
    def compared_nothing(self) -> int:
        """How many relative checks had nothing to compare with (Reason `NOTHING_COMPARED`, or `BASELINE_SAVED`
        where this run saved it)."""
        return sum(1 for r in self.reasons if r.what in (NOTHING_COMPARED, BASELINE_SAVED))

    def qualifier(self) -> str:
        """What the verdict rests on where relative checks compared nothing: " — 3 perf gates had no baseline to
        compare with" (a first run, the run that saves one; said whether or not they have budgets); "" otherwise."""
        if not self.compared_nothing:  # said whatever the status: a warning may make a first run inconclusive
            return ""
        n = self.compared_nothing
        saved = f": this run saved the baseline to {self.saved_baseline}" if self.saved_baseline else ""
        return f" — {n} perf gate{'s' if n != 1 else ''} had no baseline to compare with{saved}"

    def to_dict(self) -> dict:
        return {"verdict": self.status.value, "verdict_line": self.headline(),
                "reasons": [reason.to_dict() for reason in self.reasons]}


GATE_NAMES = {"perf": "perf gate", "quality": "quality gate", "golden": "golden gate",
              "batch_invariance": "batch invariance", "corpus": "corpus check"}


def count_name(group: str) -> str:
    """A group of RunVerdict.counts as the summaries name it: a gate kind ("perf"), "failed tests", "not as
    asked"."""
    return "failed tests" if group == FAILED_TESTS else group


def run_verdict(results: RunResults) -> RunVerdict:
    reasons = []
    counts: dict[str, dict[str, int]] = {}

    def count(group: str, status: Status) -> None:
        counts.setdefault(group, {s.value: 0 for s in Status})[status.value] += 1
    # a test failed by its own gate is said once, as the gate with its reasons (not again as a failed test)
    # (under --infergate-strict a gate that did not decide failed its test: said as that gate, failed)
    gated = {record.test for record in results.records if under_strict(record.status, results.strict) == Status.FAIL}
    for nodeid, outcome in results.outcomes.items():
        if outcome == "failed" and any(test == nodeid or test.startswith(nodeid + "::") for test in gated):
            continue
        if outcome in ("failed", "error"):
            message = results.failures.get(nodeid, "")
            reasons.append(Reason(Status.FAIL, "test" if outcome == "failed" else "test error", nodeid,
                                  message or outcome))
            count(FAILED_TESTS, Status.FAIL)
    # the reference against itself is counted apart, and a reason only where no quantized precision gated
    quality = results.quality
    itself = sum(1 for r in quality if r.precision == r.reference_precision)
    gated_quality = itself < len(quality)
    for record in results.records:
        count(record.kind, under_strict(record.status, results.strict))
        if record.status != Status.PASS:
            reasons.append(Reason(under_strict(record.status, results.strict), GATE_NAMES.get(record.kind, record.kind),
                                  record.test, record_message(record)))
        elif getattr(record, "compared_nothing", False):  # a pass of the budgets alone: said, never a bare pass
            what = BASELINE_SAVED if results.saved_baseline else NOTHING_COMPARED
            reasons.append(Reason(Status.PASS, what, record.test,
                                  no_baseline_message(record, results.saved_baseline)))
        elif isinstance(record, QualityRecord) and record.precision == record.reference_precision:
            if not gated_quality:  # then it is why nothing was gated
                reasons.append(Reason(Status.PASS, REFERENCE_ITSELF, record.test,
                                      reference_itself_message(record.precision)))
        elif getattr(record, "model_change", ""):  # a pass against another model's baseline: said, not hidden
            reasons.append(Reason(Status.PASS, "model change", record.test,
                                  f"compared with a baseline of another model: {record.model_change}"))
    for warning in results.warnings:
        reasons.append(Reason(Status.INCONCLUSIVE, NOT_RUN_AS_ASKED, "", warning))
        count(NOT_RUN_AS_ASKED, Status.INCONCLUSIVE)
    status = under_strict(Status.worst(reason.status for reason in reasons), results.strict)
    worst_first = sorted(reasons, key=lambda reason: -Status(reason.status).rank)  # a pass said last (a model change)
    return RunVerdict(status, worst_first, results.saved_baseline, counts, change_failure(results.records), itself)


def not_run(results: RunResults) -> tuple[list[Finding], dict[str, int]]:
    """The not-run table's rows, and the tests skipped by design: reason -> count. Rows are the run's findings
    (every check that could not run or decide says so where it is known, with its test and its fix) and the tests
    skipped with a finding (no accepted golden outputs yet, a model the engine refused, no server given); a test
    that warned and was skipped for the same check is one row. Other skips are by design (an experiment that runs
    on the reference precision only): counted, not listed."""
    rows = list(results.findings)
    for test, finding in results.skipped_findings.items():
        if not any(row.test == test and row.check == finding.check for row in rows):
            rows.append(finding)
    by_design: dict[str, int] = {}
    for test, reason in results.skips.items():
        if test not in results.skipped_findings:
            by_design[reason] = by_design.get(reason, 0) + 1
    return rows, by_design


def skipped_not_run(results: RunResults) -> list[Finding]:
    """The not-run table's rows of tests skipped with a finding, beyond the run's findings (said as warnings)."""
    return [row for row in not_run(results)[0] if row not in results.findings]
