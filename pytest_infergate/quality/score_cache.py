"""The session's memory of alone log-probabilities (light to import: torch only when something is scored)."""

from __future__ import annotations

import weakref

# What a ScoreCache keeps at most: the reference's log-probabilities of the 48 default samples' continuations are
# about 0.3 GiB for a 49k-token vocabulary (tokens x vocabulary x 4 bytes)
SCORE_CACHE_BYTES = 1 << 30


class ScoreCache:
    """Alone log-probabilities of rows, kept per model to be read again: every candidate precision is compared on
    the reference's continuations, so the reference's log-probabilities of them are computed once per session,
    not once per candidate. Up to `max_bytes`; rows past that are scored again when asked."""

    def __init__(self, max_bytes: int = SCORE_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(prompt, cont): log-probs}

    def logprobs(self, model, rows: list[tuple[list[int], list[int]]]) -> list:
        """`score_rows(model, rows)` (alone), from what was kept where it can be."""
        kept = self._kept.setdefault(model, {})
        keys = [(tuple(prompt), tuple(cont)) for prompt, cont in rows]
        missing = [i for i, key in enumerate(keys) if key not in kept]
        from pytest_infergate.quality.scoring import score_rows  # torch: only when something is scored

        scored = dict(zip(missing, score_rows(model, [rows[i] for i in missing])))
        out = []
        for i, key in enumerate(keys):
            if i in scored:
                size = scored[i].numel() * scored[i].element_size()
                if self.bytes + size <= self.max_bytes:
                    kept[key] = scored[i]
                    self.bytes += size
            out.append(scored[i] if i in scored else kept[key])
        return out
