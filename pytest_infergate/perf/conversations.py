"""Workloads of multi-turn sessions on the reference engine, and what the prefix cache saved on them.

A `Session` (workloads/traffic.py) sends turn k only once turn k-1 has been answered, with the conversation so far
(the chat template over the earlier user turns and the answers the engine actually gave) as its prompt; with
`EngineConfig(prefix_caching=True)` turn k reuses the K/V blocks of that conversation. `PrefixCacheUse` counts
what was reused, from each request's `Result.num_cached_tokens`, for plain requests and sessions alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pytest_infergate.engine.sequence import Result
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.request import Request
from pytest_infergate.workloads.traffic import Session

PREFIX_CACHE_KEY = "prefix_cache"  # where a Measurement's engine dict keeps the PrefixCacheUse of its last repetition


@dataclass
class PrefixCacheUse:
    """Prompt tokens served from the prefix cache instead of computed, over one repetition's requests."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    requests_with_hits: int
    sessions: int = 0  # multi-turn sessions in the workload (0: independent requests)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @classmethod
    def of(cls, results: list[Result], sessions: int = 0) -> PrefixCacheUse:
        return cls(len(results), sum(len(r.prompt_token_ids) for r in results),
                   sum(r.num_cached_tokens for r in results), sum(1 for r in results if r.num_cached_tokens),
                   sessions)

    def describe(self) -> str:
        where = f" over {self.sessions} multi-turn sessions" if self.sessions else ""
        return (f"prefix cache: {self.cached_tokens:,} of {self.prompt_tokens:,} prompt tokens reused "
                f"({self.hit_rate:.0%}), {self.requests_with_hits} of {self.requests} requests hit{where}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PrefixCacheUse:
        return cls(**{k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__})


def prefix_cache_use(engine_figures: dict) -> PrefixCacheUse | None:
    """The PrefixCacheUse a Measurement's `engine` dict holds, if its workload ran on the reference engine."""
    data = engine_figures.get(PREFIX_CACHE_KEY)
    return PrefixCacheUse.from_dict(data) if isinstance(data, dict) else None


def count_sessions(items: list) -> int:
    return sum(1 for item in items if isinstance(item, Session))


def planned_requests(items: list) -> int:
    """Requests the workload sends when every turn is answered: one per request, one per session turn."""
    return sum(len(item.turns) if isinstance(item, Session) else 1 for item in items)


def first_turn(item: Request | Session) -> Request:
    """A request on its own, or a session's first turn (no answers yet) as a request."""
    return item.request(0, []) if isinstance(item, Session) else item


def fresh_items(items: list, run: int) -> list:
    """Copies for one run on an engine that remembers every request id: requests lose theirs (the engine names
    them), sessions get `<id>.<run>` (their turns are named after the session, see Session.turn_id)."""
    out = []
    for index, item in enumerate(items):
        if isinstance(item, Session):
            out.append(replace(item, session_id=f"{item.session_id or f's{index}'}.{run}",
                               metadata=dict(item.metadata)))
        else:
            out.append(replace(item, request_id=None, metadata=dict(item.metadata)))
    return out


def run_items(engine, items: list) -> list[Result]:
    """Run requests (all at once, as their `arrival_s` say) or, when the workload holds sessions, sessions turn
    by turn (workloads.run_sessions); the results of every request that ran, in item and turn order."""
    if not count_sessions(items):
        return engine.generate(items)
    if not hasattr(engine, "submit"):
        raise OptionError(f"multi-turn sessions need the reference engine, which submits each turn when the one "
                          f"before it is answered; the {getattr(engine, 'name', 'selected')} backend runs fixed "
                          "batches: measure them with the engine, or send the sessions' first turns as requests")
    from pytest_infergate.workloads import run_sessions

    return [result for item_results in run_sessions(engine, items) for result in item_results]
