"""What a request may ask and when it ends, alike in the engine and the HF generate backend: `Limits` (the context
window, the prompt length, the output length: accept, truncate, clamp or reject at admission) and `StopChecker`
(EOS, a stop token, a stop string or max_new_tokens, after each token)."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.sequence import FinishReason
from pytest_infergate.workloads.request import Request, RequestError

MAX_CONTEXT = 8192  # the default max_model_len is the model's max_position_embeddings, at most this
STOP_STRING_TAIL_TOKENS = 16  # a stop string is looked for in the text of the last tokens


@dataclass
class Limits:
    max_model_len: int  # prompt and output together
    max_input_tokens: int
    truncate_input: bool
    max_new_tokens_limit: int | None
    vocab_size: int

    @classmethod
    def of(cls, model, config: EngineConfig) -> Limits:
        text_config = model.config.get_text_config()
        limit = getattr(text_config, "max_position_embeddings", None) or MAX_CONTEXT
        max_model_len = config.max_model_len or min(limit, MAX_CONTEXT)
        max_input = min(config.max_input_tokens or max_model_len - 1, max_model_len - 1)
        return cls(max_model_len, max_input, config.truncate_input, config.max_new_tokens_limit,
                   text_config.vocab_size)

    def check(self, request: Request, ids: list[int]) -> None:
        """Raise RequestError for what can never be served: token ids outside the vocabulary, a prompt over the
        context window (unless truncated)."""
        bad = [t for t in set(ids) | set(request.stop_token_ids) if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"token ids {sorted(bad)[:5]} are outside the vocabulary (0..{self.vocab_size - 1}): "
                               "check prompt_token_ids / stop_token_ids")
        if len(ids) >= self.max_model_len and not self.truncate_input:
            raise RequestError(f"prompt has {len(ids)} tokens, over the context window of {self.max_model_len} "
                               "(max_model_len, prompt and output together): shorten it or set "
                               "EngineConfig(truncate_input=True)")

    def fit(self, request: Request, ids: list[int]) -> tuple[list[int], int, str | None]:
        """(prompt ids, max new tokens, why it is rejected or None): a prompt over max_input_tokens is truncated
        to its last tokens or rejected; the output is clamped to the limit and to what the context has left."""
        if len(ids) > self.max_input_tokens:
            if not self.truncate_input:
                return ids, 0, f"prompt has {len(ids)} tokens, max_input_tokens is {self.max_input_tokens}"
            ids = ids[-self.max_input_tokens:]
        limit = self.max_new_tokens_limit or request.max_new_tokens
        return ids, min(request.max_new_tokens, limit, self.max_model_len - len(ids)), None


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id the model or tokenizer calls end-of-sequence."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            ids.update(value if isinstance(value, (list, tuple)) else [value])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class StopChecker:
    def __init__(self, tokenizer, eos_ids: set[int]):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def check(self, request: Request, output_ids: list[int], max_new_tokens: int) -> tuple[FinishReason, str] | None:
        """Why the sequence stops after its last token `output_ids[-1]`, or None to go on."""
        token = output_ids[-1]
        if token in self.eos_ids and not request.ignore_eos:
            return FinishReason.EOS, "end-of-sequence token"
        if token in request.stop_token_ids:
            return FinishReason.STOP, f"stop token {token}"
        if request.stop_strings:
            tail = self.tokenizer.decode(output_ids[-STOP_STRING_TAIL_TOKENS:], skip_special_tokens=False)
            for stop in request.stop_strings:
                if stop in tail:
                    return FinishReason.STOP, f"stop string {stop!r}"
        if len(output_ids) >= max_new_tokens:
            return FinishReason.LENGTH, f"max_new_tokens ({max_new_tokens}) reached"
        return None
