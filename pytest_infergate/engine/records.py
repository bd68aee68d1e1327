"""What the engine records while it runs: one StepRecord per forward, degradation events, streamed chunks."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class StepRecord:
    index: int
    start_s: float  # since the engine's clock origin
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int
    kv_blocks_used: int
    forward_s: float
    step_s: float
    num_preempted: int = 0
    device_s: float | None = None  # the forward's device time by CUDA events (None off CUDA)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DegradationEvent:
    at_s: float
    kind: str
    detail: str


@dataclass
class StreamChunk:
    token_id: int
    text: str  # the text this token added (may be empty while a multi-byte character is incomplete)
