"""The stand-in held to the real engine: the same requests to both, the answers compared as the
protocol sees them.

An answer is reduced to its protocol: the status; for an error, its type, code, param and
message; for a JSON answer, the paths of its keys; for a stream, each choice's chunk sequence
(role, content, reasoning, tool-call and text deltas, the finish chunk; runs of one kind count
once), the usage chunk, `[DONE]`, and the keys the chunks of each kind carry. Any difference
between the two reductions is a stand-in defect, except the ones in ALLOWED: what a random
model with a byte-level tokenizer must do differently from the simulated trained model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

# The differences a random model must make, by name: each says why, and what `differences`
# compares in its place. tests/lab/README.md lists them.
ALLOWED = {
    "token counts": (
        "the lab's checkpoint reads bytes, one token each; the stand-in counts tokens as Qwen's "
        "tokenizer would. Compared instead: the usage keys, total = prompt + completion, and "
        "each error message with its token counts taken out."),
    "what the model writes": (
        "the real engine's model has random weights and never samples a special token: it "
        "never writes <think>, so what a trained model writes as reasoning it writes as "
        "content; it calls a tool only when guided decoding makes it (tool_choice required or "
        "named); it never ends its text, so it stops at max_tokens. Compared instead: the chunk "
        "sequence with reasoning and content taken as one kind, text, and kept up to the first "
        "delta the model chose (role, then text or tool calls), the finish chunk and what "
        "follows it, and the keys of every kind of chunk and message both answers have. Deltas "
        "with nothing in them are left out: the byte-level detokenizer sends them while it "
        "holds back an incomplete character."),
    "server text": (
        "/metrics and other plain-text answers list what each server measures. Compared "
        "instead: status and Content-Type."),
}
# Token counts in vLLM's messages: "your request has 21 input tokens (256000 > 256000 - 21)".
TOKEN_COUNT = re.compile(r"(has |- )\d+( input tokens|\))")
# Where a random model's choice shows in a JSON answer's key paths: the tool calls it made.
CHOSEN_PATHS = re.compile(r"^\.choices\[\]\.message\.tool_calls\[\]")
DELTA_KINDS = (("role", "role"), ("reasoning_content", "reasoning"), ("tool_calls", "tool_call"),
               ("content", "content"))
# What the model writes, as up_to_the_model compares it: reasoning or content, as text.
WRITTEN = {"content": "text", "reasoning": "text", "text": "text", "tool_call": "tool_call"}


@dataclass
class Protocol:
    """What of one answer the protocol fixes."""

    status: int | None
    content_type: str
    error: tuple | None = None
    keys: frozenset = frozenset()
    chunks: dict = field(default_factory=dict)  # choice index -> collapsed kinds
    chunk_keys: dict = field(default_factory=dict)  # kind -> key paths of its choices
    event_keys: frozenset = frozenset()
    usage: tuple | None = None  # (keys, total adds up)
    usage_chunks: int = 0  # a stream's chunks that carry usage and no choice
    done: bool | None = None


def key_paths(value, prefix="") -> set[str]:
    paths = set()
    if isinstance(value, dict):
        for key, item in value.items():
            paths.add(f"{prefix}.{key}")
            paths |= key_paths(item, f"{prefix}.{key}")
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


def usage_of(usage) -> tuple | None:
    if not isinstance(usage, dict):
        return None
    adds_up = usage.get("total_tokens") == (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
    return tuple(sorted(usage)), adds_up


def error_of(body) -> tuple | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    message = TOKEN_COUNT.sub(r"\1N\2", str(error.get("message")))
    return error.get("type"), error.get("code"), error.get("param"), message


def stream_events(text: str) -> tuple[list, bool]:
    """The JSON of each `data:` event and whether `[DONE]` ended them."""
    events, done = [], False
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            done = True
        else:
            events.append(json.loads(data))
    return events, done


def delta_kind(choice: dict) -> str:
    """What a chunk's choice carries: a role, content, reasoning, tool calls, text, or nothing."""
    if choice.get("text"):
        return "text"
    delta = choice.get("delta") or {}
    for key, kind in DELTA_KINDS:
        if delta.get(key):
            return kind
    return "empty"


def choice_kinds(choice: dict) -> list[str]:
    """The kinds of one chunk's choice in order: a finish chunk may carry the last delta."""
    kinds = [delta_kind(choice)]
    if choice.get("finish_reason") is not None:
        kinds.append("finish")
    return [kind for kind in kinds if kind != "empty"]


def protocol(answer: dict) -> Protocol:
    status, content_type = answer["status"], (answer.get("content_type") or "").split(";")[0]
    text = answer.get("text", "")
    if content_type == "text/event-stream":
        events, done = stream_events(text)
        shape = Protocol(status, content_type, done=done)
        event_keys, chunk_keys, chunks = set(), {}, {}
        for event in events:
            event_keys |= {key for key in event if key != "choices"}
            if event.get("usage") and not event.get("choices"):
                shape.usage = usage_of(event["usage"])
                shape.usage_chunks += 1
            if "error" in event:
                shape.error = error_of(event)
            for choice in event.get("choices") or []:
                carried = choice_kinds(choice)
                chunk_keys.setdefault(carried[-1] if carried else "empty", set()).update(key_paths(choice))
                kinds = chunks.setdefault(choice.get("index"), [])
                for kind in carried:
                    if not kinds or kinds[-1] != kind:
                        kinds.append(kind)
        shape.chunks, shape.event_keys = chunks, frozenset(event_keys)
        shape.chunk_keys = {kind: frozenset(paths) for kind, paths in chunk_keys.items()}
        return shape
    if content_type == "application/json" and text:
        body = json.loads(text)
        error = error_of(body)
        keys = frozenset() if error else frozenset(key_paths(body))
        return Protocol(status, content_type, error=error, keys=keys,
                        usage=usage_of(body.get("usage")) if isinstance(body, dict) else None)
    return Protocol(status, content_type)


def up_to_the_model(kinds: list[str]) -> list[str]:
    """A choice's chunk sequence with what the model chose to write reduced to its first kind
    (text or tool calls): the role chunk, the first model delta, and the finish chunk."""
    kept = []
    for kind in kinds:
        written = WRITTEN.get(kind)
        if written and any(seen in WRITTEN.values() for seen in kept):
            continue
        kept.append(written or kind)
    return kept


def differences(standin: dict, real: dict) -> list[str]:
    """How the stand-in's answer differs from the real engine's in what the protocol fixes,
    the ALLOWED differences left out."""
    ours, theirs = protocol(standin), protocol(real)
    found = []

    def compare(what, mine, other):
        if mine != other:
            found.append(f"{what}: stand-in {mine!r}, real {other!r}")

    def compare_keys(what, mine, other):
        if mine != other:
            found.append(f"{what}: only the stand-in's {sorted(mine - other)}, only the real "
                         f"engine's {sorted(other - mine)}")

    compare("status", ours.status, theirs.status)
    compare("Content-Type", ours.content_type, theirs.content_type)
    compare("error", ours.error, theirs.error)
    compare_keys("keys", {path for path in ours.keys if not CHOSEN_PATHS.match(path)},
                 {path for path in theirs.keys if not CHOSEN_PATHS.match(path)})
    compare("usage", ours.usage, theirs.usage)
    compare("usage chunks", ours.usage_chunks, theirs.usage_chunks)
    compare("[DONE]", ours.done, theirs.done)
    compare_keys("event keys", ours.event_keys, theirs.event_keys)
    compare("chunk sequences",
            {index: up_to_the_model(kinds) for index, kinds in ours.chunks.items()},
            {index: up_to_the_model(kinds) for index, kinds in theirs.chunks.items()})
    for kind in sorted(set(ours.chunk_keys) & set(theirs.chunk_keys)):
        compare_keys(f"keys of {kind} chunks", ours.chunk_keys[kind], theirs.chunk_keys[kind])
    return found
