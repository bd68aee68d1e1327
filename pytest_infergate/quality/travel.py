"""The quality decision against accepted outputs. A quantized precision's tokens do not reproduce on another CPU model
or kernel path, nor across a library upgrade on the same machine, but its distance from its own reference does: the
accepted file (schema 3) stores per sample its top-1 agreement and KL on the reference's continuation and its task
score beside the reference's. This run's figures against its reference are compared with them, paired by sample, and
a bootstrap over the samples decides: PASS when every figure's worsening is, with 95% confidence, within its margin
(`max_top1_drop`, `max_kl_rise`, `max_task_drop`), FAIL when one is beyond it, else inconclusive, naming the action
that decides. Why, and the spread between machines the margins come from: docs/explanation/quality-gates.md,
'Judged by quality against what was accepted'.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate import units
from pytest_infergate.quality.golden_files import GoldenOutputs
from pytest_infergate.stats import mean, paired_bootstrap_ci
from pytest_infergate.status import Decision, Status

MAX_TOP1_DROP = 0.05
MAX_KL_RISE = 0.5  # relative to the accepted mean KL
KL_FLOOR = 1e-3  # nats: the margin of a precision whose accepted KL is ~0 (numerics alone reach this)
MAX_TASK_DROP = 0.1
RESAMPLES = 2000


@dataclass(frozen=True)
class SampleFigures:
    """One sample's quality against the reference precision on the machine that measured it."""

    top1: float | None = None  # teacher-forced top-1 agreement on the reference's continuation
    mean_kl: float | None = None  # mean KL(reference || candidate) over that continuation, nats
    task: float | None = None  # the candidate's task score (None: the sample has no task checks)
    reference_task: float | None = None

    @classmethod
    def of(cls, quality) -> SampleFigures:
        """From a metrics.SampleQuality of the candidate against the reference."""
        return cls(quality.top1, quality.mean_kl, quality.candidate_task, quality.reference_task)

    def to_dict(self) -> dict:
        return {name: round(value, 6) if value is not None else None
                for name, value in (("top1", self.top1), ("mean_kl", self.mean_kl), ("task", self.task),
                                    ("reference_task", self.reference_task))}

    @classmethod
    def from_dict(cls, data: dict) -> SampleFigures:
        def number(name: str) -> float | None:
            value = data.get(name)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(number("top1"), number("mean_kl"), number("task"), number("reference_task"))

    @property
    def task_deficit(self) -> float | None:
        """How much of the reference's task score the candidate lost on this sample (negative: it did better)."""
        if self.task is None or self.reference_task is None:
            return None
        return self.reference_task - self.task


@dataclass(frozen=True)
class TravelMargins:
    top1_drop: float = MAX_TOP1_DROP
    kl_rise: float = MAX_KL_RISE
    task_drop: float = MAX_TASK_DROP

    @classmethod
    def of(cls, rules: dict[str, float]) -> TravelMargins:
        return cls(rules.get("max_top1_drop", MAX_TOP1_DROP), rules.get("max_kl_rise", MAX_KL_RISE),
                   rules.get("max_task_drop", MAX_TASK_DROP))


@dataclass(frozen=True)
class TravelFigure:
    """One figure's equivalence decision: its worsening (now minus accepted, positive = worse), mean over the
    paired samples with a 95% bootstrap interval, against its margin."""

    metric: str  # "top1", "mean_kl", "task deficit"
    accepted: float  # the mean as accepted on the other machine
    now: float  # the mean on this machine
    worsening: float
    low: float
    high: float
    margin: float
    samples: int

    @property
    def status(self) -> Status:
        if self.low > self.margin:
            return Status.FAIL
        return Status.PASS if self.high <= self.margin else Status.INCONCLUSIVE

    def describe(self) -> str:
        """'top1 0.939 accepted → 0.792 now, worse by 0.147 (95% CI of the worsening 0.11 to 0.19) > margin 0.05';
        a change a thousandth of the margin or less reads 0 (its float noise, 6.7×10⁻⁹, says nothing)."""
        relation = {Status.FAIL: ">", Status.PASS: "≤"}.get(self.status, "straddles")
        worsening, low, high = (self._resolved(value) for value in (self.worsening, self.low, self.high))
        change = ("unchanged" if worsening == 0 else f"worse by {units.number(worsening, 3)}" if worsening > 0
                  else f"better by {units.number(-worsening, 3)}")
        return (f"{self.metric} {units.number(self.accepted, 3)} accepted → {units.number(self.now, 3)} now, "
                f"{change} (95% CI of the worsening {units.number(low, 3)} to {units.number(high, 3)}) "
                f"{relation} margin {units.number(self.margin, 3)} ({self.samples} samples)")

    def _resolved(self, value: float) -> float:
        """0 where `value` is within a thousandth of the margin: below what the margin can tell apart."""
        return 0.0 if abs(value) <= self.margin / 1000 else value


ACCEPTED_ELSEWHERE = "the accepted machine's"
ACCEPTED_HERE = "those accepted with the outputs"


def decide_travel(accepted: dict[str, SampleFigures], now: dict[str, SampleFigures], categories: dict[str, str],
                  margins: TravelMargins, accepted_as: str = ACCEPTED_ELSEWHERE) -> Decision:
    """`now` (this run, sample id -> figures against its reference) against `accepted` (the accepted file's), per
    figure (TravelFigure); `categories`: sample id -> category; `accepted_as`: what the accepted figures are, in the
    messages. The decision's sentences are made here: a failure names the figures beyond their margins, the
    categories and samples that fell most; an undecided one the figures that straddle theirs (none paired: no
    figures at all); its one note is every figure in words (the golden record's `travel`)."""
    paired = [sample for sample in now if sample in accepted]
    figures = []
    worst_categories: dict[str, list[str]] = {}  # category -> what fell there, in the order first found
    for metric, worse, margin_of in (
            ("top1", lambda a, n: a.top1 - n.top1 if a.top1 is not None and n.top1 is not None else None,
             lambda accepted_mean: margins.top1_drop),
            ("mean_kl", lambda a, n: n.mean_kl - a.mean_kl if a.mean_kl is not None and n.mean_kl is not None
             else None, lambda accepted_mean: max(margins.kl_rise * accepted_mean, KL_FLOOR)),
            ("task deficit", lambda a, n: n.task_deficit - a.task_deficit
             if a.task_deficit is not None and n.task_deficit is not None else None,
             lambda accepted_mean: margins.task_drop)):
        pairs = [(sample, worse(accepted[sample], now[sample])) for sample in paired]
        pairs = [(sample, value) for sample, value in pairs if value is not None]
        if not pairs:
            continue
        values = [value for _, value in pairs]
        point, low, high = paired_bootstrap_ci(values, resamples=RESAMPLES)
        accepted_mean = mean([_figure(metric, accepted[sample]) for sample, _ in pairs])
        now_mean = mean([_figure(metric, now[sample]) for sample, _ in pairs])
        figure = TravelFigure(metric, accepted_mean, now_mean, point, low, high, margin_of(accepted_mean), len(pairs))
        figures.append(figure)
        if figure.status != Status.PASS:
            for name, fell in _worst_categories(metric, pairs, categories, figure.margin):
                worst_categories.setdefault(name, []).append(fell)
    status = Status.worst(figure.status for figure in figures) if figures else Status.INCONCLUSIVE
    summary = "; ".join(figure.describe() for figure in figures) or "no figures to compare"
    if status == Status.FAIL:
        fell = "; ".join(f.describe() for f in figures if f.status == Status.FAIL)
        where = "; categories that fell most: " + ", ".join(f"{name} ({', '.join(what)})" for name, what
                                                             in worst_categories.items()) if worst_categories else ""
        worst_samples = _worst_samples(accepted, now, paired, categories)
        where += "; samples: " + ", ".join(worst_samples) if worst_samples else ""
        return Decision([f"quality against the reference fell beyond the margins compared with {accepted_as}: "
                         f"{fell}{where}"], notes=[summary], figures=figures)
    if status == Status.INCONCLUSIVE:
        straddling = "; ".join(f.describe() for f in figures if f.status == Status.INCONCLUSIVE)
        return Decision(undecided=[f"quality against the reference neither equivalent nor fallen compared with "
                                   f"{accepted_as} ({straddling or 'no sample has figures on both sides'})"],
                        notes=[summary], figures=figures)
    return Decision(notes=[summary], figures=figures)


def decide_against(recorded: GoldenOutputs, source: str, reference: str, now: dict[str, SampleFigures],
                   categories: dict[str, str], margins: TravelMargins, other_machine: bool
                   ) -> tuple[Decision | None, str]:
    """(`now`, this run's figures against `reference`, decided against those `recorded` (an accepted file, named
    `source`), or None and why they do not compare: figures against another reference precision)."""
    against = recorded.header.get("figures_against")
    if against != reference:
        return None, (f"{source} records figures against {against}, this run measures against {reference}: its "
                      "tokens decide")
    accepted = {id_: SampleFigures.from_dict(output.figures)
                for id_, output in recorded.outputs.items() if output.figures is not None}
    return decide_travel(accepted, now, categories, margins, ACCEPTED_ELSEWHERE if other_machine else ACCEPTED_HERE), ""


def _figure(metric: str, figures: SampleFigures) -> float:
    return {"top1": figures.top1, "mean_kl": figures.mean_kl, "task deficit": figures.task_deficit}[metric]


def _worst_categories(metric: str, pairs: list[tuple[str, float]], categories: dict[str, str], margin: float,
                      count: int = 3) -> list[tuple[str, str]]:
    """(category, what fell) for the `count` categories whose mean worsening of `metric` is largest and beyond
    the margin."""
    by_category: dict[str, list[float]] = {}
    for sample, value in pairs:
        by_category.setdefault(categories.get(sample, "?"), []).append(value)
    means = sorted(((mean(values), name) for name, values in by_category.items()), reverse=True)
    return [(name, f"{metric} worse by {units.number(value, 3)}") for value, name in means[:count] if value > margin]


def _worst_samples(accepted: dict[str, SampleFigures], now: dict[str, SampleFigures], paired: list[str],
                   categories: dict[str, str], count: int = 5) -> list[str]:
    """The samples whose KL rose most (top-1 drop where there is no KL)."""
    def rise(sample: str) -> float:
        a, n = accepted[sample], now[sample]
        if a.mean_kl is not None and n.mean_kl is not None:
            return n.mean_kl - a.mean_kl
        return (a.top1 or 0.0) - (n.top1 or 0.0)

    ranked = sorted(paired, key=rise, reverse=True)[:count]
    return [f"{sample} [{categories.get(sample, '?')}]: KL {units.number(accepted[sample].mean_kl or 0, 3)} → "
            f"{units.number(now[sample].mean_kl or 0, 3)}, top-1 {units.number(accepted[sample].top1 or 0, 3)} → "
            f"{units.number(now[sample].top1 or 0, 3)}" for sample in ranked if rise(sample) > 0]
