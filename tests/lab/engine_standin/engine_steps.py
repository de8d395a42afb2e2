"""The engine's steps: which requests run, what each step computes, and when each token is made.

vLLM's engine works in steps, each one forward pass over a batch: every running sequence whose
prompt is read makes one token (it decodes), and prompts still to read take their share of the
step's token budget (--max-num-batched-tokens). EngineSteps plays those steps in a time of its
own, in seconds: the same code answers the stand-in's requests (LiveEngine, on the machine's
clock) and predicts what a bench measures (closed_loop, at once). speed_model.py's docstring
gives the rules and the figures they make; this module is their code.

A Work is one request: its prompt's tokens, the tokens each choice makes, the sequences and KV
cache tokens it holds while it runs. Its choices make their tokens in step: `times[k - 1]` is
when token k of each choice still going was made.
"""

import collections
import copy
import threading
import time

# What a step with prompt tokens in it costs beside them.
STEP_SECONDS = 0.008
# alpha: a decode step of n sequences takes (1 + alpha (n - 1)) times one sequence's.
BATCH_SLOWDOWN = 0.2


class Work:
    """A request in the engine, and what it has done so far."""

    def __init__(self, prompt_tokens, outputs, sequences=1, kv_tokens=0, long_prompt=False):
        self.prompt_tokens = max(int(prompt_tokens), 0)
        self.outputs = [max(int(tokens), 1) for tokens in outputs] or [1]  # a sequence makes one at least
        self.sequences = max(int(sequences), 1)
        self.kv_tokens = max(int(kv_tokens), 0)
        self.long_prompt = long_prompt
        self.key = None  # set by EngineSteps.add
        self.arrived = None
        self.started = None  # when it began to run
        self.read = 0  # prompt tokens read
        self.times = []
        self.failed = None  # (when, why) for a request that failed as it began to run

    @property
    def finished(self):
        return self.failed is not None or (self.started is not None and len(self.times) >= max(self.outputs))

    def ended_at(self):
        if self.failed is not None:
            return self.failed[0]
        return self.times[-1] if self.finished else None

    def decoding(self):
        """The sequences that make a token in the next step: those of the choices still going."""
        if self.read < self.prompt_tokens or self.finished:
            return 0
        made = len(self.times)
        return min(self.sequences, sum(1 for tokens in self.outputs if tokens > made))

    def token_time(self, token):
        """When token `token` (from 1) of a choice was made, None when it is not yet."""
        index = max(token, 1) - 1
        return self.times[index] if index < len(self.times) else None


class EngineSteps:
    """The engine's state at `now`, the end of the last step, and its next steps.

    Requests run first come first served, as vLLM's scheduler takes them: the first in line
    begins when a step starts with its sequences free among max_num_seqs and its tokens (the
    prompt and every choice's answer) free in the KV cache (a request larger than the cache runs
    alone), and, with chunked prefill, some of the step's token budget left; no later request
    goes before it. It holds them until its last token. The stand-in knows each answer's length,
    so it holds the answer's blocks from the start and is never preempted, where vLLM grows them
    as it decodes and preempts when the cache is full.

    With chunked prefill (`chunked`), a step's budget of `token_budget` tokens goes to the
    decoding sequences first, one token each, then to the prompts still to read, in the order
    their requests began. Without it, as vLLM's V0 scheduler without chunked prefill: the prompts
    that can begin are read whole in a step of their own (as many as the budget holds, one at
    least), and the other steps decode.
    """

    def __init__(self, rates, max_num_seqs, token_budget, chunked=True, kv_tokens=None, fragments=False,
                 fragmentation_message="", slowdown=BATCH_SLOWDOWN, start=0.0):
        self.rates = rates
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.chunked = chunked
        self.kv_tokens = kv_tokens
        self.fragments = fragments
        self.fragmentation_message = fragmentation_message
        self.slowdown = slowdown
        self.now = float(start)
        self.steps = 0  # steps played, which number each step's draw of the noise
        self.waiting = collections.deque()
        self.running = []
        self.works = {}
        self.sequences_used = 0
        self.tokens_used = 0
        self._last_key = 0

    # ---- requests -----------------------------------------------------------------------------

    def add(self, work):
        """A request arriving now: it is in line for the next step."""
        self._last_key += 1
        work.key = self._last_key
        work.arrived = self.now
        self.waiting.append(work)
        self.works[work.key] = work
        return work.key

    def forget(self, key):
        """Drop a request's record (the request itself runs on until it is answered)."""
        self.works.pop(key, None)

    def _claim(self, work):
        return min(work.sequences, self.max_num_seqs), min(work.kv_tokens, self.kv_tokens or 0)

    def _fits(self, work):
        sequences, tokens = self._claim(work)
        return (self.sequences_used + sequences <= self.max_num_seqs
                and self.tokens_used + tokens <= (self.kv_tokens or 0))

    def _begin(self):
        """The first in line begins to run; a long prompt beside another on an allocator that
        fragments fails at once instead (memory_model.py). True when it runs."""
        work = self.waiting.popleft()
        work.started = self.now
        if self.fragments and work.long_prompt and any(other.long_prompt for other in self.running):
            work.failed = (self.now, self.fragmentation_message)
            return False
        sequences, tokens = self._claim(work)
        self.sequences_used += sequences
        self.tokens_used += tokens
        self.running.append(work)
        return True

    def _retire(self):
        for work in [work for work in self.running if work.finished]:
            self.running.remove(work)
            sequences, tokens = self._claim(work)
            self.sequences_used -= sequences
            self.tokens_used -= tokens

    # ---- steps ---------------------------------------------------------------------------------

    @property
    def idle(self):
        return not self.running and not self.waiting

    def decode_seconds(self, sequences):
        return (1.0 + self.slowdown * max(sequences - 1, 0)) / self.rates.decode_tps

    def read_seconds(self, tokens):
        return self.rates.step_seconds + tokens / self.rates.prefill_tps

    def step(self, before=None):
        """Run the next step; when it only decodes, the same step again until a choice ends or
        (with `before`) until one would start at `before` or later."""
        state = (self.steps, len(self.waiting), len(self.running))
        reads = self._reads()
        decoders = [] if (reads and not self.chunked) else [work for work in self.running if work.decoding()]
        if reads:
            self._play(decoders, reads)
        elif decoders:
            self._decode_run(decoders, before)
        self._retire()
        if not self.idle and (self.steps, len(self.waiting), len(self.running)) == state:
            # Nothing could go on: a loop over the steps would never end.
            raise RuntimeError(f"the engine's steps are stuck: {len(self.waiting)} waiting, "
                               f"{len(self.running)} running")

    def _reads(self):
        """[(request, prompt tokens read)] of the next step; the requests that begin in it begin."""
        if not self.chunked:
            reads = []
            while self.waiting and self._fits(self.waiting[0]) and (
                    not reads or sum(take for _work, take in reads) + self.waiting[0].prompt_tokens
                    <= self.token_budget):
                work = self.waiting[0]
                if self._begin():
                    reads.append((work, work.prompt_tokens))
            return reads
        budget = max(self.token_budget - sum(work.decoding() for work in self.running), 0)
        reads = []
        for work in self.running:
            if budget and work.read < work.prompt_tokens:
                take = min(work.prompt_tokens - work.read, budget)
                reads.append((work, take))
                budget -= take
        while budget and self.waiting and self._fits(self.waiting[0]):
            work = self.waiting[0]
            if self._begin() and work.prompt_tokens:
                take = min(work.prompt_tokens, budget)
                reads.append((work, take))
                budget -= take
        return reads

    def _play(self, decoders, reads):
        decoding = sum(work.decoding() for work in decoders)
        seconds = ((self.decode_seconds(decoding) if decoding else 0.0)
                   + self.read_seconds(sum(take for _work, take in reads)))
        self._advance(seconds)
        for work in decoders:
            work.times.append(self.now)
        for work, take in reads:
            work.read += take
            if work.read >= work.prompt_tokens:
                work.times.append(self.now)  # the step that reads a prompt's end makes its first token

    def _decode_run(self, decoders, before):
        """The same decode step, repeated until a choice ends (which changes the batch): the steps
        in between change nothing else, and are played at once."""
        seconds = self.decode_seconds(sum(work.decoding() for work in decoders))
        repeats = min(min(tokens for tokens in work.outputs if tokens > len(work.times)) - len(work.times)
                      for work in decoders)
        for repeat in range(repeats):
            if repeat and before is not None and self.now >= before:
                break
            self._advance(seconds)
            for work in decoders:
                work.times.append(self.now)

    def _advance(self, seconds):
        self.steps += 1
        self.now += seconds * self.rates.stretch(self.steps)

    def run_until(self, moment):
        """Every step that starts before `moment`; an idle engine waits until then."""
        while not self.idle and self.now < moment:
            self.step(before=moment)
        self.now = max(self.now, moment)

    def run_out(self):
        """Every step until the requests known are answered."""
        while not self.idle:
            self.step()
        return self


# ---- a bench, played at once ------------------------------------------------------------------

Measured = collections.namedtuple("Measured", "seconds input_tokens output_tokens works")


def closed_loop(engine, requests, clients):
    """What `clients` clients measure that each send the next of `requests` (Work objects, in
    order) when their last is answered, from the engine's `now`: the seconds from the first
    request to the last answer, the tokens, and the works answered (their times filled in)."""
    pending = collections.deque(requests)
    begun = engine.now
    in_flight = []
    for _client in range(min(clients, len(pending))):
        in_flight.append(pending.popleft())
        engine.add(in_flight[-1])
    done = []
    while in_flight:
        engine.step()
        for work in [work for work in in_flight if work.finished]:
            in_flight.remove(work)
            done.append(work)
            if pending:
                # The client sends its next request as the answer ends: at the end of this step.
                in_flight.append(pending.popleft())
                engine.add(in_flight[-1])
    answered = [work for work in done if work.failed is None]
    seconds = max((work.ended_at() for work in done), default=begun) - begun
    return Measured(seconds, sum(work.prompt_tokens for work in answered),
                    sum(sum(work.outputs) for work in answered), done)


# ---- the same steps on the machine's clock ----------------------------------------------------

class LiveEngine:
    """EngineSteps on the machine's clock, for the stand-in's request handlers.

    A request joins at the arrival's moment; the steps up to it are played then, and the rest
    projected on a copy until every known request is answered: a handler reads when its tokens
    are due from the projection. A later arrival may push them later (its prompt is read in
    steps the others wait for), never earlier, so a handler that waits wakes at every arrival
    and reads them again; a token is never written before it is due.
    """

    def __init__(self, engine, clock=time.monotonic):
        self._clock = clock
        self._engine = engine
        engine.now = clock()
        self._projection = copy.deepcopy(engine)
        self._changed = threading.Condition()

    def submit(self, work, arrived=None):
        """The request's key, once it is in line: as of `arrived` (the clock's time it came),
        unless the engine has played a step begun since."""
        with self._changed:
            self._engine.run_until(self._clock() if arrived is None else arrived)
            key = self._engine.add(work)
            self._project()
            self._changed.notify_all()
        return key

    def _project(self):
        self._projection = copy.deepcopy(self._engine).run_out()

    def work(self, key):
        """The request as the projection has it: when it begins, fails, and makes each token."""
        with self._changed:
            return self._projection.works[key]

    def wait(self, seconds):
        """Sleep `seconds`, or until a request arrives."""
        with self._changed:
            self._changed.wait(max(seconds, 0.0))

    def done(self, key):
        """A handler is through with its request."""
        with self._changed:
            self._engine.run_until(self._clock())
            self._engine.forget(key)
            self._projection.forget(key)

    def gauges(self):
        """(requests running, requests waiting, KV cache tokens held) now."""
        with self._changed:
            moment, projection = self._clock(), self._projection
            works = list(projection.works.values())
        running = [work for work in works if _runs_at(work, moment)]
        waiting = sum(1 for work in works if work.started is None or work.started > moment)
        return len(running), waiting, sum(projection._claim(work)[1] for work in running)

    def clock(self):
        return self._clock()


def _runs_at(work, moment):
    if work.failed is not None or work.started is None or work.started > moment:
        return False
    ended = work.ended_at()
    return ended is None or ended > moment
