"""When a sequence stops: EOS, a stop token, a stop string, or its max_new_tokens. Shared by the engine and the
HF generate backend, so both end requests for the same reasons."""

from __future__ import annotations

from pytest_infergate.engine.sequence import FinishReason
from pytest_infergate.workloads.request import Request

STOP_STRING_TAIL_TOKENS = 16  # a stop string is looked for in the text of the last tokens


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
