"""Golden samples through a local model on the reference engine: the greedy outputs the quality gates compare."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.engine import Engine, EngineConfig, Request
from pytest_infergate.quality.golden_files import GoldenSample


@dataclass
class Generated:
    id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str


def generate_golden_outputs(loaded, samples: list[GoldenSample], config: EngineConfig | None = None
                            ) -> list[Generated]:
    """Greedy outputs of every sample through the reference engine (continuous batching)."""
    config = config or EngineConfig(max_batch_size=64, max_model_len=2048, kv_budget_bytes=512 << 20)
    with Engine(loaded.model, loaded.tokenizer, config) as engine:
        results = engine.generate([Request(**s.request_kwargs(), request_id=s.id) for s in samples])
    return [Generated(s.id, r.prompt_token_ids, r.token_ids, r.text) for s, r in zip(samples, results)]
