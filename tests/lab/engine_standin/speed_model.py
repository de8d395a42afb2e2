"""The simulated engine's performance: what starts, what runs at once, and when each token of an
answer is made.

The stand-in computes an answer's text at once; this model decides whether the engine starts
with its launch settings, which requests run side by side, and when each token is made, so that
a load generator (and a tuner searching the settings) measures figures that follow from a few
documented numbers instead of from the speed of the machine running the lab. It is a small
model of vLLM 0.10.1.1 on BI-V100 GPUs, not a measurement of one, and no figure it gives is a
claim about a BI-V100's speed; every figure it produces is marked simulated (server.py's
header, "(simulated)" in its log lines).

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
    activation peak     0.5 MiB x max_num_batched_tokens x (1 + f)
                                      the profile run's peak (eager mode, attention without a
                                      flash kernel): larger prefill chunks cost memory; f the
                                      share the caching allocator holds fragmented beside it,
                                      reserved and not allocated: 0 with expandable_segments:True,
                                      1/8 when max_split_size_mb (at most 1024) keeps the large
                                      blocks whole, 1/4 otherwise
    KV cache            utilization x 32 - weights - non-torch - activation peak
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
of the memory, so that gpu_memory_utilization, max_num_batched_tokens and the allocator matter.
A config.json without num_hidden_layers (the unit tests' model) counts as this geometry.

The start fails, as the real engine's does, after loading (so after BIV100_STANDIN_LOAD_SECONDS),
with the real message as the last line on stderr and exit status 1:

- weights above the GPU less the runtime: torch.OutOfMemoryError (loading the weights);
- the profile run's activation peak above what is left: torch.OutOfMemoryError (the profile
  run); without chunked prefill max_num_batched_tokens is at least max_model_len, so a long
  context cannot start;
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
max_num_batched_tokens 4096, dtype half, tp 4) with the deploy's allocator options
(garbage_collection_threshold:0.8,max_split_size_mb:512): weights 10, activation peak 2.25,
KV cache 17.40 GiB: 285,072 tokens, 1.11 sequences of 256000 ("Maximum concurrency ... 1.11x"
in the log). At max_model_len 256000 the utilization must be at least

    max_num_batched_tokens          2048     4096     8192
    the deploy's options            0.860    0.895    0.965
    with expandable_segments:True   0.856    0.887    0.949
    no options                      0.864    0.903    never (above 0.96875)

so Sub168's 4096 start at 0.90 and not at 0.89 on the deploy's options, 0.85 holds no
256000-token sequence with any of them, and 8192 batched tokens start at 0.95 only with
expandable segments.

Sequences and the queue
-----------------------

Each choice of a request is one sequence; a request runs as many sequences as it has choices,
at most max_num_seqs (the cap keeps a request the base serves from waiting forever). Requests
begin first come first served at the start of a step (engine_steps.EngineSteps): the first in
line when its sequences are free among --max-num-seqs slots, its tokens (prompt plus every
choice's answer, the choices sharing the prompt) free in the KV cache (at most the whole cache:
a request larger than it runs alone), and, with chunked prefill, some of the step's token budget
left; a later request never overtakes a waiting one, even one that would fit. The real engine
holds a prompt's blocks and grows them as it decodes, preempting when the cache is full; the
stand-in, knowing the answer's length, holds them all from the start and never preempts. The
stand-in's own time computing the answer is spent inside the model's time, not added to it.
(For /v1/completions with several prompts, the prompt tokens are all of them.)

The steps
---------

The engine works in steps, as vLLM's does (engine_steps.py plays them). In a step every running
sequence whose prompt is read makes one token, and prompt tokens still to read take their share
of the step's budget of --max-num-batched-tokens:

- with chunked prefill the decoding sequences take one token of the budget each, then the
  prompts still to read take the rest, in the order their requests began (a prompt longer than
  what is left is read over several steps: chunks);
- without it, as V0's scheduler: the prompts that can begin are read whole in a step of their
  own (as many as the budget holds, one at least), and no sequence decodes in it.

A step takes

    decode part    (1 + alpha x (n - 1)) / decode_tps     n sequences decoding, alpha =
                                                          BATCH_SLOWDOWN = 0.2
    read part      STEP_SECONDS + q / prefill_tps         q prompt tokens read in it,
                                                          STEP_SECONDS = 8 ms

each part only when the step has such tokens. The step that reads a prompt's last token makes
its first. So a decode step grows with the batch towards compute bound, where each sequence
slows as the batch makes more tokens (n = 1, 2, 4, 8: 1, 1.67, 2.5, 3.33 times one sequence's
tokens); and a prompt read beside decoding sequences delays their next token by its chunk's
time: a larger budget reads a prompt in fewer steps, which pay STEP_SECONDS fewer times (TTFT
down, more throughput) and each hold the decoding sequences longer (the gap between their
tokens up), where a smaller one lets them make a token in every shorter step.

A request alone
---------------

Prefill: a prompt of p tokens is read in ceil(p / chunk) steps, chunk the budget with chunked
prefill, else the whole prompt:

    ceil(p / chunk) x STEP_SECONDS + p / prefill_tps  seconds

(the first token is made then; prompt tokens as usage reports them, the chat template's
included). Larger chunks are faster up to the prompt's length, and a chunk larger than the
prompt gains nothing alone. Then one token every 1 / decode_tps seconds: token k (counted from
1) is made prefill + (k - 1) / decode_tps seconds after the start, as the steps make them.

Leaving
-------

A non-streamed answer leaves when the last token of its longest choice is made. A streamed
answer's chunks leave as their tokens are made: a choice's role chunk with its first token
(vLLM sends it when the first output arrives), its m content chunks spread evenly over its
tokens (the j-th with token ceil(j * tokens / m)), its finish chunk with its last token, and the
usage chunk after everything. A handler reads when its tokens are made from the engine's steps
projected until every request known is answered (engine_steps.LiveEngine); a request that
arrives later may move them later, never earlier, and the handler reads them again. Times are
those of the steps, never counted from the previous write, so a late wake-up does not push the
rest back (no drift): whatever is due by then leaves together, text deltas of one choice merged
into one chunk (the `text` of /v1/completions chunks likewise), as vLLM merges the outputs a slow
reader has not collected yet. Writes are at least WRITE_INTERVAL apart (the last one never
waits), which bounds the work per stream on a busy machine without moving the time the answer
ends. Usage counts tokens, so merged chunks change no figure a benchmark reports.

Rates (environment of the stand-in; a sequence running alone):

    BIV100_STANDIN_PREFILL_TPS   prompt tokens per second                   (default 200000)
    BIV100_STANDIN_DECODE_TPS    output tokens per second                   (default 6000)
    BIV100_STANDIN_STEP_SECONDS  what a step reading prompt tokens costs    (default 0.008)
                                 beside them

Noise. A real engine's steps do not all take the same time. With BIV100_STANDIN_JITTER = j (a
fraction, 0 <= j < 1, default 0: none), each step runs (1 + u) times as long as the rates say, u
drawn uniformly from [-j, +j] by a generator seeded with BIV100_STANDIN_SEED (an integer,
default 0) and the step's number, so that the same seed and load give the same draws.

Fragmentation
-------------

A long prompt (over FRAGMENTATION_PROMPT_TOKENS = 1024 tokens) asks, at its prefill, for one
block of 1.95 GiB. PyTorch's caching allocator splits its large cached blocks for smaller
requests unless told not to, so while one request with a long prompt runs, a second one that
begins finds no block that large: torch.OutOfMemoryError in the log, and the request fails as
it begins, "CUDA out of memory. Tried to allocate 1.95 GiB": a 500 when not streamed, the
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

predicted_score plays a bench on the same steps at once (engine_steps.closed_loop): `clients`
clients that each send the next request when the last is answered, from an idle engine; it gives
the weighted score (0.83 x output tokens/s + 0.17 x input tokens/s), every request's TTFT, TPOT
and E2E as vLLM's bench defines them, or what fails instead: the start, prompts beyond
max_model_len, or long prompts side by side on an allocator that fragments.

At the lab's rates (inventory/lab/group_vars/biv100.yml: 200000 and 6000) and Sub168, the
lab's default bench (files/bench/default.yml: 24 prompts of about 1024 tokens answered with 128
to 256 tokens, 8 in flight of which Sub168 runs two) is predicted at 10,503: 31 % above the
throughput gate's 8,000. Measured over loopback, each request also pays for its HTTP round trip
and the client's work (a few ms beside some 60 ms of simulated time); the gate sees about
10,000. A probe notices nothing (a 100-token answer takes about 25 ms, a 12,000-token prompt
0.1 s). The same load at max_num_seqs 1, 4, 8 scores 7,442, 13,530 and 15,679: throughput grows
with the sequences side by side, and so does the time per output token.

The optimum. With a latency limit the best setting lies inside the space. The tuning tests'
bench (tests/integration/data/long_prompts.yml: 16 prompts of about 7,000 tokens answered with
256, 8 in flight) over the shipped space (files/tune/default.yml) at gpu_memory_utilization 0.95
scores, with expandable segments (without them 8192 batched tokens do not start):

    max_num_seqs   2048 batched tokens    4096                   8192
    2              15,811  TPOT p99 0.41  18,301  0.40          20,454  0.37
    4              17,491           0.97  20,747  0.87          23,355  0.77
    8              18,458           2.10  22,485  1.76          25,354  1.57

Under a TPOT p99 limit of 1.2 ms (the tuning test's) eight sequences are out, and the best is
max_num_seqs 4 with 8192 batched tokens and expandable segments, 12 % above the next (max_num_seqs
4 at 4096, and 2 at 8192); test_tune.py asserts the tuner finds it. Without a limit, more
sequences side by side always score more at a fixed load: the stand-in never preempts.
"""

import collections
import math
import random
import time

from . import engine_steps, memory_model, settings, startup
from .engine_steps import STEP_SECONDS

PREFILL_TPS_VARIABLE = "BIV100_STANDIN_PREFILL_TPS"
DECODE_TPS_VARIABLE = "BIV100_STANDIN_DECODE_TPS"
STEP_SECONDS_VARIABLE = "BIV100_STANDIN_STEP_SECONDS"
JITTER_VARIABLE = "BIV100_STANDIN_JITTER"
SEED_VARIABLE = "BIV100_STANDIN_SEED"
BREAK_VARIABLE = "BIV100_STANDIN_BREAK"
DEFAULT_PREFILL_TPS = 200000.0
DEFAULT_DECODE_TPS = 6000.0
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
    """A sequence's speed alone: prefill and decode tokens per second, a reading step's cost,
    and the steps' noise (engine_steps.py plays the steps with them)."""

    def __init__(self, prefill_tps=DEFAULT_PREFILL_TPS, decode_tps=DEFAULT_DECODE_TPS, jitter=0.0,
                 seed=0, step_seconds=STEP_SECONDS):
        self.prefill_tps = float(prefill_tps)
        self.decode_tps = float(decode_tps)
        self.jitter = float(jitter)
        self.seed = int(seed)
        self.step_seconds = float(step_seconds)

    @classmethod
    def from_environ(cls, environ):
        return cls(_rate(environ, PREFILL_TPS_VARIABLE, DEFAULT_PREFILL_TPS),
                   _rate(environ, DECODE_TPS_VARIABLE, DEFAULT_DECODE_TPS),
                   _jitter(environ), _seed(environ),
                   _setting(environ, STEP_SECONDS_VARIABLE, STEP_SECONDS, float,
                            lambda value: 0 <= value < 1, "a number of seconds in [0, 1)"))

    def stretch(self, step):
        """How much longer (or shorter) step number `step` runs than the rates say: 1 + u, u drawn
        uniformly from [-jitter, +jitter] by a generator seeded with the seed and the step's
        number, so that the same seed and load give the same draws."""
        if not self.jitter:
            return 1.0
        return 1.0 + random.Random(self.seed * 1000003 + step).uniform(-self.jitter, self.jitter)

    def __repr__(self):
        noise = f", jitter={self.jitter:g}, seed={self.seed}" if self.jitter else ""
        return (f"Rates(prefill_tps={self.prefill_tps:g}, decode_tps={self.decode_tps:g}"
                f", step_seconds={self.step_seconds:g}{noise})")


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


def weighted_score(input_tps, output_tps):
    return OUTPUT_WEIGHT * output_tps + INPUT_WEIGHT * input_tps


def engine_for(engine, plan, rates, environ, start=0.0):
    """The EngineSteps of a stand-in run with these settings (settings.EngineSettings), its
    memory (memory_model.MemoryPlan), rates and environment."""
    fragments = (environ.get(BREAK_VARIABLE) == "fragmentation"
                 or memory_model.allocator_fragments(engine.allocator_conf))
    return engine_steps.EngineSteps(rates, engine.max_num_seqs, engine.max_num_batched_tokens,
                                    engine.chunked_prefill, plan.kv_tokens, fragments,
                                    memory_model.fragmentation_message(), start=start)


def work_of(prompt_tokens, choice_tokens, max_num_seqs):
    """The engine's Work for a request of these tokens (every choice's completion tokens)."""
    return engine_steps.Work(prompt_tokens, choice_tokens, sequences_of(len(choice_tokens), max_num_seqs),
                             prompt_tokens + sum(choice_tokens), memory_model.is_long_prompt(prompt_tokens))


# `latencies` is {"ttft_ms", "tpot_ms", "e2e_ms": every request's, in ms, as vLLM's bench
# defines them}; `refused` the message of what fails instead of the bench, else None.
Prediction = collections.namedtuple("Prediction", "score input_tps output_tps latencies refused")

# The requests a prediction plays when not told: the lab's default bench measures 24.
PREDICTED_REQUESTS = 24


def predicted_score(engine_args, prompt_tokens, output_tokens, environ=None, model_config=None,
                    concurrency=None, requests=PREDICTED_REQUESTS):
    """What a bench measures on a stand-in launched with `engine_args` (snake_case, as the
    engine role takes them) and `environ` (its environment: the BIV100_STANDIN_* rates,
    PYTORCH_CUDA_ALLOC_CONF), serving `model_config` (default: the lab's Qwen3.5): `concurrency`
    clients (default max_num_seqs) that each send the next request when the last is answered,
    `requests` of them, of `prompt_tokens` and `output_tokens` (one number, or a list the
    requests take in turn), from an idle engine, played by the engine's own steps.

    A Prediction: the weighted score and its rates, every request's latencies, and `refused`,
    the message of what fails instead (the start, or the bench's requests), else None.
    """
    environ = dict(environ or {})
    model_config = memory_model.LAB_QWEN3_5_CONFIG if model_config is None else model_config
    outputs = list(output_tokens) if isinstance(output_tokens, (list, tuple)) else [output_tokens]
    failed = Prediction(None, None, None, None, None)
    try:
        engine = settings.from_engine_args(engine_args, model_config, environ)
        plan = memory_model.MemoryPlan(memory_model.ModelShape.from_config(model_config), engine)
        plan.check()
        rates = Rates.from_environ(environ)
    except (startup.StartupError, memory_model.StartFailure, RateError) as error:
        return failed._replace(refused=str(error))
    if prompt_tokens + max(outputs) > engine.max_model_len:
        return failed._replace(refused=(
            f"This model's maximum context length is {engine.max_model_len} tokens: a request "
            f"of {prompt_tokens} + {max(outputs)} tokens is refused"))
    steps = engine_for(engine, plan, rates, environ)
    works = [work_of(prompt_tokens, [outputs[number % len(outputs)]], engine.max_num_seqs)
             for number in range(requests)]
    measured = engine_steps.closed_loop(steps, works, engine.max_num_seqs if concurrency is None else concurrency)
    refused = [work.failed[1] for work in measured.works if work.failed]
    if refused:
        return failed._replace(refused=(
            f"{refused[0]}: prompts over {memory_model.FRAGMENTATION_PROMPT_TOKENS} tokens side by "
            f"side on an allocator that fragments (PYTORCH_CUDA_ALLOC_CONF={engine.allocator_conf!r})"))
    input_tps, output_tps = measured.input_tokens / measured.seconds, measured.output_tokens / measured.seconds
    latencies = {"ttft_ms": [1000 * (work.times[0] - work.arrived) for work in measured.works],
                 # vLLM's bench leaves out a request of one token, which has no time per token.
                 "tpot_ms": [1000 * (work.times[-1] - work.times[0]) / (len(work.times) - 1)
                             for work in measured.works if len(work.times) > 1],
                 "e2e_ms": [1000 * (work.times[-1] - work.arrived) for work in measured.works]}
    return Prediction(weighted_score(input_tps, output_tps), input_tps, output_tps, latencies, None)


def percentile(values, share):
    """numpy's default (linear) percentile, as vLLM's bench computes its p99."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = (len(ordered) - 1) * share / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ---- a streamed answer's chunks on the schedule ----------------------------------------------

def stream_schedule(chunks, choice_tokens):
    """[(token, the choice's tokens out by then, chunk)] in the order the chunks leave: each
    chunk leaves once its choice's token `token` (from 1) is made.

    `chunks` are a streamed answer's chunk objects in the order the answer writes them,
    `choice_tokens` every choice's completion tokens; the chunks after the choices' (usage) wait
    for the last token of the longest.
    """
    # The finish chunk carries the choice's last delta (chat.stream_chunks): it is the last of
    # the chunks the choice's tokens are spread over, due with the last token.
    deltas = collections.Counter(_choice_index(chunk) for chunk in chunks
                                 if _kind(chunk) == "delta"
                                 or (_kind(chunk) == "finish" and chunk["choices"][0].get("delta")))
    seen = collections.Counter()
    last = max(choice_tokens or [1])
    planned = []
    for order, chunk in enumerate(chunks):
        kind = _kind(chunk)
        if kind == "after":
            token, out = last, None
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
        planned.append((max(token, 1), order, out, chunk))
    planned.sort(key=lambda entry: entry[:2])
    return [(token, out, chunk) for token, _order, out, chunk in planned]


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


def paced(schedule, due, write_interval=WRITE_INTERVAL, clock=time.monotonic, sleep=time.sleep):
    """Batches of a schedule's entries, each yielded when its entries are due.

    `schedule` is [(token, ...)] sorted by token, `due(token)` the clock's time at which the
    token is made (it may move later between calls, never earlier: a request that arrives
    meanwhile is read in steps the others wait for). Every entry due by a wake-up goes in that
    wake-up's batch; after a batch the next wake-up is at least `write_interval` later, except
    for the last entry, which waits for nothing but its own time. `sleep(seconds)` may return
    early (LiveEngine.wait wakes at every arrival): the times are read again.
    """
    position, not_before = 0, None
    while position < len(schedule):
        now = clock()
        final_due = due(schedule[-1][0])
        wake = min(max(due(schedule[position][0]), not_before or 0.0), final_due)
        if now < wake:
            sleep(wake - now)
            continue
        end = position
        while end < len(schedule) and due(schedule[end][0]) <= now:
            end += 1
        if end == position:
            continue  # an arrival moved the entry later since `wake` was read
        yield schedule[position:end]
        position = end
        not_before = now + write_interval


def wait_until(deadline, clock=time.monotonic, sleep=time.sleep):
    """Return once the time `deadline()` names (which may move later) has passed."""
    while True:
        left = deadline() - clock()
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
