"""EngineConfig: every knob of the reference engine, validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pytest_infergate.errors import OptionError, check_bool, check_int, check_number

CACHE_MODES = ("paged", "contiguous", "none")
BATCHING_MODES = ("sequential", "static", "dynamic", "continuous")


@dataclass
class EngineConfig:
    """
    cache_mode: `paged` grows each sequence's KV cache block by block; `contiguous` reserves a sequence's whole
        maximum length (prompt + max_new_tokens) when it is admitted, as a per-batch contiguous cache does;
        `none` keeps no cache and recomputes the whole prefix at every step (the use_cache=False experiment).
    batching: `sequential` one request at a time; `static` batches of `max_batch_size`, padded, run until the
        longest finishes; `dynamic` collects requests for up to `window_ms` (or `max_batch_size`), then runs them
        as a static batch; `continuous` schedules every step: finished sequences leave, waiting ones join, prefill
        and decode share one forward under `max_batched_tokens`, long prompts are prefilled in chunks.
    kv_budget_bytes / kv_budget_blocks: the KV memory the engine may allocate (one of them). Default: under
        `infergate_bench`, sized from the workload (kv_cache.workload_kv_shape), so the peak memory a test
        reports is its model's and workload's, not a fixed allowance; elsewhere 1 GiB.
    prefix_caching: reuse the KV blocks of prompt prefixes computed before (a shared system prompt, few-shot
        examples, a document asked several questions) instead of computing them again; paged cache with
        continuous or sequential batching. Off by default, so measurements of repeated prompts stay comparable.
    decode_group_size: decoding sequences attended by one attention call per layer, grouped by context length.
        Default (None): 8 on the CPU, where decode attention is bound by reading the cache and padding a group to
        its longest member costs bandwidth; every decoding sequence at once on CUDA, where a small model is bound
        by kernel launches and one call per layer is what the serving engines do. A step replayed from a CUDA graph
        attends all its decoding sequences in one call whatever this is.
    cuda_graphs: replay decode steps from CUDA graphs captured per batch/context bucket (decode_graphs.py).
        Default (None): on for a model on CUDA, where each graph is checked against the eager forward when the
        engine is built (a failed capture or check turns them off, `Engine.cuda_graphs` says why); False: off;
        True on a device other than CUDA is an error.
    """

    cache_mode: str = "paged"
    batching: str = "continuous"
    max_batch_size: int = 32
    max_batched_tokens: int = 2048
    prefill_chunk_size: int = 512
    block_size: int = 16
    kv_budget_bytes: int | None = None
    kv_budget_blocks: int | None = None
    max_model_len: int | None = None  # default: the model's max_position_embeddings, at most 8192
    max_input_tokens: int | None = None  # default: max_model_len - 1
    truncate_input: bool = False  # over-long prompts: reject (default) or keep the last max_input_tokens
    max_new_tokens_limit: int | None = None  # requests asking for more are clamped to this
    max_queue_len: int | None = None  # waiting requests beyond this are rejected ("queue full")
    window_ms: float = 20.0
    length_bucketing: bool = False  # static/dynamic: group requests of similar prompt length
    max_length_spread: int | None = None  # static/dynamic: max prompt-length difference inside one batch
    schedule_by_tokens: bool = False  # static/dynamic: cap a batch by prompt tokens (max_batched_tokens) too
    prefix_caching: bool = False
    record_steps: bool = True
    decode_group_size: int | None = None
    cuda_graphs: bool | None = None
    # set by the bench when it sized kv_budget_blocks from the workload: the budget may then hold less than
    # max_model_len (a request beyond it is rejected saying so); not a user's setting, so not in to_dict()
    kv_sized_for_workload: bool = field(default=False, repr=False)

    def __post_init__(self):
        if self.cache_mode not in CACHE_MODES:
            raise OptionError(f"EngineConfig.cache_mode {self.cache_mode!r}: choose from {', '.join(CACHE_MODES)}")
        if self.batching not in BATCHING_MODES:
            raise OptionError(f"EngineConfig.batching {self.batching!r}: choose from {', '.join(BATCHING_MODES)}")
        for name in ("max_batch_size", "max_batched_tokens", "prefill_chunk_size", "block_size"):
            setattr(self, name, check_int(OptionError, f"EngineConfig.{name}", getattr(self, name), 1,
                                          rule="positive (an int >= 1)"))
        for name in ("kv_budget_bytes", "kv_budget_blocks", "max_model_len", "max_input_tokens",
                     "max_new_tokens_limit", "max_queue_len", "max_length_spread", "decode_group_size"):
            setattr(self, name, check_int(OptionError, f"EngineConfig.{name}", getattr(self, name), 1, optional=True,
                                          rule="positive (an int >= 1) or None"))
        self.window_ms = check_number(OptionError, "EngineConfig.window_ms", self.window_ms, minimum=0)
        for name in ("truncate_input", "length_bucketing", "schedule_by_tokens", "prefix_caching", "record_steps"):
            check_bool(OptionError, f"EngineConfig.{name}", getattr(self, name))
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise OptionError(f"EngineConfig.cuda_graphs must be True, False or None (on with CUDA), got "
                              f"{self.cuda_graphs!r}")
        if self.kv_budget_bytes is not None and self.kv_budget_blocks is not None:
            raise OptionError("EngineConfig: give kv_budget_bytes or kv_budget_blocks, not both")
        if self.prefix_caching and (self.cache_mode != "paged" or self.batching not in ("continuous", "sequential")):
            raise OptionError("EngineConfig.prefix_caching needs cache_mode='paged' and continuous or sequential "
                              f"batching, got cache_mode={self.cache_mode!r}, batching={self.batching!r}")
        if self.batching == "sequential":
            self.max_batch_size = 1

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["kv_sized_for_workload"]
        return data
