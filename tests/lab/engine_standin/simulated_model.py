"""The simulated model: deterministic tokens instead of a network's output.

Tokens are counted with one rule everywhere (prompt, output, limits): a token is a run of word
characters or a single other non-space character, so "Hello, world!" is four tokens. Output is
drawn from a SHA-256 stream seeded by the request (its messages, tools, seed, temperature and
the choice index), so the same request always gets the same answer, and different choices of
one request differ.
"""

import hashlib
import json
import re

TOKEN = re.compile(r"\w+|[^\w\s]")
VOCABULARY = (
    "the engine serves a simulated answer for this lab request with stable tokens and no "
    "model weights loaded on any device while tensor parallel ranks stay idle"
).split()
ANSWER_TOKENS = (12, 40)      # natural answer length range, in tokens
REASONING_TOKENS = (24, 64)   # natural length of the thinking before an answer or a tool call
THINK_START, THINK_END = "<think>", "</think>"


def count_tokens(text):
    return len(TOKEN.findall(text or ""))


def split_tokens(text):
    """The tokens of a text, each with the whitespace before it, so joining them restores it.

    Whitespace at the end goes with the last token (or is one token of its own).
    """
    return re.findall(r"\s*(?:\w+|[^\w\s])(?:\s+$)?|\s+$", text or "")


class TokenStream:
    """Deterministic draws for one choice of one request."""

    def __init__(self, request_key, choice_index):
        self._seed = f"{request_key}/{choice_index}".encode()
        self._counter = 0

    def draw(self, modulus):
        digest = hashlib.sha256(self._seed + str(self._counter).encode()).digest()
        self._counter += 1
        return int.from_bytes(digest[:8], "big") % modulus

    def length(self, bounds):
        low, high = bounds
        return low + self.draw(high - low + 1)

    def words(self, count):
        return " ".join(VOCABULARY[self.draw(len(VOCABULARY))] for _word in range(count))

    def sentence(self, bounds):
        text = self.words(self.length(bounds))
        return text[0].upper() + text[1:] + "."


def request_key(body):
    """What makes two requests the same request for the simulated model."""
    relevant = {name: body.get(name) for name in
                ("messages", "tools", "tool_choice", "seed", "temperature", "response_format")}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()


def value_for_schema(schema, stream):
    """A deterministic value that satisfies a (simple) JSON schema."""
    schema = schema if isinstance(schema, dict) else {}
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "string")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: value_for_schema(sub, stream) for name, sub in properties.items()}
    if kind == "array":
        return [value_for_schema(schema.get("items"), stream)]
    if kind == "integer":
        return stream.draw(100)
    if kind == "number":
        return stream.draw(10000) / 100
    if kind == "boolean":
        return bool(stream.draw(2))
    return stream.words(1 + stream.draw(3))


def qwen3_coder_call_text(name, arguments):
    """The text Qwen3-Coder writes for a tool call, which the qwen3_coder parser reads back."""
    parameters = "".join(
        f"<parameter={key}>\n{json.dumps(value) if not isinstance(value, str) else value}\n"
        "</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"
