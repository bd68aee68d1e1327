"""Chat messages as a base model (a tokenizer without a chat template) reads them: a plain transcript of "User:" and
"Assistant:" turns, and where its answer ends: at the first line that opens another turn, which a base model, knowing
no end of turn, would otherwise go on to write."""

from __future__ import annotations

# each role's label in the transcript (the system message is a plain paragraph)
_SPEAKERS = {"user": "User", "assistant": "Assistant", "system": ""}


def has_chat_template(tokenizer) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def _speaker(role: str) -> str:
    return _SPEAKERS.get(role, role.capitalize())


def plain_text(messages) -> str:
    """Chat messages as a base model reads them: the system message as a plain paragraph, each turn as "User: ..."
    or "Assistant: ...", ending with "Assistant:" for the answer (the same content as the chat prompt, without a
    template the base model never saw)."""
    lines = []
    for message in messages:
        speaker = _speaker(message["role"])
        content = str(message["content"]).strip()
        lines.append(f"{speaker}: {content}" if speaker else content)
    return "\n\n".join(lines + ["Assistant:"])


def next_turn_markers(messages) -> tuple[str, ...]:
    """Where a base model's answer to a plain transcript ends: a line that opens the next turn ("\\nUser:",
    "\\nAssistant:" or another speaker of the transcript). A base model knows no end of turn: left alone it writes the
    user's next question and answers it too."""
    labels = {"User", "Assistant"} | {_speaker(message["role"]) for message in messages}
    return tuple(f"\n{label}:" for label in sorted(labels - {""}))


def answer_end(text: str, markers) -> int | None:
    """Where the answer in `text` ends: before the first of `markers` and the blank lines leading to it; None where
    no marker occurs."""
    found = [index for index in (text.find(marker) for marker in markers) if index >= 0]
    return len(text[:min(found)].rstrip()) if found else None


def answer_tokens(token_ids: list[int], decode, markers) -> int:
    """How many of a base model's generated `token_ids` its answer keeps: the longest prefix whose text (`decode`)
    ends before the first of `markers`; all of them where the text holds none (or there are no markers)."""
    end = answer_end(decode(token_ids), markers) if markers else None
    if end is None:
        return len(token_ids)
    keep = len(token_ids)
    while keep and len(decode(token_ids[:keep])) > end:
        keep -= 1
    return keep


def transcript_stops(tokenizer, messages) -> tuple[str, ...]:
    """The next-turn markers of chat `messages` that reach the model as a plain transcript (a base model:
    request.render_prompt); () where the model has a chat template or there are no messages."""
    if messages is None or has_chat_template(tokenizer):
        return ()
    return next_turn_markers(messages)
