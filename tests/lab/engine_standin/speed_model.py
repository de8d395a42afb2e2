"""The simulated engine's speed: when each token of an answer is due, and how many run at once.

The stand-in computes an answer's text at once; this model decides when it may leave, so that a
load generator measures a throughput that follows from a few documented numbers instead of
from the speed of the machine running the lab.

The model
---------

Sequences. Each choice of a request is one sequence; a request runs as many sequences as it
has choices, at most max_num_seqs (the cap keeps a request the base serves from waiting
forever), and at most `--max-num-seqs` sequences run at once. A request that does not fit
waits, first come first served: a later request never overtakes a waiting one, even one that
would fit. A request starts running when it arrives, or when it gets its slots if it had to
wait; the stand-in's own time computing the answer is spent inside the model's time, not added
to it. (For /v1/completions with several prompts, the prompt tokens are all of them.)

Prefill. A request's first token is due prompt_tokens / prefill_tps seconds after it starts
running (prompt_tokens as usage reports them, the chat template's tokens included). With chunked prefill vLLM processes the prompt in steps of at most
max_num_batched_tokens tokens; the model charges each chunk its own tokens / prefill_tps, so
the chunks add up to the same time and chunking needs no term of its own. (Charging every chunk
a full max_num_batched_tokens, the rounded-up variant, would make a ten-token probe pay for
4096 tokens, 0.1 s at the default rate: a step's cost grows with the tokens in it, not with
the budget it leaves unused.)

Decode. Then one token every 1 / decode_tps seconds: token k (counted from 1) is due
prompt_tokens / prefill_tps + (k - 1) / decode_tps seconds after the start. Running beside
other sequences does not slow a sequence down: up to max_num_seqs, the batch is free.

Leaving. A non-streamed answer leaves when the last token of its longest choice is due. A
streamed answer's chunks leave as their tokens come due: a choice's role chunk with its first
token (vLLM sends it when the first output arrives), its m content chunks spread evenly over
its tokens (the j-th with token ceil(j * tokens / m)), its finish chunk with its last token,
and the usage chunk after everything. Due times are counted from the start, never from the
previous write, so a late wake-up does not push the rest back (no drift): whatever is due by
then leaves together, text deltas of one choice merged into one chunk (the `text` of
/v1/completions chunks likewise), as vLLM merges the outputs a slow reader has not collected
yet. Writes are at least WRITE_INTERVAL apart (the last one never waits), which bounds the
work per stream on a busy machine without moving the time the answer ends. Usage counts
tokens, so merged chunks change no figure a benchmark reports.

Rates (environment of the stand-in; both are per sequence):

    BIV100_STANDIN_PREFILL_TPS   prompt tokens per second          (default 40000)
    BIV100_STANDIN_DECODE_TPS    output tokens per second          (default 5000)

Noise. A real engine's requests do not all take the same time. With BIV100_STANDIN_JITTER = j
(a fraction, 0 <= j < 1, default 0: none), each request runs (1 + u) times as long as the rates
say, its prefill and its decode alike, u drawn uniformly from [-j, +j] by a random.Random seeded
with BIV100_STANDIN_SEED (an integer, default 0), one draw per request in the order requests
start running. The same seed, load and order give the same draws, so a test of a canary's
analysis knows the spread its samples have; the rates set a host's mean (a slower canary is a
lower BIV100_STANDIN_DECODE_TPS in its engine_env) and the jitter its noise.

The defaults put the lab's default bench load (files/bench/default.yml: prompts of about 1024
tokens answered with 128 to 256 tokens, two in flight on an engine with max_num_seqs 2) at a
predicted weighted score (0.83 x output tokens/s + 0.17 x input tokens/s) of 10,093 (256
tokens) to 10,993 (128 tokens), 10,453 at 192: 26 to 37 % above the throughput gate's 8,000.
Measured over loopback, each request also pays for its HTTP round trip and the client's work
(a few ms beside 50 to 80 ms of simulated time), which costs about 4 %: the gate sees about
10,000, some 25 % above it. A probe notices nothing (a 100-token answer takes 20 ms, a
12,000-token prompt 0.3 s). The rates keep the ratio 8:1 so that the score hardly depends on
the answer length.
"""

import collections
import math
import random
import threading
import time

PREFILL_TPS_VARIABLE = "BIV100_STANDIN_PREFILL_TPS"
DECODE_TPS_VARIABLE = "BIV100_STANDIN_DECODE_TPS"
JITTER_VARIABLE = "BIV100_STANDIN_JITTER"
SEED_VARIABLE = "BIV100_STANDIN_SEED"
DEFAULT_PREFILL_TPS = 40000.0
DEFAULT_DECODE_TPS = 5000.0
# At most 200 writes a second per stream: tokens due in between leave together.
WRITE_INTERVAL = 0.005
# The throughput gate's weights.
OUTPUT_WEIGHT, INPUT_WEIGHT = 0.83, 0.17
# Chat delta fields that join by concatenation, in the order they come; a delta with any other
# field stays a chunk of its own. A /v1/completions chunk's choice has its `text` instead.
TEXT_FIELDS = ("reasoning_content", "content")


class RateError(ValueError):
    pass


class Rates:
    """Per-sequence prefill and decode rates, in tokens per second, and the requests' noise."""

    def __init__(self, prefill_tps=DEFAULT_PREFILL_TPS, decode_tps=DEFAULT_DECODE_TPS, jitter=0.0, seed=0):
        self.prefill_tps = float(prefill_tps)
        self.decode_tps = float(decode_tps)
        self.jitter = float(jitter)
        self._draws = random.Random(seed)
        self._drawing = threading.Lock()

    @classmethod
    def from_environ(cls, environ):
        return cls(_rate(environ, PREFILL_TPS_VARIABLE, DEFAULT_PREFILL_TPS),
                   _rate(environ, DECODE_TPS_VARIABLE, DEFAULT_DECODE_TPS),
                   _jitter(environ), _seed(environ))

    def for_request(self):
        """The rates one request runs at: these, slowed or sped up by its draw of the noise."""
        if not self.jitter:
            return self
        with self._drawing:  # requests start on several threads; the draws keep their order
            stretch = 1 + self._draws.uniform(-self.jitter, self.jitter)
        return Rates(self.prefill_tps / stretch, self.decode_tps / stretch)

    def prefill_seconds(self, prompt_tokens):
        return prompt_tokens / self.prefill_tps

    def token_due(self, prompt_tokens, token):
        """Seconds from the start of running until output token `token` (from 1) is due."""
        return self.prefill_seconds(prompt_tokens) + (max(token, 1) - 1) / self.decode_tps

    def request_seconds(self, prompt_tokens, output_tokens):
        """Seconds a request runs: until its last token. A sequence makes at least one token."""
        return self.token_due(prompt_tokens, output_tokens)

    def __repr__(self):
        noise = f", jitter={self.jitter:g}" if self.jitter else ""
        return f"Rates(prefill_tps={self.prefill_tps:g}, decode_tps={self.decode_tps:g}{noise})"


def _setting(environ, name, default, read, fits, meaning):
    """The variable `name` read by `read` (float or int), `default` when unset or empty; a value
    that does not read, or does not fit, stops the start naming the variable and what it must be."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = read(raw)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise RateError(f"{name}={raw} is not {meaning}")
    return value


def _rate(environ, name, default):
    return _setting(environ, name, default, float, lambda value: value > 0 and math.isfinite(value),
                    "a positive number of tokens per second")


def _jitter(environ):
    return _setting(environ, JITTER_VARIABLE, 0.0, float, lambda value: 0 <= value < 1, "a fraction in [0, 1)")


def _seed(environ):
    return _setting(environ, SEED_VARIABLE, 0, int, lambda value: True, "an integer")


def sequences_of(n, max_num_seqs):
    """Sequences a request of `n` choices occupies."""
    return max(1, min(n, max_num_seqs))


# ---- what a load of fixed-size requests measures --------------------------------------------

def predicted_throughput(rates, prompt_tokens, output_tokens, concurrency, max_num_seqs):
    """(input tokens/s, output tokens/s) of `concurrency` clients that each send the next request
    when the last is answered, every request of one choice. Clients beyond max_num_seqs only
    wait in the queue."""
    running = min(concurrency, max_num_seqs)
    seconds = rates.request_seconds(prompt_tokens, output_tokens)
    return running * prompt_tokens / seconds, running * output_tokens / seconds


def weighted_score(input_tps, output_tps):
    return OUTPUT_WEIGHT * output_tps + INPUT_WEIGHT * input_tps


# ---- the queue --------------------------------------------------------------------------------

class SequenceSlots:
    """max_num_seqs slots, handed out first come first served."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.used = 0
        self._line = collections.deque()
        self._changed = threading.Condition()

    @property
    def waiting(self):
        return len(self._line)

    def acquire(self, count):
        """Take `count` slots (at most all of them); True when that meant waiting."""
        count = min(count, self.capacity)
        ticket, waited = object(), False
        with self._changed:
            self._line.append(ticket)
            try:
                while self._line[0] is not ticket or self.used + count > self.capacity:
                    waited = True
                    self._changed.wait()
            except BaseException:
                self._line.remove(ticket)  # a request that gives up leaves the line
                self._changed.notify_all()
                raise
            self._line.popleft()
            self.used += count
            self._changed.notify_all()  # the next in line may fit as well
        return waited

    def release(self, count):
        with self._changed:
            self.used -= min(count, self.capacity)
            self._changed.notify_all()


# ---- a streamed answer's chunks on the schedule ----------------------------------------------

def stream_schedule(chunks, prompt_tokens, choice_tokens, rates):
    """[(due seconds, the choice's tokens out by then, chunk)] in the order the chunks leave.

    `chunks` are a streamed answer's chunk objects in the order the answer writes them,
    `choice_tokens` every choice's completion tokens.
    """
    deltas = collections.Counter(_choice_index(chunk) for chunk in chunks
                                 if _kind(chunk) == "delta")
    seen = collections.Counter()
    last_due = max(rates.token_due(prompt_tokens, tokens) for tokens in choice_tokens or [1])
    planned = []
    for order, chunk in enumerate(chunks):
        kind = _kind(chunk)
        if kind == "after":
            token, out, due = None, None, last_due
        else:
            total = choice_tokens[_choice_index(chunk)]
            if kind == "role":
                token, out = 1, 0
            elif kind == "finish":
                token, out = total, total
            else:
                seen[_choice_index(chunk)] += 1
                token = math.ceil(seen[_choice_index(chunk)] * total
                                  / deltas[_choice_index(chunk)])
                out = token
            due = rates.token_due(prompt_tokens, token)
        planned.append((due, order, out, chunk))
    planned.sort(key=lambda entry: entry[:2])
    return [(due, out, chunk) for due, _order, out, chunk in planned]


def _kind(chunk):
    choices = chunk.get("choices") or []
    if len(choices) != 1:
        return "after"
    if choices[0].get("finish_reason") is not None:
        return "finish"
    if "role" in (choices[0].get("delta") or {}):
        return "role"
    return "delta"


def _text_parts(choice):
    """{field: text} of a choice that carries text only, else None."""
    if "delta" in choice:
        delta = choice["delta"] or {}
        return delta if set(delta) <= set(TEXT_FIELDS) else None
    if isinstance(choice.get("text"), str):
        return {"text": choice["text"]}
    return None


def _choice_index(chunk):
    return chunk["choices"][0].get("index", 0)


def paced(schedule, start, write_interval=WRITE_INTERVAL, clock=time.monotonic,
          sleep=time.sleep):
    """Batches of a schedule's entries, each yielded when its entries are due.

    `schedule` is [(due seconds after `start`, ...)] sorted by due time. Every entry due by a
    wake-up goes in that wake-up's batch; after a batch the next wake-up is at least
    `write_interval` later, except for the last entry, which waits for nothing but its own time.
    """
    if not schedule:
        return
    position, final_due, not_before = 0, schedule[-1][0], 0.0
    while position < len(schedule):
        now = clock() - start
        wake = min(max(schedule[position][0], not_before), final_due)
        if now < wake:
            sleep(wake - now)
            continue
        end = position
        while end < len(schedule) and schedule[end][0] <= now:
            end += 1
        yield schedule[position:end]
        position = end
        not_before = now + write_interval


def sleep_until(deadline, clock=time.monotonic, sleep=time.sleep):
    while True:
        left = deadline - clock()
        if left <= 0:
            return
        sleep(left)


def merged(batch):
    """[(tokens out, chunk)] of one batch, consecutive text deltas of one choice joined."""
    result = []
    for _due, out, chunk in batch:
        if result and _joinable(result[-1][1], chunk):
            result[-1] = (out, _join(result[-1][1], chunk))
        else:
            result.append((out, chunk))
    return result


def _joinable(first, second):
    if _kind(first) != "delta" or _kind(second) != "delta":
        return False
    if ({key: value for key, value in first.items() if key != "choices"}
            != {key: value for key, value in second.items() if key != "choices"}):
        return False
    (one,), (two,) = first["choices"], second["choices"]
    if ({key: value for key, value in one.items() if key not in ("delta", "text")}
            != {key: value for key, value in two.items() if key not in ("delta", "text")}
            or one.get("logprobs") is not None or ("delta" in one) != ("delta" in two)):
        return False
    one_text, two_text = _text_parts(one), _text_parts(two)
    if one_text is None or two_text is None:
        return False
    # Reasoning ends before content begins: content followed by reasoning keeps its order.
    return not ("content" in one_text and "reasoning_content" in two_text)


def _join(first, second):
    (one,), (two,) = first["choices"], second["choices"]
    if "delta" not in one:
        return dict(first, choices=[dict(one, text=one["text"] + two["text"])])
    delta = dict(one["delta"] or {})
    for field, text in (two["delta"] or {}).items():
        delta[field] = (delta.get(field) or "") + (text or "")
    ordered = {field: delta[field] for field in TEXT_FIELDS if field in delta}
    return dict(first, choices=[dict(one, delta=ordered)])


def continuous_usage(body):
    """stream_options.continuous_usage_stats, which counts only with include_usage (true by
    default once stream_options is given)."""
    options = body.get("stream_options")
    return (isinstance(options, dict) and bool(options.get("include_usage", True))
            and bool(options.get("continuous_usage_stats")))


def with_usage(chunk, prompt_tokens, completion_tokens):
    """A choice's chunk with the usage vLLM adds under continuous_usage_stats: the prompt and
    that choice's tokens out so far."""
    return dict(chunk, usage={"prompt_tokens": prompt_tokens,
                              "total_tokens": prompt_tokens + completion_tokens,
                              "completion_tokens": completion_tokens})
