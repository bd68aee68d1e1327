"""Real traffic from files: a JSONL (or JSON array) of records read into requests for the reference engine and
endpoints alike; a bad file is an error naming the file, the line and the fix. A record is {"prompt": ...},
{"messages": [{"role": ..., "content": ...}, ...]} or ShareGPT's {"conversations": [{"from": "human", "value": ...},
...]}, each optionally with "id", "timestamp" (seconds: its arrival in a replay), "max_tokens" (or "max_new_tokens",
"output_len", "output_tokens"), "ignore_eos" (exactly max_tokens tokens) and "extra_body" (more fields for a served
model's JSON body). A conversation with several user turns is a multi-turn `Session`: each turn is sent with the
conversation so far, the answers the server (or engine) actually gave; `run_sessions` runs such traffic on the
engine. Guide: docs/guides/endpoint.md, 'Real traffic'.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_infergate.errors import InfergateError
from pytest_infergate.workloads.request import Request

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
                  "bing": "assistant", "assistant": "assistant", "system": "system"}
MAX_TOKEN_KEYS = ("max_tokens", "max_new_tokens", "output_len", "output_tokens")
KNOWN_KEYS = {"id", "timestamp", "prompt", "messages", "conversations", "ignore_eos", "extra_body", *MAX_TOKEN_KEYS}


class WorkloadError(InfergateError):
    """A workload file that cannot be read as traffic; the message names the file, the line and the fix."""


@dataclass
class Turn:
    content: str  # what the user says in this turn
    max_new_tokens: int = 64
    recorded_answer: str | None = None  # the answer the file holds (never sent: the live answer is)


@dataclass
class Session:
    """A multi-turn conversation. Turn k is sent as: system prompt, turns 0..k-1 each with the answer actually
    given to it, then turn k's user message; `think_time_s` passes between an answer and the next turn."""

    turns: list[Turn]
    system: str | None = None
    session_id: str = ""
    arrival_s: float = 0.0
    think_time_s: float = 0.0
    source: str = ""  # file:line it came from
    metadata: dict = field(default_factory=dict)
    ignore_eos: bool = False  # every turn answers exactly its max_new_tokens
    extra_body: dict = field(default_factory=dict)  # sent with every turn to a served model

    def turn_id(self, index: int) -> str:
        return f"{self.session_id}-t{index}"

    def messages(self, index: int, answers: list[str]) -> list[dict[str, str]]:
        """The chat messages of turn `index`, given the answers to the turns before it."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for turn, answer in zip(self.turns[:index], answers):
            out += [{"role": "user", "content": turn.content}, {"role": "assistant", "content": answer}]
        return out + [{"role": "user", "content": self.turns[index].content}]

    def request(self, index: int, answers: list[str]) -> Request:
        """Turn `index` as the reference engine's Request (greedy)."""
        return Request(messages=self.messages(index, answers), max_new_tokens=self.turns[index].max_new_tokens,
                       request_id=self.turn_id(index), ignore_eos=self.ignore_eos, extra_body=dict(self.extra_body))


def from_file(path, *, max_new_tokens: int = 64, multi_turn: bool = True, replay: bool = True,
              time_scale: float = 1.0, think_time_s: float = 0.0, limit: int | None = None) -> list:
    """Read a traffic file into `Request`s and `Session`s (in file order; see the module docstring for the
    formats). `multi_turn`: a conversation with several user turns becomes a Session (False: a ShareGPT
    conversation sends only its first user turn, as `vllm bench serve` samples ShareGPT, and "messages" are sent
    as written, a fixed history). `replay`: records' "timestamp"s become arrival
    offsets (times `time_scale`; 0.5 replays twice as fast), replayed with the load pattern {"replay": True}.
    `max_new_tokens` applies where a record names no limit of its own."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"workload file {path} does not exist; give the path of a JSONL file of prompts, chat "
                            "messages or ShareGPT conversations")
    if not time_scale > 0:
        raise WorkloadError(f"time_scale={time_scale!r} must be positive (1 replays the timestamps as recorded)")
    items = []
    stamps = []
    seen: dict[str, str] = {}
    for where, record in _records(path):
        if limit is not None and len(items) >= limit:
            break
        item = _item(record, where, len(items), max_new_tokens, multi_turn, think_time_s)
        ident = item.session_id if isinstance(item, Session) else item.request_id
        if ident in seen:
            raise WorkloadError(f"{where}: id {ident!r} is already used at {seen[ident]}; give every record its own "
                                "id (or none)")
        seen[ident] = where
        stamps.append(_timestamp(record, where))
        items.append(item)
    if not items:
        raise WorkloadError(f"workload file {path} holds no records; write one JSON object per line")
    given = [s is not None for s in stamps]
    if replay and any(given):
        if not all(given):
            first_missing = next(i for i, g in enumerate(given) if not g)
            raise WorkloadError(f"{path}: record {first_missing + 1} has no \"timestamp\" but others do; give every "
                                "record one, or none, or read the file with replay=False")
        start = min(stamps)
        for item, stamp in zip(items, stamps):
            item.arrival_s = (stamp - start) * time_scale
    return items


def _records(path: Path):
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise WorkloadError(f"workload file {path} line {line} is not UTF-8 text: a workload is UTF-8 JSON Lines "
                            "(one record per line) or one JSON array") from None
    if text.lstrip().startswith("["):  # a JSON array, as ShareGPT's own files are
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); a .json workload is one array "
                                "of records, a .jsonl one record per line") from None
        for index, record in enumerate(records, 1):
            yield f"{path} record {index}", record
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno}); write one JSON "
                                "object per line") from None
        yield f"{path}:{number}", record


def _timestamp(record: dict, where: str) -> float | None:
    stamp = record.get("timestamp")
    if stamp is None:
        return None
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
        raise WorkloadError(f"{where}: \"timestamp\" {stamp!r} must be a non-negative number of seconds")
    return float(stamp)


def _max_tokens(record: dict, where: str, default: int) -> int:
    for key in MAX_TOKEN_KEYS:
        if key in record:
            value = record[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"{where}: \"{key}\" {value!r} must be a positive integer (tokens to generate)")
            return value
    return default


def _item(record, where: str, index: int, max_new_tokens: int, multi_turn: bool, think_time_s: float):
    item = _parse(record, where, index, max_new_tokens, multi_turn, think_time_s)
    ignore_eos, extra_body = record.get("ignore_eos", False), record.get("extra_body", {})
    if not isinstance(ignore_eos, bool):
        raise WorkloadError(f"{where}: \"ignore_eos\" {ignore_eos!r} must be true or false")
    if not isinstance(extra_body, dict):
        raise WorkloadError(f"{where}: \"extra_body\" must be a JSON object of fields for the server "
                            f"(e.g. {{\"min_tokens\": 16}}), got {json.dumps(extra_body)[:60]}")
    if isinstance(item, Session):
        item.ignore_eos, item.extra_body = ignore_eos, dict(extra_body)
        return item
    return replace(item, ignore_eos=ignore_eos, extra_body=dict(extra_body))


def _parse(record, where: str, index: int, max_new_tokens: int, multi_turn: bool, think_time_s: float):
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    kinds = [key for key in ("prompt", "messages", "conversations") if key in record]
    if len(kinds) != 1:
        unknown = sorted(set(record) - KNOWN_KEYS)
        hint = f" (unknown keys: {', '.join(unknown)})" if unknown else ""
        raise WorkloadError(f"{where}: a record needs exactly one of \"prompt\", \"messages\" or \"conversations\", "
                            f"got {', '.join(kinds) or 'none'}{hint}")
    ident = str(record.get("id", f"f{index}"))
    limit = _max_tokens(record, where, max_new_tokens)
    if kinds[0] == "prompt":
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise WorkloadError(f"{where}: \"prompt\" must be a non-empty string")
        return Request(prompt=record["prompt"], max_new_tokens=limit, request_id=ident)
    if kinds[0] == "messages":
        messages = [_message(m, where, "role", "content", None) for m in _list(record, "messages", where)]
        if multi_turn:
            return _conversation(messages, where, ident, limit, True, think_time_s)
        _conversation(messages, where, ident, limit, False, think_time_s)  # the same checks
        while messages[-1]["role"] == "assistant":  # the history as written, up to the last user message
            messages = messages[:-1]
        return Request(messages=messages, max_new_tokens=limit, request_id=ident)
    else:
        messages = [_message(m, where, "from", "value", SHAREGPT_ROLES) for m in _list(record, "conversations", where)]
    return _conversation(messages, where, ident, limit, multi_turn, think_time_s)


def _list(record: dict, key: str, where: str) -> list:
    value = record[key]
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{where}: \"{key}\" must be a non-empty list of messages")
    return value


def _message(message, where: str, role_key: str, text_key: str, roles: dict | None) -> dict[str, str]:
    allowed = roles or {"system": "system", "user": "user", "assistant": "assistant"}
    if not isinstance(message, dict) or not isinstance(message.get(text_key), str):
        raise WorkloadError(f"{where}: every message needs \"{role_key}\" and a string \"{text_key}\", got "
                            f"{json.dumps(message)[:80]}")
    role = message.get(role_key)
    if role not in allowed:
        raise WorkloadError(f"{where}: message {role_key} {role!r} is not one of {', '.join(sorted(allowed))}")
    return {"role": allowed[role], "content": message[text_key]}


def _conversation(messages: list[dict[str, str]], where: str, ident: str, limit: int, multi_turn: bool,
                  think_time_s: float):
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    rest = messages[1:] if system is not None else messages
    turns: list[Turn] = []
    for message in rest:
        if message["role"] == "system":
            raise WorkloadError(f"{where}: a system message may only come first")
        if message["role"] == "user":
            turns.append(Turn(message["content"], limit))
        elif not turns:
            raise WorkloadError(f"{where}: the conversation starts with an answer; its first message (after an "
                                "optional system one) must be the user's")
        else:
            turns[-1].recorded_answer = message["content"]
    if not turns:
        raise WorkloadError(f"{where}: the conversation has no user message")
    if multi_turn and len(turns) > 1:
        return Session(turns, system, ident, think_time_s=think_time_s, source=where)
    first = [{"role": "user", "content": turns[0].content}]
    return Request(messages=([{"role": "system", "content": system}] if system else []) + first,
                   max_new_tokens=limit, request_id=ident)


def run_sessions(engine, items: list) -> list[list]:
    """Run multi-turn Sessions (and plain Requests, as one-turn items) on the reference engine, every session's
    turns one after another with the engine's actual answers appended, the sessions side by side (each starts at
    its `arrival_s`). Returns each item's Results in turn order; a session stops at a turn that did not end
    normally (rejected, timed out). With `EngineConfig(prefix_caching=True)` a later turn reuses the blocks of
    the conversation so far: `Result.num_cached_tokens` shows how much."""
    results: list[list] = [[] for _ in items]
    answers: list[list[str]] = [[] for _ in items]
    pending: dict[str, int] = {}  # request id -> item index
    start = engine.now()

    def turns(index: int) -> int:
        return len(items[index].turns) if isinstance(items[index], Session) else 1

    def submit(index: int) -> None:
        item, turn = items[index], len(results[index])
        if isinstance(item, Session):
            request = item.request(turn, answers[index])
            request_id = item.turn_id(turn) if item.session_id else f"s{index}-t{turn}"
        else:
            request, request_id = item, item.request_id or f"r{index}"
        request = replace(request, request_id=request_id, metadata=dict(request.metadata))
        arrival = start + item.arrival_s if turn == 0 else None  # a later turn arrives when its answer came
        request_id = engine.submit(request, arrival=arrival)
        pending[request_id] = index
        if engine.result(request_id) is not None:  # rejected on submission (queue full, prompt too long)
            finish(request_id)

    def finish(request_id: str) -> None:
        index = pending.pop(request_id)
        result = engine.result(request_id)
        results[index].append(result)
        answers[index].append(result.text)
        if result.ok and len(results[index]) < turns(index):
            submit(index)

    waiting = sorted(range(len(items)), key=lambda i: items[i].arrival_s)
    while waiting or pending:
        while waiting and start + items[waiting[0]].arrival_s <= engine.now():
            submit(waiting.pop(0))
        if not pending:
            time.sleep(max(0.0, start + items[waiting[0]].arrival_s - engine.now()))
            continue
        ended = engine.step(more_arrivals=bool(waiting))
        for request_id in ended:
            finish(request_id)
        if not ended and not engine.scheduler.running:
            time.sleep(0.001)  # a static / dynamic batch is still forming
    return results
