"""The simulated engine's performance: what starts, what runs at once, and when each token of an
answer is due.

The stand-in computes an answer's text at once; this model decides whether the engine starts
with its launch settings, how many sequences run side by side, and when an answer may leave, so
that a load generator (and a tuner searching the settings) measures figures that follow from a
few documented numbers instead of from the speed of the machine running the lab. It is a small
model of vLLM 0.10.1.1 on BI-V100 GPUs, not a measurement of one; every figure it produces is
marked simulated (server.py's header, "(simulated)" in its log lines).

The settings it answers to: --max-model-len, --max-num-seqs, --max-num-batched-tokens,
--enable-chunked-prefill, --gpu-memory-utilization, --dtype, --kv-cache-dtype,
--tensor-parallel-size (settings.py resolves their defaults as vLLM's V0 engine does: a GPU of
compute capability below 8.0 runs V0 in 0.10.1.1), and PYTORCH_CUDA_ALLOC_CONF.

Memory at start (memory_model.py)
---------------------------------

Per GPU, in GiB (2^30 bytes), as the V0 worker accounts for it (Worker.
determine_num_available_blocks, then initialize_cache):

    GPU                 32            a BI-V100 (ixsmi: 32768 MiB)
    runtime             1             CUDA context and CoreX runtime, held before vLLM's first
                                      snapshot and so outside its share
    weights             40 x d / 2 / tp
                                      the lab's checkpoints have no weight files: each counts as
                                      40 GiB of bfloat16 (21.5 billion parameters), d the bytes
                                      of --dtype (half, float16, bfloat16, auto: 2; float,
                                      float32: 4), split over the tensor-parallel GPUs
    non-torch           0.75          NCCL and runtime buffers the profile run adds
    activation          0.5 MiB x max_num_batched_tokens
                                      the profile run's peak (eager mode, attention without a
                                      flash kernel): larger prefill chunks cost memory
    KV cache            utilization x 32 - weights - non-torch - activation
    KV per token        2 x max(1, kv_heads / tp) x head_dim x k x attention layers, bytes
                                      keys and values of each GPU's share of the KV heads, k the
                                      bytes of --kv-cache-dtype (auto: d; fp8*: 1); the geometry
                                      from config.json (top level, else text_config;
                                      head_dim = hidden_size / heads when absent; only
                                      "full_attention" layers when layer_types is given)

The cache is whole blocks of 16 tokens. The lab's Qwen3.5 (memory_model.LAB_QWEN3_5_CONFIG,
which tests/lab/host_tree.py writes to /opt/models/qwen3_5/config.json) has 64 layers, all full
attention, 8 KV heads of 128: 64 KiB per token and GPU at tp 4, so 256000 tokens take 15.63 GiB.
That geometry is the lab's own, not a published checkpoint's: it makes Sub168's context fill most
of the memory, so that gpu_memory_utilization and max_num_batched_tokens matter. A config.json
without num_hidden_layers (the unit tests' model) counts as this geometry.

The start fails, as the real engine's does, after loading (so after BIV100_STANDIN_LOAD_SECONDS),
with the real message as the last line on stderr and exit status 1:

- weights above the GPU less the runtime: torch.OutOfMemoryError (loading the weights);
- the profile run's activation above what is left: torch.OutOfMemoryError (the profile run);
  without chunked prefill max_num_batched_tokens is at least max_model_len, so a long context
  cannot start;
- no block left for the cache: "ValueError: No available memory for the cache blocks. ..."
  (worker.py raise_if_cache_size_invalid);
- fewer cache tokens than max_model_len: "ValueError: The model's max seq len (N) is larger
  than the maximum number of tokens that can be stored in KV cache (M). ..." (the same
  function; V1's check_enough_kv_cache_memory in kv_cache_utils.py makes the same check, one
  sequence of max_model_len, in its own words);
- utilization x 32 + the runtime's 1 GiB above 32 GiB, i.e. a utilization above 0.96875:
  torch.OutOfMemoryError allocating the KV cache. (The real engine may only fail at its first
  large forward pass there; the stand-in fails at start, where the tuner's memory step looks.)

At Sub168 (max_model_len 256000, max_num_seqs 2, gpu_memory_utilization 0.95,
max_num_batched_tokens 4096, dtype half, tp 4): weights 10, activation 2, KV cache 17.65 GiB:
289,168 tokens, 1.13 sequences of 256000 ("Maximum concurrency ... 1.13x" in the log). At
max_model_len 256000 the utilization must be at least

    max_num_batched_tokens 2048: 0.856    4096: 0.887    8192: 0.949

so 0.89 starts and 0.88 does not with Sub168's 4096 (0.80 is far below), 0.85 holds no
256000-token sequence with any of them, and 8192 batched tokens need 0.95 or 0.96.

Sequences and the queue
-----------------------

Each choice of a request is one sequence; a request runs as many sequences as it has choices,
at most max_num_seqs (the cap keeps a request the base serves from waiting forever). A request
runs when both are free: its sequences among --max-num-seqs slots, and its tokens (prompt plus
every choice's answer, the choices sharing the prompt) in the KV cache; at most the whole cache
(a request larger than it runs alone). A request that does not fit waits, first come first
served: a later request never overtakes a waiting one, even one that would fit. The real engine
holds a prompt's blocks and grows them as it decodes, preempting when the cache is full; the
stand-in, knowing the answer's length, holds them all from the start and never preempts. A
request starts running when it arrives, or when it gets its slots if it had to wait; the
stand-in's own time computing the answer is spent inside the model's time, not added to it.
(For /v1/completions with several prompts, the prompt tokens are all of them.)

A request alone
---------------

Prefill. With chunked prefill vLLM processes a prompt in steps of at most
max_num_batched_tokens tokens; without it, in one step (its start-up check makes
max_num_batched_tokens at least max_model_len then). Each step costs STEP_SECONDS (4 ms) beside
its tokens, so a prompt of p tokens is prefilled in

    ceil(p / max_num_batched_tokens) x 0.004 + p / prefill_tps  seconds

(the first token is due then; prompt tokens as usage reports them, the chat template's
included). Larger chunks are faster up to the prompt's length, and a chunk larger than the
prompt gains nothing; each token of max_num_batched_tokens costs half a MiB at start, so past a
point the KV cache no longer holds max_model_len and the engine does not start. (A step's cost
grows with the tokens in it, not with the budget it leaves unused: a ten-token probe pays one
step, not 4096 tokens.)

Decode. Then one token every 1 / decode_tps seconds: token k (counted from 1) is due
prefill + (k - 1) / decode_tps seconds after the start.

The batch
---------

Sequences running side by side share the GPU: with n sequences running, each runs at

    1 / (1 + alpha x (n - 1))  of its speed alone,  alpha = BATCH_SLOWDOWN = 0.2

its prefill steps and its decode alike (the batch's step takes longer). The aggregate grows with
n but sublinearly, towards 5 times one sequence's: n = 1, 2, 4, 8 make 1, 1.67, 2.5 and 3.33
times the tokens of one, each sequence at 1, 0.83, 0.63 and 0.42 of its speed alone. n counts
the sequences running at each moment: each running request has its own clock (Batch,
RequestClock) that advances at the batch's speed and changes pace as requests join and leave,
and a request's due times above are read on that clock.

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

Rates (environment of the stand-in; a sequence running alone):

    BIV100_STANDIN_PREFILL_TPS   prompt tokens per second          (default 60000)
    BIV100_STANDIN_DECODE_TPS    output tokens per second          (default 6000)

Noise. A real engine's requests do not all take the same time. With BIV100_STANDIN_JITTER = j
(a fraction, 0 <= j < 1, default 0: none), each request runs (1 + u) times as long as the rates
say, its prefill (step costs included) and its decode alike, u drawn uniformly from [-j, +j] by
a random.Random seeded with BIV100_STANDIN_SEED (an integer, default 0), one draw per request in
the order requests start running. The same seed, load and order give the same draws, so a test
of a canary's analysis knows the spread its samples have; the rates set a host's mean (a slower
canary is a lower BIV100_STANDIN_DECODE_TPS in its engine_env) and the jitter its noise.

Fragmentation
-------------

A long prompt (over FRAGMENTATION_PROMPT_TOKENS = 1024 tokens) asks, at its prefill, for one
block of 1.95 GiB. PyTorch's caching allocator splits its large cached blocks for smaller
requests unless told not to, so while one request with a long prompt runs, a second one that
starts running finds no block that large: torch.OutOfMemoryError in the log, and the request
fails at once, "CUDA out of memory. Tried to allocate 1.95 GiB": a 500 when not streamed, the
stream's last event before [DONE] when streamed (its 200 headers are gone already; vLLM's
create_streaming_error_response, BadRequestError 400). The engine serves on.
PYTORCH_CUDA_ALLOC_CONF, as the stand-in receives it, removes this with expandable_segments:True,
or with max_split_size_mb at or below FRAGMENTATION_MAX_SPLIT_MB = 1024 (blocks above it are
never split, and a 1024 MiB limit keeps the 1.95 GiB ones whole): the deploy's default
garbage_collection_threshold:0.8,max_split_size_mb:512 does; garbage_collection_threshold alone,
backend:cudaMallocAsync, max_split_size_mb above 1024 or no setting do not.
BIV100_STANDIN_BREAK=fragmentation fragments whatever the allocator says. One long prompt at a
time (max_num_seqs 1, or requests that do not overlap) never fails; short prompts never do.

Predictions
-----------

predicted_throughput gives what `concurrency` clients measure that each send the next request
when the last is answered: with n = min(concurrency, max_num_seqs, sequences of p + o tokens the
KV cache holds) running and T the request's time alone,

    input  = n x p / (T x (1 + alpha (n - 1)))     output = n x o / (T x (1 + alpha (n - 1)))

and predicted_score the weighted score (0.83 x output tokens/s + 0.17 x input tokens/s) of a
setting (engine_args as the engine role takes them, the engine's environment, the model's
config: the lab's Qwen3.5 by default) for requests of p prompt and o output tokens, with as
many clients as max_num_seqs unless told how many (the lab's bench offers 8: clients beyond
max_num_seqs wait, which changes no throughput), or what fails instead: the start, prompts
beyond max_model_len, or long prompts side by side on an allocator that fragments.

At the lab's rates (inventory/lab/group_vars/biv100.yml: 60000 and 6000) and Sub168 the lab's
default bench load (files/bench/default.yml: prompts of about 1024 tokens answered with 128 to
256 tokens, 8 in flight of which Sub168 runs two) is predicted at 10,135 (256 tokens) to 11,062 (128 tokens), 10,505 at
192: 27 to 38 % above the throughput gate's 8,000. Measured over loopback, each request also
pays for its HTTP round trip and the client's work (a few ms beside 50 to 80 ms of simulated
time), which costs about 4 %: the gate sees about 10,000, some 25 % above it. A probe notices
nothing (a 100-token answer takes about 25 ms, a 12,000-token prompt 0.21 s). The rates keep the
ratio 10:1 so that the score hardly depends on the answer length.

Other settings, same load (p 1024, o 192): max_num_seqs 1, 4, 8 score 6,303, 15,758, 21,011;
max_num_batched_tokens 2048 or 8192 score as 4096 (one chunk holds the prompt). Over
max_num_seqs {1, 2, 4, 8} x max_num_batched_tokens {2048, 4096, 8192} x gpu_memory_utilization
{0.85, 0.9, 0.95} the best feasible score, 21,011, is max_num_seqs 8 with (2048 or 4096, 0.9) or
(any, 0.95), all equal. With 6000-token prompts (o 256) the chunk decides: max_num_seqs 8 scores
26,591, 27,297 and 28,043 with 2048, 4096 and 8192 batched tokens, the last only at 0.95 (Sub168
itself: 13,649).
"""

import collections
import math
import random
import threading
import time

from . import memory_model, settings, startup

PREFILL_TPS_VARIABLE = "BIV100_STANDIN_PREFILL_TPS"
DECODE_TPS_VARIABLE = "BIV100_STANDIN_DECODE_TPS"
JITTER_VARIABLE = "BIV100_STANDIN_JITTER"
SEED_VARIABLE = "BIV100_STANDIN_SEED"
BREAK_VARIABLE = "BIV100_STANDIN_BREAK"
DEFAULT_PREFILL_TPS = 60000.0
DEFAULT_DECODE_TPS = 6000.0
# What each engine step costs beside its tokens: a prompt pays it once per chunk.
STEP_SECONDS = 0.004
# alpha: n sequences running side by side each run at 1 / (1 + alpha (n - 1)) of their speed alone.
BATCH_SLOWDOWN = 0.2
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
    """A sequence's speed alone: prefill and decode tokens per second, the prefill's chunk and
    step cost, and the requests' noise. Its seconds are a request's own (see Batch)."""

    def __init__(self, prefill_tps=DEFAULT_PREFILL_TPS, decode_tps=DEFAULT_DECODE_TPS, jitter=0.0,
                 seed=0, prefill_chunk=None, step_seconds=STEP_SECONDS):
        self.prefill_tps = float(prefill_tps)
        self.decode_tps = float(decode_tps)
        self.jitter = float(jitter)
        self.prefill_chunk = prefill_chunk  # None: a whole prompt in one step
        self.step_seconds = float(step_seconds)
        self._draws = random.Random(seed)
        self._drawing = threading.Lock()

    @classmethod
    def from_environ(cls, environ, prefill_chunk=None):
        return cls(_rate(environ, PREFILL_TPS_VARIABLE, DEFAULT_PREFILL_TPS),
                   _rate(environ, DECODE_TPS_VARIABLE, DEFAULT_DECODE_TPS),
                   _jitter(environ), _seed(environ), prefill_chunk)

    def for_request(self):
        """The rates one request runs at: these, slowed or sped up by its draw of the noise."""
        if not self.jitter:
            return self
        with self._drawing:  # requests start on several threads; the draws keep their order
            stretch = 1 + self._draws.uniform(-self.jitter, self.jitter)
        return Rates(self.prefill_tps / stretch, self.decode_tps / stretch,
                     prefill_chunk=self.prefill_chunk, step_seconds=self.step_seconds * stretch)

    def prefill_steps(self, prompt_tokens):
        if not self.prefill_chunk:
            return 1
        return max(1, math.ceil(prompt_tokens / self.prefill_chunk))

    def prefill_seconds(self, prompt_tokens):
        return (self.prefill_steps(prompt_tokens) * self.step_seconds
                + prompt_tokens / self.prefill_tps)

    def token_due(self, prompt_tokens, token):
        """Seconds from the start of running until output token `token` (from 1) is due."""
        return self.prefill_seconds(prompt_tokens) + (max(token, 1) - 1) / self.decode_tps

    def request_seconds(self, prompt_tokens, output_tokens):
        """Seconds a request runs: until its last token. A sequence makes at least one token."""
        return self.token_due(prompt_tokens, output_tokens)

    def __repr__(self):
        chunk = f", prefill_chunk={self.prefill_chunk}" if self.prefill_chunk else ""
        noise = f", jitter={self.jitter:g}" if self.jitter else ""
        return (f"Rates(prefill_tps={self.prefill_tps:g}, decode_tps={self.decode_tps:g}"
                f"{chunk}, step_seconds={self.step_seconds:g}{noise})")


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


def batch_speed(sequences, slowdown=BATCH_SLOWDOWN):
    """The share of its speed alone each of `sequences` running side by side keeps."""
    return 1.0 / (1.0 + slowdown * max(sequences - 1, 0))


# ---- what a load of fixed-size requests measures --------------------------------------------

def predicted_throughput(rates, prompt_tokens, output_tokens, concurrency, max_num_seqs,
                         kv_cache_tokens=None):
    """(input tokens/s, output tokens/s) of `concurrency` clients that each send the next request
    when the last is answered, every request of one choice. Clients beyond what runs at once
    (max_num_seqs, and the sequences the KV cache holds) only wait in the queue."""
    running = running_sequences(prompt_tokens, output_tokens, concurrency, max_num_seqs,
                                kv_cache_tokens)
    seconds = rates.request_seconds(prompt_tokens, output_tokens) / batch_speed(running)
    return running * prompt_tokens / seconds, running * output_tokens / seconds


def running_sequences(prompt_tokens, output_tokens, concurrency, max_num_seqs,
                      kv_cache_tokens=None):
    running = min(concurrency, max_num_seqs)
    if kv_cache_tokens:
        running = min(running, max(1, int(kv_cache_tokens // (prompt_tokens + output_tokens))))
    return running


def weighted_score(input_tps, output_tps):
    return OUTPUT_WEIGHT * output_tps + INPUT_WEIGHT * input_tps


Prediction = collections.namedtuple("Prediction", "score input_tps output_tps running refused")


def predicted_score(engine_args, prompt_tokens, output_tokens, environ=None, model_config=None,
                    concurrency=None):
    """What a bench of `concurrency` clients (default: max_num_seqs, as the bench runs) with
    requests of these lengths measures on a stand-in launched with `engine_args` (snake_case, as
    the engine role takes them) and `environ` (its environment: the BIV100_STANDIN_* rates,
    PYTORCH_CUDA_ALLOC_CONF), serving `model_config` (default: the lab's Qwen3.5).

    A Prediction: the weighted score and its rates, the sequences running at once, and
    `refused`, the message of what fails instead (the start, or the bench's requests), else None.
    """
    environ = dict(environ or {})
    model_config = memory_model.LAB_QWEN3_5_CONFIG if model_config is None else model_config
    try:
        engine = settings.from_engine_args(engine_args, model_config, environ)
        plan = memory_model.MemoryPlan(memory_model.ModelShape.from_config(model_config), engine)
        plan.check()
        rates = Rates.from_environ(environ, engine.prefill_chunk)
    except (startup.StartupError, memory_model.StartFailure, RateError) as error:
        return Prediction(None, None, None, 0, str(error))
    clients = engine.max_num_seqs if concurrency is None else concurrency
    running = running_sequences(prompt_tokens, output_tokens, clients, engine.max_num_seqs,
                                plan.kv_tokens)
    if prompt_tokens + output_tokens > engine.max_model_len:
        return Prediction(None, None, None, running, (
            f"This model's maximum context length is {engine.max_model_len} tokens: a request "
            f"of {prompt_tokens} + {output_tokens} tokens is refused"))
    fragments = (environ.get(BREAK_VARIABLE) == "fragmentation"
                 or memory_model.allocator_fragments(engine.allocator_conf))
    if fragments and running > 1 and memory_model.is_long_prompt(prompt_tokens):
        return Prediction(None, None, None, running, (
            f"{memory_model.fragmentation_message()}: prompts over "
            f"{memory_model.FRAGMENTATION_PROMPT_TOKENS} tokens side by side on an allocator "
            f"that fragments (PYTORCH_CUDA_ALLOC_CONF={engine.allocator_conf!r})"))
    input_tps, output_tps = predicted_throughput(rates, prompt_tokens, output_tokens, clients,
                                                 engine.max_num_seqs, plan.kv_tokens)
    return Prediction(weighted_score(input_tps, output_tps), input_tps, output_tps, running, None)


# ---- the batch --------------------------------------------------------------------------------

class Batch:
    """The sequences running side by side, and each running request's own clock: the seconds
    of Rates it has done, which pass at batch_speed of the sequences running."""

    def __init__(self, slowdown=BATCH_SLOWDOWN, clock=time.monotonic):
        self.slowdown = slowdown
        self.sequences = 0
        self._clock = clock
        self._clocks = set()
        self._changed = threading.Condition()

    def speed(self):
        return batch_speed(self.sequences, self.slowdown)

    def join(self, count, start):
        """`count` sequences of a request that started running at `start` join the batch:
        its RequestClock."""
        with self._changed:
            self._rebase()
            self.sequences += count
            request = RequestClock(self, count, start)
            self._clocks.add(request)
            self._changed.notify_all()
        return request

    def leave(self, request):
        with self._changed:
            self._rebase()
            self._clocks.discard(request)
            self.sequences -= request.count
            self._changed.notify_all()  # the others' sleeps end at their new speed

    def elapsed(self, request):
        with self._changed:
            return request.done_by(self._clock(), self.speed())

    def wait(self, seconds):
        """Wait `seconds` of a running request's own time, or until the batch changes."""
        with self._changed:
            self._changed.wait(max(seconds, 0) / self.speed())

    def _rebase(self):
        """Every running request's work so far, at the speed it had: the speed is changing."""
        now, speed = self._clock(), self.speed()
        for request in self._clocks:
            request.rebase(now, speed)


class RequestClock:
    """A running request's own time: the seconds of its Rates done so far."""

    def __init__(self, batch, count, start):
        self.batch = batch
        self.count = count
        self.since = start
        self.done = 0.0

    def done_by(self, now, speed):
        return self.done + (now - self.since) * speed

    def rebase(self, now, speed):
        self.done, self.since = self.done_by(now, speed), now

    def elapsed(self):
        return self.batch.elapsed(self)

    def sleep(self, seconds):
        """Wait until `seconds` of own time have passed, or the batch changed."""
        self.batch.wait(seconds)


# ---- the queue --------------------------------------------------------------------------------

class SequenceSlots:
    """max_num_seqs slots and the KV cache's tokens, handed out first come first served."""

    def __init__(self, capacity, token_capacity=None):
        self.capacity = capacity
        self.token_capacity = token_capacity
        self.used = 0
        self.tokens_used = 0
        self._line = collections.deque()
        self._changed = threading.Condition()

    @property
    def waiting(self):
        return len(self._line)

    def _fitted(self, count, tokens):
        """A request's claim within what there is: a request larger than the engine runs alone."""
        return min(count, self.capacity), min(tokens, self.token_capacity or 0)

    def acquire(self, count, tokens=0):
        """Take `count` slots and `tokens` of the KV cache; True when that meant waiting."""
        count, tokens = self._fitted(count, tokens)
        ticket, waited = object(), False
        with self._changed:
            self._line.append(ticket)
            try:
                while (self._line[0] is not ticket or self.used + count > self.capacity
                       or self.tokens_used + tokens > (self.token_capacity or 0)):
                    waited = True
                    self._changed.wait()
            except BaseException:
                self._line.remove(ticket)  # a request that gives up leaves the line
                self._changed.notify_all()
                raise
            self._line.popleft()
            self.used += count
            self.tokens_used += tokens
            self._changed.notify_all()  # the next in line may fit as well
        return waited

    def release(self, count, tokens=0):
        count, tokens = self._fitted(count, tokens)
        with self._changed:
            self.used -= count
            self.tokens_used -= tokens
            self._changed.notify_all()


# ---- a streamed answer's chunks on the schedule ----------------------------------------------

def stream_schedule(chunks, prompt_tokens, choice_tokens, rates):
    """[(due seconds, the choice's tokens out by then, chunk)] in the order the chunks leave.

    `chunks` are a streamed answer's chunk objects in the order the answer writes them,
    `choice_tokens` every choice's completion tokens.
    """
    # The finish chunk carries the choice's last delta (chat.stream_chunks): it is the last of
    # the chunks the choice's tokens are spread over, due with the last token.
    deltas = collections.Counter(_choice_index(chunk) for chunk in chunks
                                 if _kind(chunk) == "delta"
                                 or (_kind(chunk) == "finish" and chunk["choices"][0].get("delta")))
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
