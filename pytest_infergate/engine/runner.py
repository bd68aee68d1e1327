"""From a step's plan to its next tokens, as nano-vllm's model_runner: the KV cache tensors the forward writes to,
sized from the engine's KV budget; the model's inputs, prepared per phase, then one forward runs them all (the only
place that calls the model's forward); and the next tokens from its logits: greedy rows take the argmax, the others
sample with temperature, top-k and top-p from their own seeded generator (gpt-fast's logits_to_probs / sample)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from pytest_infergate.engine.attention import AttentionBatch, DecodeRows, PrefillRows, cache_slots
from pytest_infergate.engine.config import declared_patterns
from pytest_infergate.engine.scheduler import Chunk, StepPlan
from pytest_infergate.engine.sequence import Sequence
from pytest_infergate.workloads.request import Request

CPU_DECODE_GROUP_SIZE = 8  # decoding sequences attended together on the CPU (see EngineConfig.decode_group_size)
DEFAULT_KV_BUDGET_BYTES = 1 << 30


# ---- the KV cache -----------------------------------------------------------------------------------------------
class KVCache:
    """One flat slot tensor per attention layer, `k[layer]: [num_slots, kv_heads, head_dim]`; the block manager maps a
    sequence's token positions to slots. Each layer's geometry is what the model's attention actually hands over (the
    engine's shape probe records it), not what the config claims: GPT-2 and OPT ignore a config's `head_dim`, some
    families give layers different head counts."""

    def __init__(self, geometry: dict[int, tuple[int, int, int]], num_slots: int, dtype: torch.dtype,
                 device: torch.device | str):
        """geometry: layer index -> (kv heads, key head dim, value head dim)."""
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = device
        self.k: list[torch.Tensor | None] = []
        self.v: list[torch.Tensor | None] = []
        for layer, shape in geometry.items():
            self.add_layer(layer, shape)

    def add_layer(self, layer: int, geometry: tuple[int, int, int]) -> None:
        num_kv_heads, head_dim, value_head_dim = geometry
        while len(self.k) <= layer:
            self.k.append(None)
            self.v.append(None)
        self.k[layer] = torch.zeros((self.num_slots, num_kv_heads, head_dim), dtype=self.dtype, device=self.device)
        self.v[layer] = torch.zeros((self.num_slots, num_kv_heads, value_head_dim), dtype=self.dtype,
                                    device=self.device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [T]; k, v: [T, kv_heads, head_dim]."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


def kv_geometry(config) -> tuple[int, int]:
    """(kv heads, head dim) as a config states them (the engine itself uses what its shape probe saw)."""
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return num_kv_heads, head_dim


def kv_bytes_per_token(geometry, dtype: torch.dtype) -> int:
    """Sum over layers of kv_heads x (key + value head dims) x bytes per element. `geometry`: layer index ->
    (kv heads, key head dim, value head dim), or a model config (every layer as the config states it)."""
    if not isinstance(geometry, dict):
        heads, dim = kv_geometry(geometry)
        geometry = dict.fromkeys(range(geometry.num_hidden_layers), (heads, dim, dim))
    element = torch.tensor([], dtype=dtype).element_size()
    return element * sum(heads * (k_dim + v_dim) for heads, k_dim, v_dim in geometry.values())


def workload_kv_shape(token_needs: list[int], config) -> tuple[int, int]:
    """(sequences at once, blocks per sequence) for a known workload (each request's prompt + max_new_tokens): as
    many sequences as the engine runs at once (max_batch_size; one for sequential batching), each as long as the
    longest request, plus one block for a partly filled last block. Every sequence fits at its longest, so the
    scheduler never preempts for want of memory and runs as it would with any larger budget."""
    concurrent = 1 if config.batching == "sequential" else min(config.max_batch_size, max(1, len(token_needs)))
    return concurrent, -(-max(token_needs, default=1) // config.block_size) + 1


def num_blocks_for(config, bytes_per_token: int) -> int:
    """How many KV blocks the engine config's budget buys."""
    if config.kv_budget_blocks is not None:
        return config.kv_budget_blocks
    budget = config.kv_budget_bytes or DEFAULT_KV_BUDGET_BYTES
    return budget // (bytes_per_token * config.block_size)


# ---- inputs and the forward -------------------------------------------------------------------------------------
@dataclass
class ForwardInputs:
    """One forward's flattened tokens, what attention needs to know about them, and where to read logits."""

    batch: AttentionBatch
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sample_at: list[int] = field(default_factory=list)  # token index of each sampling chunk's last token
    slot_parts: list[torch.Tensor] = field(default_factory=list)  # cache slots of the real tokens, in order (host)


class ModelRunner:
    def __init__(self, model, cache, block_size: int, device: torch.device, pad_token_id: int,
                 decode_group_size: int | None = None):
        self.model = model
        self.cache = cache  # KVCache, or None (cache_mode 'none'; the shape probe)
        self.block_size = block_size
        self.device = device
        self.pad_token_id = pad_token_id
        self.is_cuda = device.type == "cuda"
        # None on CUDA: all decoding sequences in one group, one attention call per layer
        self.decode_group_size = decode_group_size or (None if self.is_cuda else CPU_DECODE_GROUP_SIZE)
        self.graphs = None  # DecodeGraphs once the engine captured and checked them
        self.chunk_sizes = declared_patterns(model.config).chunks  # chunked layers: their mask is the config's
        # the device's time in this runner's forwards so far, by CUDA events (None off CUDA): what the gate compares
        # on a busy runner, since CPU co-tenants slow the host's launches, not the kernels (perf.local_bench)
        self.device_s: float | None = 0.0 if self.is_cuda else None
        self.last_device_s: float | None = None  # the last forward's

    def _block_tables(self, seqs: list[Sequence], num_tokens: int) -> torch.Tensor:
        """[len(seqs), blocks covering num_tokens] block ids (short tables padded with block 0)."""
        width = -(-num_tokens // self.block_size)
        return torch.tensor([(s.block_table + [0] * width)[:width] for s in seqs], dtype=torch.long)

    # ---- inputs, per phase ------------------------------------------------------------------------------------
    def prepare_decode(self, decodes: list[Chunk], inputs: ForwardInputs) -> None:
        """One token per decoding sequence, in groups of similar context length (sampling follows plan order)."""
        decodes.sort(key=lambda c: c.seq.num_computed_tokens)
        for chunk in decodes:
            inputs.input_ids.append(chunk.seq.all_token_ids[-1])
            inputs.positions.append(chunk.seq.num_computed_tokens)
            inputs.sample_at.append(len(inputs.input_ids) - 1)
        size = self.decode_group_size or max(len(decodes), 1)
        for first in range(0, len(decodes), size):
            seqs = [c.seq for c in decodes[first:first + size]]
            lengths = torch.tensor([s.num_computed_tokens + 1 for s in seqs])  # the new token included
            tables = self._block_tables(seqs, int(lengths.max()))
            new_token = (lengths - 1).unsqueeze(1)
            inputs.slot_parts.append(cache_slots(tables, new_token, self.block_size).squeeze(1))
            inputs.batch.decode_rows.append(DecodeRows(first, tables, lengths))
            inputs.batch.max_context = max(inputs.batch.max_context, int(lengths.max()))

    def prepare_prefill(self, prefills: list[Chunk], inputs: ForwardInputs) -> None:
        """The next chunk of each prefilling sequence, after what is cached already."""
        for chunk in prefills:
            seq, start, n = chunk.seq, chunk.seq.num_computed_tokens, chunk.num_tokens
            table = None
            if self.cache is not None:
                table = self._block_tables([seq], start + n)
                positions = torch.arange(start, start + n).unsqueeze(0)
                inputs.slot_parts.append(cache_slots(table, positions, self.block_size)[0])
                table = table[0]
            inputs.batch.prefill_rows.append(PrefillRows(len(inputs.input_ids), n, start, table))
            inputs.batch.max_context = max(inputs.batch.max_context, start + n)
            inputs.input_ids.extend(seq.all_token_ids[start:start + n])
            inputs.positions.extend(range(start, start + n))
            if chunk.samples:
                inputs.sample_at.append(len(inputs.input_ids) - 1)

    def prepare_padding(self, num_padding: int, inputs: ForwardInputs) -> None:
        """Static batching's wasted rows, as tokens the forward computes and nothing reads."""
        if num_padding:
            inputs.batch.num_padding = num_padding
            inputs.input_ids.extend([self.pad_token_id] * num_padding)
            inputs.positions.extend(range(num_padding))

    def prepare(self, plan: StepPlan, observer=None) -> ForwardInputs:
        inputs = ForwardInputs(AttentionBatch(self.cache, self.block_size, self.device, observer=observer,
                                              chunk_sizes=self.chunk_sizes))
        self.prepare_decode(plan.decodes, inputs)
        self.prepare_prefill(plan.prefills, inputs)
        inputs.batch.num_real_tokens = len(inputs.input_ids)
        self.prepare_padding(plan.num_padding, inputs)
        if self.cache is not None and inputs.slot_parts:
            inputs.batch.slot_mapping = torch.cat(inputs.slot_parts)  # on the host: a CUDA graph copies it itself
        return inputs

    # ---- the forward -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run_model(self, inputs: ForwardInputs, all_logits: bool = False,
                  logit_rows: list[int] | None = None) -> tuple[torch.Tensor, float]:
        """The forward's logits at the sampling positions; with `all_logits` at every token, with `logit_rows` at
        those token indices (the self-check's probe), and its wall time in seconds."""
        ids = torch.tensor([inputs.input_ids], dtype=torch.long, device=self.device)
        pos = torch.tensor([inputs.positions], dtype=torch.long, device=self.device)
        rows = logit_rows if logit_rows is not None else None if all_logits else inputs.sample_at
        keep = 0 if rows is None else torch.tensor(rows, dtype=torch.long, device=self.device)
        if inputs.batch.slot_mapping is not None:
            inputs.batch.slot_mapping = inputs.batch.slot_mapping.to(self.device)
        start = time.perf_counter()
        with self._device_timer():
            out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep,
                             infergate_batch=inputs.batch)
            logits = out.logits[0].float()
        return logits, time.perf_counter() - start

    def forward(self, plan: StepPlan) -> tuple[torch.Tensor, float]:
        """Logits [num sampling chunks, vocab] (float32) in plan order, and the forward's wall time in seconds."""
        inputs = self.prepare(plan)
        if self.graphs is None or not self.graphs.can_run(inputs):
            return self.run_model(inputs)
        start = time.perf_counter()
        with self._device_timer():
            logits = self.graphs.run(inputs)
        return logits, time.perf_counter() - start

    @contextmanager
    def _device_timer(self) -> Iterator[None]:
        """On CUDA: waits for the forward's kernels (its wall time then covers them) and adds the device's time
        between two CUDA events around them to `device_s`. A CUDA graph's replay is one launch, so its span is the
        kernels' own time; an eager forward's span also holds the gaps while the host launches kernels."""
        if not self.is_cuda:
            yield
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        torch.cuda.synchronize(self.device)
        self.last_device_s = begin.elapsed_time(end) / 1000.0
        self.device_s += self.last_device_s


# ---- sampling the next tokens -----------------------------------------------------------------------------------
@dataclass
class SamplingFailure:
    """A row whose sampling failed; its request ends as `failed` with this reason (the others go on)."""

    reason: str


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """logits: [vocab] -> probabilities after temperature and top-k."""
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


def keep_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose probability reaches top_p."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    drop = sorted_probs.cumsum(0) - sorted_probs > top_p
    return torch.zeros_like(probs).scatter_(0, order, sorted_probs.masked_fill(drop, 0))


def generator_for(seq: Sequence, device: torch.device) -> torch.Generator:
    """The sequence's own generator: seeded from the request's seed (or its id), so a seed reproduces a sample."""
    if seq.generator is None:
        seq.generator = torch.Generator(device=device)
        seq.generator.manual_seed(seq.request.seed if seq.request.seed is not None else seq.seq_id)
    return seq.generator


def sample_row(logits: torch.Tensor, request: Request, generator: torch.Generator) -> int:
    probs = keep_top_p(logits_to_probs(logits, request.temperature, request.top_k), request.top_p)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        raise ValueError("the model's logits are not finite (nan/inf), so there is no distribution to sample from")
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int | SamplingFailure]:
    """logits: [len(seqs), vocab] -> one token (or the reason sampling failed) per sequence."""
    tokens: list[int | SamplingFailure] = [0] * len(seqs)
    greedy = [i for i, seq in enumerate(seqs) if seq.request.is_greedy]
    if greedy:
        for i, token in zip(greedy, logits[greedy].argmax(dim=-1).tolist()):
            tokens[i] = token
    for i, seq in enumerate(seqs):
        if seq.request.is_greedy:
            continue
        try:
            tokens[i] = sample_row(logits[i], seq.request, generator_for(seq, logits.device))
        except (RuntimeError, ValueError) as exc:
            tokens[i] = SamplingFailure(f"sampling failed: {exc}")
    return tokens


def record_top_logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int | SamplingFailure]) -> None:
    """Append to each sequence that asks (Request.top_logprobs) the log-probabilities of its most likely next tokens
    under this step's logits: the distribution the token was drawn from, in the batch it was computed in (a golden
    gate reads the margin of a changed token from it). One device->host copy for all rows that ask."""
    rows = [i for i, seq in enumerate(seqs)
            if seq.request.top_logprobs and not isinstance(tokens[i], SamplingFailure)]
    if not rows:
        return
    k = min(max(seqs[i].request.top_logprobs for i in rows), logits.shape[-1])
    top = torch.log_softmax(logits[rows].float(), dim=-1).topk(k, dim=-1)
    for i, ids, values in zip(rows, top.indices.tolist(), top.values.tolist()):
        n = seqs[i].request.top_logprobs
        seqs[i].output_top_logprobs.append((ids[:n], values[:n]))
