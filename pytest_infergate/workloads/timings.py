"""The timings of one request, wherever it ran: the one record the reference engine, the HF generate backend and a
served model's client each fill in (engine.Result.timings; endpoint.exchange.EndpointResult is one), and the
latencies derived from it the same way for all of them. Below the engine and the endpoint, which never import each
other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class RequestTimings:
    """Wall-clock instants (perf_counter seconds) of one request and its derived latencies. `arrival`: when it
    arrived at the engine, or began to go out from a client; `token_times`: when each generated token, or each
    streamed chunk that carried text, came; `num_output_tokens`: the tokens they carried where a chunk can carry
    several (None: one per entry of token_times); `decode_end`: where TPOT's span ends, set when the request ends
    (`end`), None where it has no TPOT."""

    arrival: float = 0.0
    first_scheduled: float | None = None  # the engine's first step with it in the batch
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    num_output_tokens: int | None = None
    decode_end: float | None = None

    def end(self, now: float) -> None:
        """The request ended at `now`, its decode at its last token (the engine's TPOT: a served model's client
        ends the decode with the stream instead, vLLM's definition)."""
        self.finished = now
        self.decode_end = self.token_times[-1] if self.token_times else None

    @property
    def output_count(self) -> int:
        return len(self.token_times) if self.num_output_tokens is None else self.num_output_tokens

    def _decode_span(self) -> tuple[float | None, int]:
        """The instant the last output token counts as come (None: no TPOT) and how many output tokens there are."""
        return self.decode_end, self.output_count

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT): from the first token to the end of the
        decode, over the output tokens less one."""
        end, count = self._decode_span()
        if end is None or count < 2 or self.first_token is None:
            return None
        return (end - self.first_token) / (count - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    def to_dict(self) -> dict[str, Any]:
        return {"queue_wait_s": self.queue_wait_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s, "itl_s": self.itl_s}
