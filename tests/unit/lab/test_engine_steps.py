"""The engine's steps, played in their own time: no clock of the machine's, nothing timed."""

import threading

import pytest
from engine_standin import speed_model
from engine_standin.engine_steps import BATCH_SLOWDOWN, EngineSteps, LiveEngine, Work, closed_loop

# Round numbers: a prompt token costs 1 ms, a step with prompt tokens 10 ms more, a decode step
# of one sequence 10 ms.
RATES = speed_model.Rates(prefill_tps=1000, decode_tps=100, step_seconds=0.01)


def engine(max_num_seqs=4, budget=1000, chunked=True, kv_tokens=100000, **options):
    return EngineSteps(RATES, max_num_seqs, budget, chunked, kv_tokens, **options)


def request(prompt, *outputs, sequences=1, long_prompt=False):
    return Work(prompt, list(outputs) or [1], sequences, prompt + sum(outputs or [1]), long_prompt)


def test_a_request_alone_is_read_in_chunks_each_paying_the_step_then_decodes_a_token_a_step():
    steps = engine(budget=200)
    alone = request(500, 11)
    steps.add(alone)
    steps.run_out()
    # Three steps read the prompt (200, 200, 100 tokens); the last makes the first token.
    assert alone.times[0] == pytest.approx(3 * 0.01 + 0.5)
    assert alone.times[1:] == pytest.approx([0.53 + k * 0.01 for k in range(1, 11)])
    # The time of a request alone: its reading steps, then a decode interval a token.
    assert alone.times[-1] == pytest.approx(3 * 0.01 + 500 / 1000 + 10 / 100)
    # A chunk larger than the prompt gains nothing; without chunked prefill a prompt is one step.
    for budget, chunked in ((500, True), (4096, True), (4096, False)):
        whole = request(500, 11)
        other = engine(budget=budget, chunked=chunked)
        other.add(whole)
        assert other.run_out() and whole.times[0] == pytest.approx(0.51)


def test_a_decode_step_grows_with_the_batch_and_the_batch_makes_more_tokens_for_it():
    for sequences in (1, 2, 4, 8):
        steps = engine(max_num_seqs=8, budget=100000)
        works = [request(0, 101) for _sequence in range(sequences)]
        for work in works:
            steps.add(work)
        steps.run_out()
        step = (1 + 0.2 * (sequences - 1)) / 100
        assert all(work.times[-1] - work.times[0] == pytest.approx(100 * step) for work in works)
    # Eight sequences make 8 / 2.4 = 3.33 times one's tokens, each at 1 / 2.4 of its speed.
    assert BATCH_SLOWDOWN == 0.2


def test_a_prompt_read_beside_decoding_sequences_delays_their_next_token_by_its_chunk():
    def decoder_and_newcomer(budget):
        steps = engine(budget=budget)
        decoder = request(0, 200)
        steps.add(decoder)
        steps.run_until(0.5)  # it decodes alone
        newcomer = request(800, 10)
        steps.add(newcomer)
        steps.run_out()
        gaps = [later - earlier for earlier, later in zip(decoder.times, decoder.times[1:])]
        made = sum(1 for time in decoder.times if newcomer.arrived < time <= newcomer.times[0])
        return max(gaps), newcomer.times[0] - newcomer.arrived, made

    big_gap, big_ttft, big_made = decoder_and_newcomer(budget=1000)
    small_gap, small_ttft, small_made = decoder_and_newcomer(budget=201)
    # A budget of 1000 reads the 800 tokens in one step: the decoder's token waits for all of
    # them (0.8 s and the step's 10 ms beside its own 10 ms).
    assert big_gap == pytest.approx(0.01 + 0.01 + 0.8)
    # A budget of 201 is one decode token and 200 prompt tokens a step: four shorter gaps.
    assert small_gap == pytest.approx(0.01 + 0.01 + 0.2)
    # Inter-token latency down with a smaller budget, TTFT up (more steps, each paying 10 ms).
    assert small_gap < big_gap and small_ttft > big_ttft
    assert small_ttft == pytest.approx(4 * (0.01 + 0.01 + 0.2))
    # The decoder made a token in each of those steps, and one only beside the single read.
    assert (small_made, big_made) == (4, 1)


def test_without_chunked_prefill_a_prompt_is_read_in_a_step_of_its_own():
    steps = engine(budget=4096, chunked=False)
    decoder = request(0, 100)
    steps.add(decoder)
    steps.run_until(0.205)  # 20 tokens made, the 21st due at 0.21
    newcomer = request(800, 10)
    steps.add(newcomer)
    steps.run_out()
    assert newcomer.times[0] == pytest.approx(0.21 + 0.01 + 0.8)
    # No token of the decoder is made in the newcomer's step.
    assert not [time for time in decoder.times if 0.2101 < time < 1.0199]


def test_requests_begin_first_come_first_served_within_max_num_seqs_and_the_kv_cache():
    steps = engine(max_num_seqs=2, kv_tokens=1000)
    first, second, large, small = request(10, 100), request(10, 100), request(600, 10), request(10, 10)
    for work in (first, second, large, small):
        steps.add(work)
    steps.step()
    assert (steps.sequences_used, len(steps.waiting)) == (2, 2)
    steps.run_out()
    # The large one (610 tokens) waits for both slots' worth of cache; the small one, which
    # would fit beside the first two's 220 tokens, does not overtake it.
    assert large.started == pytest.approx(max(first.times[-1], second.times[-1]))
    assert small.started >= large.started
    # A request of several choices takes a slot each, within max_num_seqs.
    assert [speed_model.sequences_of(n, 2) for n in (1, 2, 3)] == [1, 2, 2]


def test_a_request_larger_than_the_cache_runs_alone():
    steps = engine(kv_tokens=500)
    huge, after = request(1000, 5), request(10, 5)
    steps.add(huge)
    steps.add(after)
    steps.run_out()
    assert huge.failed is None and after.started >= huge.times[-1]


def test_a_long_prompt_beside_another_fails_as_it_begins_on_an_allocator_that_fragments():
    steps = engine(fragments=True, fragmentation_message="CUDA out of memory")
    first, second = request(2000, 5, long_prompt=True), request(2000, 5, long_prompt=True)
    steps.add(first)
    steps.add(second)
    steps.run_out()
    # The second begins once the first's prompt is read (the budget went to it until then).
    assert first.failed is None and second.failed == (second.started, "CUDA out of memory")
    assert second.started == pytest.approx(first.times[0])
    # One at a time, or short prompts, never fail.
    alone = engine(max_num_seqs=1, fragments=True)
    works = [request(2000, 5, long_prompt=True) for _work in range(2)]
    for work in works:
        alone.add(work)
    alone.run_out()
    assert all(work.failed is None for work in works)


def test_an_idle_engine_waits_and_the_steps_begun_before_a_moment_are_played():
    steps = engine()
    steps.run_until(5.0)
    assert steps.now == 5.0 and steps.idle
    work = request(500, 100)
    steps.add(work)
    steps.run_until(5.3)
    # The read step (0.51 s) began before 5.3 and is played whole; the decode steps begun
    # before 5.3 are not, as none has.
    assert steps.now == pytest.approx(5.51) and len(work.times) == 1
    steps.run_until(5.555)
    assert len(work.times) == 6 and steps.now == pytest.approx(5.56)


def test_a_closed_loop_measures_what_the_steps_make():
    measured = closed_loop(engine(max_num_seqs=2), [request(500, 11) for _request in range(4)], clients=2)
    assert (measured.input_tokens, measured.output_tokens) == (2000, 44)
    # The first two read in one step (1000 tokens, 1.01 s), then decode together ten steps of
    # 12 ms; the next two likewise.
    assert measured.seconds == pytest.approx(2 * (1.01 + 10 * 0.012))
    # Clients beyond max_num_seqs only wait: the engine is no faster.
    more = closed_loop(engine(max_num_seqs=2), [request(500, 11) for _request in range(4)], clients=4)
    assert more.seconds == pytest.approx(measured.seconds)


def test_a_seed_repeats_the_steps_noise_within_its_jitter():
    def ends(seed):
        noisy = speed_model.Rates(1000, 100, jitter=0.1, seed=seed, step_seconds=0.01)
        steps = EngineSteps(noisy, 4, 1000, True, 100000)
        works = [request(100, 50) for _work in range(3)]
        for work in works:
            steps.add(work)
        steps.run_out()
        return [work.times[-1] for work in works]

    quiet = engine()
    works = [request(100, 50) for _work in range(3)]
    for work in works:
        quiet.add(work)
    quiet.run_out()
    assert ends(1) == ends(1) and ends(1) != ends(2)
    assert all(0.9 * base <= noisy <= 1.1 * base for noisy, base in zip(ends(1), [w.times[-1] for w in works]))
    assert len({speed_model.Rates(jitter=0.1, seed=3).stretch(step) for step in range(200)}) == 200
    assert all(0.9 <= speed_model.Rates(jitter=0.1, seed=3).stretch(step) <= 1.1 for step in range(200))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_later_arrival_moves_a_live_requests_tokens_later_never_earlier_and_wakes_its_waiter():
    clock = FakeClock()
    live = LiveEngine(engine(), clock=clock)
    first = live.submit(request(0, 100))
    before = list(live.work(first).times)
    assert before[-1] == pytest.approx(1.0)
    waiting, woke = threading.Event(), threading.Event()

    class Watched(threading.Condition):
        def wait(self, timeout=None):
            waiting.set()  # with the lock held: no arrival gets in before this wait begins
            return super().wait(timeout)

    live._changed = Watched()

    def waiter():
        live.wait(60)
        woke.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    # The arrival once the waiter waits: one before would leave it asleep for its 60 s, however
    # slowly the machine starts the thread.
    assert waiting.wait(30)
    clock.now = 0.5
    second = live.submit(request(800, 10))
    assert woke.wait(30)  # long before the 60 s: the arrival woke it
    thread.join(30)
    after = live.work(first).times
    assert all(later >= earlier - 1e-12 for earlier, later in zip(before, after))
    assert after[-1] > before[-1]
    # The gauges: both run at 0.6; the first is done by 2.0 and the second too.
    clock.now = 0.6
    assert live.gauges()[:2] == (2, 0)
    live.done(first)
    live.done(second)
    clock.now = 2.0
    assert live.gauges() == (0, 0, 0)
