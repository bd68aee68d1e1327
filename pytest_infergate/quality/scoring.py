"""Teacher-forced scoring: the log-probabilities a model gives a fixed continuation, and the KL / top-1 / NLL
comparisons built on them. Both sides of a comparison see the same tokens, so the figures measure the models, not
where their greedy paths happened to part.

Golden scoring is always ALONE, one row per forward: a row's log-probabilities in a padded batch depend on the other
rows (int8's outlier columns, the GEMM's row count), so accepted log-probabilities are recorded and checked with the
same computation, whatever the batch neighbours."""

from __future__ import annotations

import torch

from pytest_infergate.quality.metrics import TokenStats

TOP_K = 10


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


@torch.inference_mode()
def continuation_logprobs(model, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """log-softmax [len(continuation), vocab] (float32) predicting each continuation token, for each row."""
    device = next(model.parameters()).device
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (prompt, cont) in enumerate(rows):
        seq = prompt + cont
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    out = []
    for i, (prompt, cont) in enumerate(rows):
        start = len(prompt) - 1
        out.append(torch.log_softmax(logits[i, start:start + len(cont)].float(), dim=-1).cpu())
    return out


def score_rows(model, rows: list[tuple[list[int], list[int]]], batch_size: int = 1) -> list[torch.Tensor]:
    """`continuation_logprobs` of each row, `batch_size` rows per forward (1: alone, the golden scoring)."""
    return [lp for batch in _batches(rows, batch_size) for lp in continuation_logprobs(model, batch)]


def teacher_forced(reference_model, candidate_model, rows: list[tuple[list[int], list[int]]],
                   batch_size: int = 1, reference_scores=None
                   ) -> tuple[list[TokenStats], list[list[list[list[float]]]]]:
    """Score the reference continuations under both models, `batch_size` rows per forward (1: alone). Returns
    per-row TokenStats and the reference's top-k log-probabilities per token (what golden files store).
    `reference_scores`: where the reference's alone log-probabilities are kept between calls (a
    golden_comparison.ScoreCache, not imported here: it imports this module's scorer when it scores)."""
    stats, topks = [], []
    for batch in _batches(rows, batch_size):
        if reference_scores is not None and batch_size == 1:
            ref_lp = reference_scores.logprobs(reference_model, batch)
        else:
            ref_lp = continuation_logprobs(reference_model, batch)
        cand_lp = ref_lp if candidate_model is reference_model else continuation_logprobs(candidate_model, batch)
        for (_, cont), ref, cand in zip(batch, ref_lp, cand_lp):
            stats.append(token_stats(ref, cand, cont))
            topks.append(top_logprobs(ref) if cont else [])
    return stats, topks


def token_stats(ref: torch.Tensor, cand: torch.Tensor, continuation: list[int]) -> TokenStats:
    """KL(ref || cand), top-1 agreement and both NLLs of `continuation`, per token."""
    s = TokenStats()
    if continuation:
        target = torch.tensor(continuation)
        s.kl = (ref.exp() * (ref - cand)).sum(-1).clamp_min(0).tolist()
        s.top1_agree = (ref.argmax(-1) == cand.argmax(-1)).tolist()
        s.ref_nll = (-ref.gather(1, target[:, None])[:, 0]).tolist()
        s.cand_nll = (-cand.gather(1, target[:, None])[:, 0]).tolist()
    return s


def top_logprobs(logprobs: torch.Tensor, k: int = TOP_K) -> list[list[list[float]]]:
    """Per token, [[token id, log-prob], ...] of the k most likely tokens (what accepted files store, 6 decimals)."""
    values, indices = logprobs.topk(k, dim=-1)
    return [[[int(t), round(float(v), 6)] for t, v in zip(ti, tv)] for ti, tv in zip(indices.tolist(),
                                                                                     values.tolist())]


def topk_kl(stored: list[list[list[float]]], candidate: torch.Tensor) -> list[float]:
    """KL(stored || candidate) per token from the stored top-k, with the rest of the mass as one bucket."""
    out = []
    for row, cand in zip(stored, candidate):
        ids = torch.tensor([int(t) for t, _ in row])
        p = torch.tensor([v for _, v in row]).exp()
        q = cand[ids].exp()
        p_tail, q_tail = (1 - p.sum()).clamp_min(1e-12), (1 - q.sum()).clamp_min(1e-12)
        kl = float((p * (p.log() - q.clamp_min(1e-12).log())).sum() + p_tail * (p_tail.log() - q_tail.log()))
        out.append(max(0.0, kl))
    return out
