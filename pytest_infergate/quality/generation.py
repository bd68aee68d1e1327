"""Golden samples through a local model on the reference engine: the greedy outputs the quality gates compare."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.engine import Engine, EngineConfig, Request
from pytest_infergate.engine.request import RequestError, render_prompt
from pytest_infergate.quality.golden_files import GoldenError, GoldenSample

DEFAULT_MAX_MODEL_LEN = 2048


@dataclass
class Generated:
    id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str


def golden_engine_config(max_model_len: int = DEFAULT_MAX_MODEL_LEN) -> EngineConfig:
    return EngineConfig(max_batch_size=64, max_model_len=max_model_len, kv_budget_bytes=512 << 20)


def golden_requests(samples: list[GoldenSample], tokenizer, max_model_len: int) -> list[Request]:
    """One greedy request per sample; a sample the engine could never serve is an error naming its file and line."""
    requests = []
    for sample in samples:
        try:
            request = Request(**sample.request_kwargs(), request_id=sample.id)
            length = len(render_prompt(tokenizer, request))
        except RequestError as exc:
            raise GoldenError(f"{sample.where or 'golden set'}: sample {sample.id!r}: {exc}") from None
        if length >= max_model_len:
            raise GoldenError(f"{sample.where or 'golden set'}: sample {sample.id!r} has a {length}-token prompt, over "
                              f"the golden engine's context of {max_model_len} tokens: shorten it, or raise the limit "
                              f"with --infergate-golden-max-len (ini infergate_golden_max_len)")
        requests.append(request)
    return requests


def generate_golden_outputs(loaded, samples: list[GoldenSample], max_model_len: int = DEFAULT_MAX_MODEL_LEN
                            ) -> list[Generated]:
    """Greedy outputs of every sample through the reference engine (continuous batching)."""
    requests = golden_requests(samples, loaded.tokenizer, max_model_len)
    with Engine(loaded.model, loaded.tokenizer, golden_engine_config(max_model_len)) as engine:
        results = engine.generate(requests)
    return [Generated(s.id, r.prompt_token_ids, r.token_ids, r.text) for s, r in zip(samples, results)]
