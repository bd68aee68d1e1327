"""Next tokens from logits: greedy rows take the argmax; the others sample with temperature, top-k and top-p from
their own seeded generator. One transformation per function (gpt-fast's logits_to_probs / sample)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytest_infergate.engine.sequence import Sequence
from pytest_infergate.workloads.request import Request


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
