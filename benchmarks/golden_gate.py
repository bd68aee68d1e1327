"""The golden gates on the embedded model: what they cost, and the data behind the near-tie defaults.

    python benchmarks/golden_gate.py costs [--precisions fp32,int8,nf4] [--threads N] [--all] [--samples N]
    python benchmarks/golden_gate.py classify [--precisions ...] [--emulate-avx2] [--against default|own]
    python benchmarks/golden_gate.py noise [--precisions ...] [--scales 0.01,0.03,0.1] [--layer 15]

costs: per precision, the fixed-composition generation of the whole sample file; teacher-forced scoring of its 48
    continuations alone (one row per forward, as the gates score) vs in batches of 8 (as recording did before);
    and `check_batch_invariance` on the suite's subset (with --all: on every sample). Wall and process CPU seconds
    (on a shared machine the CPU time is the steadier figure).
classify: generate the whole file now and compare with the accepted files in golden/ (the regression gate, default
    policy): each changed sample's margin at the first divergence and accepted KL. With --emulate-avx2 the run
    emulates an AVX2-only CPU on an AVX-512 one (benchmarks/emulate_avx2.py: MKL/oneDNN/ATen limited to AVX2,
    bitsandbytes' AVX512-BF16 nf4 kernel and torch._int_mm int8 path off): the numerics of "another machine"
    against files recorded here.
    With --against own the run is compared with the file the gate picks for its kernel path (emulated AVX2: the
    files recorded on an AVX2-only AMD EPYC).
noise: a deliberately changed model: seeded Gaussian noise on one layer's RMSNorm weight (kept in float in every
    precision, so the same change applies to fp32, int8 and nf4), scaled to the weight's mean magnitude;
    the changed samples' margins, accepted KLs and verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load(precision: str, model: str = "smollm2-135m"):
    from pytest_infergate.models import load_model, resolve_model

    cache = Path(os.environ.get("INFERGATE_CACHE_DIR", Path.home() / ".cache" / "infergate"))
    return load_model(resolve_model(model, cache), precision)


def samples():
    from pytest_infergate.quality.golden_files import BUILTIN_SAMPLE_SET, load_samples

    return load_samples(BUILTIN_SAMPLE_SET)


def accepted(loaded, own_kernel_path: bool = False):
    """The default accepted file; with own_kernel_path, the one the gate picks for this machine's (or the
    emulated) kernel path."""
    from pytest_infergate.quality.golden_files import outputs_path, read_outputs
    from pytest_infergate.quality.golden_machines import golden_environment, select_accepted

    default = outputs_path(ROOT / "golden", "SmolLM2-135M-Instruct", loaded.record.fingerprint, "cpu",
                           loaded.record.requested_precision)
    path = select_accepted(default, golden_environment(loaded))[0] if own_kernel_path else default
    return read_outputs(path), path.name


def timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn(*args)
    return value, round(time.perf_counter() - wall, 1), round(time.process_time() - cpu, 1)


def emit(**fields) -> None:
    fields["load"] = open("/proc/loadavg").read().split()[0] if Path("/proc/loadavg").exists() else None
    print(json.dumps(fields), flush=True)


def costs(args) -> None:
    import torch

    from pytest_infergate.quality.golden_generation import check_variants, run_samples
    from pytest_infergate.quality.scoring import score_rows

    if args.threads:
        torch.set_num_threads(args.threads)
    ss = samples()
    subset = [s for s in ss if s.category in ("long-form", "code")]  # as suites/test_golden.py
    if args.samples:  # a quicker look: the file's first N samples and the subset's first N
        subset = subset[:args.samples]
        ss = ss[:args.samples] + subset
    for precision in args.precisions:
        loaded = load(precision)
        run, wall, cpu = timed(run_samples, loaded, ss)
        emit(precision=precision, what=f"generation, whole file ({len(ss)})", wall_s=wall, cpu_s=cpu,
             threads=torch.get_num_threads())
        rows = [(g.prompt_ids, g.token_ids) for g in run.outputs]
        for size in (8, 1):
            _, wall, cpu = timed(score_rows, loaded.model, rows, size)
            emit(precision=precision, what=f"scoring {len(rows)}, {'alone' if size == 1 else f'batches of {size}'}",
                 wall_s=wall, cpu_s=cpu)
        for name, chosen in (("suite subset", subset), ("all", ss))[: 2 if args.all else 1]:
            fixed = [run.by_id[s.id] for s in chosen]
            result, wall, cpu = timed(check_variants, loaded, chosen, fixed, 2048)
            emit(precision=precision, what=f"batch invariance, {name} ({len(chosen)})", wall_s=wall, cpu_s=cpu,
                 variant_share=round(result.variant_share, 3), variant_ids=result.variant_ids,
                 variants={v.name: {"changed": len(v.changed), "mean_kl": v.mean_kl, "max_kl": v.max_kl,
                                    "margins": [d.margin for d in v.changed]} for v in result.variants})


def compare_now(loaded, tag: str, own_kernel_path: bool = False, limit: int | None = None, **extra) -> None:
    from pytest_infergate.quality.golden_generation import run_samples
    from pytest_infergate.quality.regression import compare_with_golden

    ss = samples()[:limit]
    run, wall, cpu = timed(run_samples, loaded, ss)
    golden, file = accepted(loaded, own_kernel_path)
    regression = compare_with_golden(loaded.tokenizer, ss, run.outputs, golden,
                                     loaded.record.requested_precision, loaded.model)
    emit(precision=loaded.record.requested_precision, what=tag, against=file, **extra,
         generation_wall_s=wall, generation_cpu_s=cpu,
         changed=len(regression.changed), near_ties=len(regression.near_ties), drift=len(regression.drift),
         samples=[{"id": s.id, "token": s.first_divergence, "margin": s.divergence_margin, "kl": s.mean_kl,
                   "verdict": s.regression} for s in regression.changed])


def classify(args) -> None:
    if args.emulate_avx2:
        from emulate_avx2 import reexec_emulated

        reexec_emulated()  # before torch loads
    import torch

    for precision in args.precisions:
        compare_now(load(precision), "emulated AVX2 vs accepted" if args.emulate_avx2 else "now vs accepted",
                    own_kernel_path=args.against == "own", limit=args.samples,
                    cpu_capability=torch.backends.cpu.get_cpu_capability())


def noise(args) -> None:
    import torch

    for precision in args.precisions:
        loaded = load(precision)
        weight = loaded.model.model.layers[args.layer].post_attention_layernorm.weight
        original = weight.data.clone()
        for scale in args.scales:
            generator = torch.Generator().manual_seed(1)
            weight.data = original + scale * original.abs().mean() * torch.randn(original.shape, generator=generator)
            compare_now(loaded, f"noise {scale:g} on layer {args.layer} post_attention_layernorm", scale=scale,
                        limit=args.samples)
        weight.data = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("costs", "classify", "noise"))
    parser.add_argument("--precisions", default="fp32,int8,nf4", type=lambda s: s.split(","))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="costs: batch invariance on every sample too")
    parser.add_argument("--samples", type=int, default=None,
                        help="the file's first N samples (costs: and the suite subset's first N; default: all)")
    parser.add_argument("--emulate-avx2", action="store_true")
    parser.add_argument("--against", choices=("default", "own"), default="default",
                        help="classify: the default accepted file, or the one the gate picks for this kernel path")
    parser.add_argument("--scales", default="0.01,0.03,0.1", type=lambda s: [float(x) for x in s.split(",")])
    parser.add_argument("--layer", type=int, default=15)
    args = parser.parse_args()
    {"costs": costs, "classify": classify, "noise": noise}[args.command](args)


if __name__ == "__main__":
    main()
