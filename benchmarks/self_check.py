"""What the engine's self-check costs when a model is handed to it, on the CPU (one thread, as it runs there).

    python benchmarks/self_check.py                      # the embedded model and a Gemma 3 270M-shaped model
    python benchmarks/self_check.py --repeats 5

Gemma 3 270M's shape (18 layers, 5 sliding-window layers of 512 for each full one, 4 query heads of 256 over one
KV head, 262,144-token vocabulary), seeded random weights: the self-check's cost depends on the shape, not on the
weights. A window must be crossed, so the check runs its long probe (2 × 512 + 10 tokens) through the model's
layers 0 and 5, one of each distinct attention pattern; `every layer` runs it through all 18 (as before
2026-12-04). Prints each model's median seconds, the ratio between the two, and what the probe covered.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import pytest_infergate.engine.self_check as self_check  # noqa: E402
from pytest_infergate.engine import Engine, EngineConfig  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402

GEMMA3_270M = dict(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                   query_pre_attn_scalar=256, max_position_embeddings=32_768, rope_theta=1_000_000.0,
                   layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3)


def gemma3_270m_shaped():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(**GEMMA3_270M)
    config._attn_implementation = "sdpa"
    return Gemma3ForCausalLM(config).eval()


def timed(model, tokenizer, config: EngineConfig, repeats: int, every_layer: bool) -> tuple[float, object]:
    self_check.FULL_LONG_PROBE = every_layer
    seconds, report = [], None
    try:
        for _ in range(repeats):
            with Engine(model, tokenizer, config) as engine:
                report = engine.self_check
                seconds.append(report.seconds)
    finally:
        self_check.FULL_LONG_PROBE = False
    return statistics.median(seconds), report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedded = load_model(resolve_model("smollm2-135m", default_cache_dir()), "fp32")
    config = EngineConfig(max_model_len=1024)
    small, report = timed(embedded.model, embedded.tokenizer, config, args.repeats, every_layer=False)
    print(f"embedded model (SmolLM2-135M, 30 layers, no window): self-check {small:.2f} s "
          f"({report.num_tokens} probe tokens)", flush=True)
    gemma = gemma3_270m_shaped()
    rows = {}
    for every_layer in (False, True):
        rows[every_layer] = timed(gemma, embedded.tokenizer, config, args.repeats, every_layer)
        seconds, report = rows[every_layer]
        print(f"Gemma 3 270M-shaped, window 512, long probe through "
              f"{'every layer' if every_layer else 'one layer per pattern'} (layers {report.long_probe_layers}): "
              f"self-check {seconds:.2f} s, window crossed {report.window_crossed}, {report.num_tokens} probe "
              f"tokens, largest logit difference {report.max_diff:.2g} of scale {report.logit_scale:.3g}",
              flush=True)
    print(f"one layer per pattern / every layer: ×{rows[False][0] / rows[True][0]:.2f} the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
