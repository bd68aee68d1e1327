"""What the reference engine keeps and hands back for each request: its state inside the engine (Sequence), the
Result it ends with and its timings; what a request may ask and when it ends, alike in the engine and the HF generate
backend (`Limits`: the context window, the prompt length, the output length: accept, truncate, clamp or reject at
admission; `StopChecker`: EOS, a stop token, a stop string or max_new_tokens, after each token); and what the engine
records while it runs: one StepRecord per forward, degradation events, streamed chunks."""

from __future__ import annotations

import enum
import itertools
from dataclasses import asdict, dataclass, field

from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.workloads.request import Request, RequestError
from pytest_infergate.workloads.timings import RequestTimings


class FinishReason(str, enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def is_success(self) -> bool:
        return self in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)


@dataclass
class Result:
    request_id: str
    finish_reason: FinishReason
    reason: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    timings: RequestTimings
    num_preemptions: int = 0
    is_warmup: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (not computed)
    # with Request.top_logprobs: per generated token, (token ids, log-probabilities), most likely first, as the
    # forward that generated it computed them (in its batch)
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.finish_reason.is_success

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


_sequence_ids = itertools.count()


class SequenceStatus(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """The engine's state for one admitted request: tokens, progress, blocks, timings."""

    def __init__(self, request: Request, prompt_token_ids: list[int], arrival: float, request_id: str):
        self.seq_id = next(_sequence_ids)
        self.request = request
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_top_logprobs: list[tuple[list[int], list[float]]] = []
        self.max_new_tokens = request.max_new_tokens  # may be clamped by the engine's limits
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.block_keys: list[tuple] = []  # prefix-cache keys of its full, computed blocks, in order
        self.num_cached_tokens = 0  # prompt tokens taken from the prefix cache instead of computed
        self.timings = RequestTimings(arrival=arrival)
        self.finish_reason: FinishReason | None = None
        self.reason = ""
        self.num_preemptions = 0
        self.cancel_requested = False
        self.generator = None  # torch.Generator for seeded sampling, created by the runner
        self.stop_text_tail = ""

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token lacks cached K/V: the prompt (or, after a preemption, everything) is still being
        prefilled. A decode step feeds exactly the one token sampled last."""
        return self.num_uncomputed_tokens > 1

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.max_new_tokens

    def finish(self, reason: FinishReason, detail: str, now: float) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.reason = detail
        self.timings.end(now)

    def result(self, text: str) -> Result:
        """The Result of a finished sequence; `text` is its output decoded."""
        return Result(self.request_id, self.finish_reason, self.reason, self.prompt_token_ids,
                      list(self.output_token_ids), text, self.timings, self.num_preemptions,
                      bool(self.request.metadata.get("warmup")), self.num_cached_tokens,
                      list(self.output_top_logprobs))


# ---- what a request may ask, and when it ends -------------------------------------------------------------------
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
