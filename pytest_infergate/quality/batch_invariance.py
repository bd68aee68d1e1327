"""What check_batch_invariance() measured, as recorded: per variant of the batch a precision's samples ran in (alone,
the fixed composition, rotated), the samples whose greedy tokens changed, where, by what margin, and the KL between
the variants (quality.golden_generation.check_variants measures them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Divergence:
    id: str
    token: int  # index of the first differing token
    margin: float | None  # log p(alone's token) - log p(variant's token) there, teacher-forced alone; nats
    alone_text: str
    variant_text: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Divergence:
        return cls(data["id"], int(data["token"]), data.get("margin"), data.get("alone_text", ""),
                   data.get("variant_text", ""))


@dataclass
class VariantResult:
    name: str  # batch / rotated
    description: str
    changed: list[Divergence]
    samples: int
    mean_kl: float | None = None  # KL(alone || in this variant's batches), mean over tokens
    max_kl: float | None = None  # the largest per-sample mean
    generation_s: float = 0.0  # 0 when reused from the cache

    @property
    def share(self) -> float:
        return len(self.changed) / self.samples if self.samples else 0.0

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "samples": self.samples, "share": self.share,
                "mean_kl": self.mean_kl, "max_kl": self.max_kl, "generation_s": self.generation_s,
                "changed": [d.to_dict() for d in self.changed]}

    @classmethod
    def from_dict(cls, data: dict) -> VariantResult:
        return cls(data["name"], data.get("description", ""),
                   [Divergence.from_dict(d) for d in data.get("changed", [])], int(data.get("samples", 0)),
                   data.get("mean_kl"), data.get("max_kl"),
                   float(data.get("generation_s", 0.0)))


@dataclass
class BatchInvariance:
    precision: str
    samples: list[str]  # ids, in the order asked
    variants: list[VariantResult]
    seconds: float = 0.0  # wall, everything included
    cpu_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    max_new_tokens: int | None = None  # each sample compared on its first this many tokens (None: all of them)

    @property
    def variant_ids(self) -> list[str]:
        """Samples whose greedy tokens change with the batch in at least one variant."""
        changed = {d.id for v in self.variants for d in v.changed}
        return [s for s in self.samples if s in changed]

    @property
    def variant_share(self) -> float:
        return len(self.variant_ids) / len(self.samples) if self.samples else 0.0

    def example(self) -> Divergence | None:
        """The changed sample to show: the first one, in the variant that changed most."""
        worst = max(self.variants, key=lambda v: len(v.changed), default=None)
        return worst.changed[0] if worst and worst.changed else None

    def to_dict(self) -> dict:
        return {"precision": self.precision, "samples": self.samples, "variant_share": self.variant_share,
                "variant_ids": self.variant_ids, "variants": [v.to_dict() for v in self.variants],
                "seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "notes": self.notes,
                "max_new_tokens": self.max_new_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> BatchInvariance:
        return cls(data["precision"], list(data.get("samples", [])),
                   [VariantResult.from_dict(v) for v in data.get("variants", [])], float(data.get("seconds", 0.0)),
                   float(data.get("cpu_seconds", 0.0)), list(data.get("notes", [])), data.get("max_new_tokens"))
