"""The quality gates' power on the embedded model: the candidate precision (int8) changed on purpose at graded
levels over several seeds, the fp32 reference untouched, and each gate's verdict per trial, decided by the product
itself (a GoldenGate with a plain TestContext, as benchmarks/gate_power.py drives a PerfBench), beside the true
change on the built-in corpus.

    python benchmarks/quality_power.py [--seeds 5] [--levels 0.001,0.01,0.05,0.2] [--norm-trials 0.001:2,0.2:3]
        [--samples 48] [--layer-levels 0.1,0.3] [--layer-seeds 2] [--layer 15] [--windows 128,32]
        [--only norms,layer,window] [--rise 0.5] [--json PATH]

The changes (to the int8 model after loading; restored after each trial):
- norms: every layer's `input_layernorm.weight` multiplied by (1 + s·N(0, 1)), seeded per trial;
- layer: one layer's MLP output rows scaled by (1 + s·N(0, 1)), seeded: `mlp.down_proj`'s weight rows scaled,
  applied as a forward hook on its output (bitsandbytes keeps that weight as int8; a hook on the output is the
  same change exactly, W' = diag(1 + s·n) W);
- window: a KV cache that keeps only the last W positions: every attention layer reads only its W most recent keys
  (a sliding window), in the engine that generates the golden outputs (its attention honours a layer's
  `sliding_window`) and in the HF forwards that score the golden samples and the corpus (a masked SDPA).

The gates, each decided by the product's own calls:
- reference, example policy: `check(policy={"min_top1": 0.9, "max_mean_kl": 0.05})` (the README's);
- reference, default: `check()` with no policy (the 8-bit class default, named in its verdict);
- accepted: `check_regression()` against the outputs accepted at s = 0 (into a temporary golden folder), decided
  by quality relative to the figures recorded at acceptance (quality.travel, int8's default `gate_tokens=0`);
- corpus, default: `check_corpus()` with no policy (the 8-bit class's corpus thresholds);
- corpus, rise: `check_corpus(policy={"max_corpus_kl_rise": RISE})` against the corpus figures accepted at s = 0.

The fp32 reference's golden outputs, its log-probabilities of them and its corpus logits are computed once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from golden_gate import load  # noqa: E402

EXAMPLE_POLICY = {"min_top1": 0.9, "max_mean_kl": 0.05}  # the README's
GATES = ("reference, example policy", "reference, default policy", "accepted outputs", "corpus, default policy",
         "corpus, rise")
WINDOW_ATTENTION = "infergate_power_window"


class GateFailed(Exception):
    pass


class GateSkipped(Exception):
    pass


class Undecided:
    """What a gate that stopped before deciding left: no record, the reason as its status."""

    def __init__(self, why: str):
        self.status = type("Why", (), {"value": "error"})()
        self.why, self.problems, self.undecided, self.decided_by, self.result = why, [why], [], why, None


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def level_seeds(text: str) -> list[tuple[float, int]]:
    """"0.001:2,0.2:3" -> [(0.001, 2), (0.2, 3)]."""
    return [(float(level), int(seed)) for level, seed in (pair.split(":") for pair in text.split(",") if pair)]


# ---- the changes ------------------------------------------------------------------------------------------------
@contextmanager
def norms_changed(model, scale: float, seed: int):
    """Every layer's input_layernorm.weight multiplied by (1 + scale·N(0, 1))."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    weights = [layer.input_layernorm.weight for layer in model.model.layers]
    originals = [w.data.clone() for w in weights]
    for weight, original in zip(weights, originals):
        weight.data = original * (1 + scale * torch.randn(original.shape, generator=generator))
    try:
        yield
    finally:
        for weight, original in zip(weights, originals):
            weight.data = original


@contextmanager
def layer_changed(model, scale: float, seed: int, layer: int):
    """Layer `layer`'s down_proj weight rows scaled by (1 + scale·N(0, 1)), as a hook on its output."""
    import torch

    down = model.model.layers[layer].mlp.down_proj
    generator = torch.Generator().manual_seed(seed)
    factor = 1 + scale * torch.randn(down.out_features, generator=generator)
    handle = down.register_forward_hook(lambda module, args, out: out * factor.to(out.dtype))
    try:
        yield
    finally:
        handle.remove()


def windowed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention with the keys older than `sliding_window` positions masked out (the HF forwards
    of the scoring; the engine honours `sliding_window` itself)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    window = kwargs.get("sliding_window")
    if window is not None:
        queries, keys = query.shape[2], key.shape[2]
        query_pos = torch.arange(keys - queries, keys, device=query.device)[:, None]
        key_pos = torch.arange(keys, device=query.device)[None, :]
        band = (key_pos <= query_pos) & (key_pos > query_pos - window)
        if attention_mask is None:
            attention_mask = band[None, None]
        elif attention_mask.dtype == torch.bool:
            attention_mask = attention_mask[..., -keys:] & band
        else:
            attention_mask = attention_mask[..., -keys:].masked_fill(~band, torch.finfo(attention_mask.dtype).min)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@contextmanager
def window_changed(model, window: int):
    """Every attention layer reads only its `window` most recent keys."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(WINDOW_ATTENTION, windowed_sdpa)
    AttentionMaskInterface.register(WINDOW_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    own = model.config._attn_implementation
    declared = model.config.__dict__.get("sliding_window", None)
    model.set_attn_implementation(WINDOW_ATTENTION)
    # declared, the engine's self-check crosses the window, checking its windowed cache against windowed_sdpa
    model.config.sliding_window = window

    def hook(module, args, kwargs):
        return args, {**kwargs, "sliding_window": window}

    handles = [layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(own)
        model.config.sliding_window = declared


@contextmanager
def unchanged(model):
    yield


# ---- the reference's corpus logits, once ------------------------------------------------------------------------
def remember_corpus_forwards(model, chunks) -> None:
    """The reference's forward over a corpus chunk computed once: `score_corpus` runs it again for every trial."""
    keys = {tuple(ids) for _, ids in chunks}
    forward, kept = model.forward, {}

    def remembered(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if args or set(kwargs) != {"input_ids", "attention_mask"} or ids is None or ids.shape[0] != 1:
            return forward(*args, **kwargs)
        key = tuple(ids[0].tolist())
        if key not in keys:
            return forward(*args, **kwargs)
        if key not in kept:
            kept[key] = forward(*args, **kwargs)
        return kept[key]

    model.forward = remembered


# ---- the gates --------------------------------------------------------------------------------------------------
class Trials:
    """One GoldenGate per call over the session-like caches: the reference's entries are kept, the candidate's
    dropped after each trial."""

    def __init__(self, reference, candidate, golden_dir: Path, model_name: str, limit: int | None, rise: float):
        from pytest_infergate.quality.scoring import ScoreCache

        self.reference, self.candidate = reference, candidate
        self.golden_dir, self.model_name, self.limit, self.rise = golden_dir, model_name, limit, rise
        self.comparisons: dict = {}
        self.generated: dict = {}
        self.reference_scores = ScoreCache()
        self.regression = None  # the last GoldenRegression the gate decided

    def gate(self, records: list, update: bool = False):
        from pytest_infergate.context import TestContext
        from pytest_infergate.gates.golden import GoldenGate
        from pytest_infergate.gates.golden_candidates import LocalCandidate
        from pytest_infergate.options import Options

        def fail(message):
            raise GateFailed(message)

        def skip(message):
            raise GateSkipped(str(message))

        options = Options(golden_dir=self.golden_dir, update_golden=update)
        ctx = TestContext("benchmarks/quality_power.py", options, records.append, lambda finding: None, fail, skip)
        candidate = LocalCandidate(self.candidate, "cpu", self.generated, options.golden_max_len,
                                   self.reference_scores)
        regression = candidate.regression

        def kept(*args):  # the GoldenRegression the gate decides on, kept: a failing gate returns nothing
            self.regression = regression(*args)
            return self.regression

        candidate.regression = kept
        return GoldenGate(ctx, candidate, lambda: self.reference, self.golden_dir, lambda: self.model_name,
                          self.comparisons, self.generated)

    def forget_candidate(self) -> None:
        precision = self.candidate.record.requested_precision
        for cache in (self.comparisons, self.generated):
            for key in [k for k in cache if precision in k[:2]]:
                del cache[key]

    def call(self, method: str, update: bool = False, **kwargs):
        """(the record the gate wrote, what the call returned)."""
        records: list = []
        returned = None
        try:
            returned = getattr(self.gate(records, update), method)(**kwargs)
        except (GateFailed, GateSkipped) as exc:
            if not records:  # failed before deciding (an error of the run, not a verdict): said, kept apart
                print(f"  {method}({kwargs}) stopped before deciding: {exc}", flush=True)
                return Undecided(f"error: {exc}"), None
        return records[-1], returned

    def accept(self) -> None:
        """The unchanged candidate's golden outputs and corpus figures accepted into the temporary folder."""
        self.call("check_regression", update=True)
        self.call("check_corpus", update=True)
        self.forget_candidate()

    def trial(self) -> dict:
        started = time.perf_counter()
        example, _ = self.call("check", limit=self.limit, policy=dict(EXAMPLE_POLICY))
        default, _ = self.call("check", limit=self.limit)
        accepted, _ = self.call("check_regression", limit=self.limit)
        regression = self.regression
        corpus_default, _ = self.call("check_corpus")
        corpus_rise, _ = self.call("check_corpus", policy={"max_corpus_kl_rise": self.rise})
        self.forget_candidate()
        s = example.result.summary if example.result is not None else {}  # the record's: a failed check returns none
        c = corpus_rise.result.summary if corpus_rise.result is not None else {}
        travel = {f.metric: {"accepted": f.accepted, "now": f.now, "worsening": f.worsening, "low": f.low,
                             "high": f.high, "margin": f.margin} for f in (regression.travel.figures
                                                                          if regression and regression.travel else [])}
        return {
            "verdicts": dict(zip(GATES, (r.status.value for r in (example, default, accepted, corpus_default,
                                                                   corpus_rise)))),
            "default_policy": default.decided_by,
            "accepted_decided_by": accepted.decided_by,
            "golden": {"top1": s.get("top1"), "top1_ci": s.get("top1_ci"), "mean_kl": s.get("mean_kl"),
                       "mean_kl_ci": s.get("mean_kl_ci"), "samples": s.get("samples")},
            "changed": len(regression.changed) if regression else None,
            "drift": len(regression.drift) if regression else None,
            "travel": travel,
            "corpus": {k: c.get(k) for k in ("mean_kl", "mean_kl_ci", "top1", "top1_ci", "delta_ppl_rel",
                                             "delta_ppl_rel_ci", "kl_rise", "kl_rise_ci", "accepted_mean_kl")},
            "problems": {gate: r.problems + r.undecided for gate, r in zip(
                GATES, (example, default, accepted, corpus_default, corpus_rise)) if r.problems or r.undecided},
            "seconds": round(time.perf_counter() - started, 1),
        }


# ---- reporting --------------------------------------------------------------------------------------------------
def trial_line(name: str, trial: dict) -> str:
    g, c, t = trial["golden"], trial["corpus"], trial["travel"].get("mean_kl")
    name += f" ({trial['backend']})"
    if g["top1"] is None or c["mean_kl"] is None:
        return f"{name}: {trial['verdicts']} {trial['problems']}"
    verdicts = " ".join(v[:4].upper() for v in trial["verdicts"].values())
    rise = (f"{c['kl_rise']:+.1%} [{c['kl_rise_ci'][0]:+.1%}, {c['kl_rise_ci'][1]:+.1%}]"
            if c.get("kl_rise") is not None else "-")
    golden_rise = (f"{t['worsening'] / t['accepted']:+.1%} [{t['low'] / t['accepted']:+.1%}, "
                   f"{t['high'] / t['accepted']:+.1%}]" if t and t["accepted"] else "-")
    return (f"{name}: {verdicts} | golden top-1 {g['top1']:.3f} KL {g['mean_kl']:.4f} (vs accepted {golden_rise}; "
            f"{trial['changed']} changed) | corpus KL {c['mean_kl']:.4f} [{c['mean_kl_ci'][0]:.4f}, "
            f"{c['mean_kl_ci'][1]:.4f}] top-1 {c['top1']:.3f} [{c['top1_ci'][0]:.3f}, {c['top1_ci'][1]:.3f}] "
            f"rise {rise} | {trial['seconds']:.0f} s")


def counts(trials: list[dict], gate: str) -> str:
    tally = Counter(t["verdicts"][gate] for t in trials)
    errors = f" ({tally['error']} stopped before deciding)" if tally["error"] else ""
    return "/".join(str(tally[s]) for s in ("pass", "inconclusive", "fail")) + errors


def spread(values: list[float], form: str) -> str:
    values = sorted(values)
    return form.format(values[0]) if len(values) == 1 else f"{form.format(values[0])}–{form.format(values[-1])}"


def rows_of(trials: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(change, level, its trials) in the order first run."""
    rows: list[tuple[str, str, list[dict]]] = []
    for trial in trials:
        row = next((r for r in rows if r[:2] == (trial["change"], trial["level"])), None)
        if row is None:
            rows.append(row := (trial["change"], trial["level"], []))
        row[2].append(trial)
    return rows


def table(rows: list[tuple[str, str, list[dict]]]) -> str:
    head = ("| change | level | trials | corpus mean KL | corpus top-1 | corpus KL vs s=0 | golden KL vs accepted | "
            + " | ".join(GATES) + " |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for change, level, trials in rows:
        c = [t["corpus"] for t in trials if t["corpus"]["mean_kl"] is not None]
        golden = [t["travel"]["mean_kl"]["worsening"] / t["travel"]["mean_kl"]["accepted"] for t in trials
                  if t["travel"].get("mean_kl") and t["travel"]["mean_kl"]["accepted"]]
        rises = [x["kl_rise"] for x in c if x.get("kl_rise") is not None]
        lines.append(f"| {change} | {level} | {len(trials)} | {spread([x['mean_kl'] for x in c], '{:.4f}')} | "
                     f"{spread([x['top1'] for x in c], '{:.3f}')} | "
                     f"{spread(rises, '{:+.0%}') if rises else '-'} | {spread(golden, '{:+.0%}') if golden else '-'} | "
                     + " | ".join(counts(trials, gate) for gate in GATES) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="trials per level of the norms change")
    parser.add_argument("--levels", type=floats, default=floats("0.001,0.01,0.05,0.2"))
    parser.add_argument("--norm-trials", type=level_seeds, metavar="LEVEL:SEED,...", help="the norms trials to run "
                        "instead of --levels x --seeds (to rerun some trials of an earlier run)")
    parser.add_argument("--samples", type=int, default=None, help="golden samples gated (default: all 48)")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--layer-levels", type=floats, default=floats("0.1,0.3"))
    parser.add_argument("--layer-seeds", type=int, default=2)
    parser.add_argument("--windows", default="128,32", help="KV cache windows, in positions")
    parser.add_argument("--only", default="norms,layer,window", help="which changes to run")
    parser.add_argument("--rise", type=float, default=0.5, help="max_corpus_kl_rise of the corpus rise gate")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--model", default="smollm2-135m", help="the model changed and gated (default: the embedded "
                        "one; tiny-random-llama with --layer 1 for a smoke run)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); on a shared "
                        "machine 1 spares the run the stalls of a second thread waiting on a busy core")
    parser.add_argument("--json", help="write every trial here too")
    parser.add_argument("--table-from", metavar="JSON", help="print the table of an earlier run's --json file (one cut "
                        "short too: it is written after every trial) and exit")
    args = parser.parse_args()
    if args.table_from:
        print(table(rows_of(json.loads(Path(args.table_from).read_text())["trials"])))
        return

    import torch

    from pytest_infergate.engine.backends import choice_for, choose_backend
    from pytest_infergate.environment import cpu_model
    from pytest_infergate.quality.corpus_scoring import corpus_chunks, corpus_texts

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    reference, candidate = load("fp32", args.model), load(args.precision, args.model)
    backend = choice_for(candidate)  # chosen (and self-checked) before any change
    choice_for(reference)
    _, texts = corpus_texts()
    remember_corpus_forwards(reference.model, corpus_chunks(reference.tokenizer, texts))
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.precision} on {backend.name}; "
          f"{' '.join(sys.argv[1:]) or '(defaults)'}", flush=True)
    print("verdicts in the order: " + ", ".join(GATES), flush=True)
    model = candidate.model
    out: dict = {"machine": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "argv": sys.argv[1:], "backend": backend.name, "trials": []}
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="quality-power-") as golden_dir:
        trials = Trials(reference, candidate, Path(golden_dir), reference.source.name, args.samples, args.rise)
        trials.accept()
        plan = [("none", "0", 0, unchanged(model))]
        if "norms" in only:
            trials_run = args.norm_trials or [(s, seed) for s in args.levels for seed in range(1, args.seeds + 1)]
            plan += [("norms", f"{s:g}", seed, norms_changed(model, s, seed)) for s, seed in trials_run]
        if "layer" in only:
            plan += [(f"layer {args.layer}", f"{s:g}", seed, layer_changed(model, s, seed, args.layer))
                     for s in args.layer_levels for seed in range(1, args.layer_seeds + 1)]
        if "window" in only:
            plan += [("window", f"W={w}", 0, window_changed(model, int(w))) for w in args.windows.split(",") if w]
        for change, level, seed, context in plan:
            with context:
                # as a session chooses for a freshly loaded candidate: the engine, or HF generate where the
                # engine's self-check refuses the changed model
                candidate.use_backend(choose_backend(candidate.model, candidate.tokenizer))
                trial = trials.trial()
            trial.update(change=change, level=level, seed=seed, backend=candidate.backend.name)
            out["trials"].append(trial)
            print(trial_line(f"{change} {level} seed {seed}", trial), flush=True)
            if args.json:  # after every trial: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    out["wall_s"] = round(time.perf_counter() - started)
    print(f"\nper gate: pass/inconclusive/fail over the trials; corpus and golden rises against the s = 0 figures "
          f"(the accepted ones); corpus rise gate max_corpus_kl_rise={args.rise:g}\n" + table(rows_of(out["trials"])),
          flush=True)
    print(f"wall time {out['wall_s']} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
