"""The stand-in's speed model, its queue and the sampling extras a load generator relies on:
the arithmetic as pure functions, then measured on a stand-in process over loopback."""

import http.client
import json
import threading
import time

import pytest
from engine_standin import chat, engine_steps, sampling, speed_model
from engine_standin import simulated_model as model
from engine_standin.server import SIMULATED_HEADER

from standin_engines import ENGINE_FLAGS, SERVED, Engine, gauges_show, make_host

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


# ---- the arithmetic ------------------------------------------------------------------------------

def alone(prompt_tokens, output_tokens, rates, chunk=None):
    """A request alone in the engine, played by its steps: chunked prefill in `chunk` tokens a
    step, or without it the whole prompt in one."""
    steps = engine_steps.EngineSteps(rates, 1, chunk or prompt_tokens, chunk is not None, 10 ** 7)
    work = engine_steps.Work(prompt_tokens, [output_tokens], 1, prompt_tokens + output_tokens)
    steps.add(work)
    steps.run_out()
    return work, steps.steps


def test_token_due_is_prefill_then_one_token_per_decode_interval():
    rates = speed_model.Rates(prefill_tps=1000, decode_tps=100, step_seconds=0.004)
    work, _steps = alone(500, 11, rates)
    # One step: its cost, then the prompt's tokens; a token a decode interval after.
    assert work.times[0] == pytest.approx(0.504)
    assert work.times[10] == pytest.approx(0.604)
    assert work.times[-1] == pytest.approx(0.604)
    assert alone(500, 0, rates)[0].times == alone(500, 1, rates)[0].times  # one token at least


def test_a_prompt_is_prefilled_in_chunks_each_paying_the_step():
    rates = speed_model.Rates(prefill_tps=1000, decode_tps=100, step_seconds=0.01)

    def prefill(chunk):
        return alone(500, 1, rates, chunk)[0].times[0]

    assert alone(500, 1, rates, 200)[1] == 3
    assert prefill(200) == pytest.approx(3 * 0.01 + 0.5)
    assert prefill(None) == prefill(500) == pytest.approx(0.01 + 0.5)  # unchunked: one step
    # Larger chunks are faster up to the prompt's length; past it they gain nothing.
    seconds = [prefill(chunk) for chunk in (100, 128, 200, 256, 500, 1000, 4096)]
    assert seconds[:5] == sorted(seconds[:5], reverse=True) and len(set(seconds[:5])) == 5
    assert seconds[4:] == [seconds[4]] * 3


def test_rates_come_from_the_environment_with_defaults():
    defaults = speed_model.Rates.from_environ({})
    assert (defaults.prefill_tps, defaults.decode_tps) == (200000, 6000)
    assert defaults.step_seconds == speed_model.STEP_SECONDS
    assert speed_model.Rates.from_environ({"BIV100_STANDIN_STEP_SECONDS": "0.02"}).step_seconds == 0.02
    custom = speed_model.Rates.from_environ({"BIV100_STANDIN_PREFILL_TPS": "2000",
                                             "BIV100_STANDIN_DECODE_TPS": "250.5"})
    assert (custom.prefill_tps, custom.decode_tps) == (2000, 250.5)


@pytest.mark.parametrize("value", ["0", "-5", "fast", "inf", "nan"])
def test_rates_must_be_positive_numbers(value):
    with pytest.raises(speed_model.RateError, match="BIV100_STANDIN_DECODE_TPS"):
        speed_model.Rates.from_environ({"BIV100_STANDIN_DECODE_TPS": value})


def test_the_noise_and_its_seed_come_from_the_environment_with_none_by_default():
    quiet = speed_model.Rates.from_environ({})
    assert quiet.jitter == 0 and {quiet.stretch(step) for step in range(100)} == {1.0}
    noisy = speed_model.Rates.from_environ({"BIV100_STANDIN_JITTER": "0.1", "BIV100_STANDIN_SEED": "7"})
    assert (noisy.jitter, noisy.seed) == (0.1, 7) and noisy.stretch(1) != 1.0


@pytest.mark.parametrize(("name", "value"), [("BIV100_STANDIN_JITTER", "-0.1"), ("BIV100_STANDIN_JITTER", "1"),
                                             ("BIV100_STANDIN_JITTER", "lots"), ("BIV100_STANDIN_SEED", "1.5")])
def test_the_noise_must_be_a_fraction_and_its_seed_an_integer(name, value):
    with pytest.raises(speed_model.RateError, match=name):
        speed_model.Rates.from_environ({name: value})


def test_the_weighted_score_is_the_competitions():
    assert speed_model.weighted_score(1000, 100) == pytest.approx(0.83 * 100 + 0.17 * 1000)


def test_defaults_keep_probe_sized_requests_quick():
    rates = speed_model.Rates()
    assert alone(50, 110, rates, 4096)[0].times[-1] < 0.03
    assert alone(12300, 16, rates, 4096)[0].times[-1] < 0.35  # the long-prompt probes


class FakeClock:
    """time.monotonic and time.sleep of a machine that oversleeps by `late` seconds."""

    def __init__(self, late=0.0):
        self.now, self.late, self.sleeps = 0.0, late, 0

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps += 1
        self.now += seconds + self.late


def pace(dues, clock, interval=0.005, moved=None):
    """[(time yielded, [entries])] of paced() over entries whose tokens are due at `dues`;
    `moved(due, now)` may move a due time as the clock goes on."""
    schedule = [(token, token) for token in range(len(dues))]

    def due(token):
        return moved(dues[token], clock.now) if moved else dues[token]

    return [(clock.now, [index for _token, index in batch])
            for batch in speed_model.paced(schedule, due, interval, clock.clock, clock.sleep)]


def test_paced_yields_each_entry_when_due_and_groups_within_the_write_interval():
    batches = pace([0.0, 0.001, 0.002, 0.010, 0.0105, 0.020], FakeClock())
    assert [entries for _when, entries in batches] == [[0], [1, 2], [3], [4], [5]]
    assert [when for when, _entries in batches] == pytest.approx(
        [0.0, 0.005, 0.010, 0.015, 0.020])


def test_paced_does_not_drift_when_every_sleep_is_late():
    dues = [token / 1000 for token in range(200)]  # 1000 tokens/s for 0.2 s
    clock = FakeClock(late=0.003)
    batches = pace(dues, clock, interval=0.0)
    assert sorted(index for _when, entries in batches for index in entries) == list(range(200))
    # Each wake-up is 3 ms late, and the lateness does not add up: the last batch leaves at
    # most 3 ms after the last entry's due time, not 3 ms per wake-up later.
    assert 0.199 <= batches[-1][0] <= 0.199 + 0.003 + 1e-9
    assert len(batches) < 100  # late entries went together
    assert all(dues[index] <= when for when, entries in batches for index in entries)


def test_paced_reads_the_due_times_again_when_they_move_later():
    # From 0.05 on, every entry not yet due is 0.1 s later (a request arrived and is read first).
    dues = [0.0, 0.04, 0.08, 0.12]
    batches = pace(dues, FakeClock(), interval=0.0,
                   moved=lambda due, now: due + 0.1 if now >= 0.05 and due > 0.05 else due)
    assert [entries for _when, entries in batches] == [[0], [1], [2], [3]]
    assert [when for when, _entries in batches] == pytest.approx([0.0, 0.04, 0.18, 0.22])


def test_paced_holds_nothing_back_past_the_last_due_time():
    clock = FakeClock()
    batches = pace([0.0, 0.001], clock, interval=0.5)
    assert batches == [(0.0, [0]), (pytest.approx(0.001), [1])]


def role(index=0):
    return chunk(index, {"role": "assistant", "content": ""})


def chunk(index, delta, finish_reason=None):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": SERVED,
            "choices": [{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason, "stop_reason": None}]}


def test_stream_schedule_spreads_a_choices_chunks_over_its_tokens():
    usage = {"id": "chatcmpl-1", "choices": [], "usage": {}}
    chunks = [role(), *[chunk(0, {"content": f" w{k}"}) for k in range(4)],
              chunk(0, {}, "length"), usage]
    schedule = speed_model.stream_schedule(chunks, [8])
    # The role goes with token 1, the four deltas with tokens 2, 4, 6 and 8, the usage after all.
    assert [token for token, _out, _chunk in schedule] == [1, 2, 4, 6, 8, 8, 8]
    assert [out for _token, out, _chunk in schedule] == [0, 2, 4, 6, 8, 8, None]
    assert schedule[-1][2] is usage


def test_stream_schedule_counts_the_finish_chunks_delta_as_the_last_one():
    chunks = [role(), *[chunk(0, {"content": f" w{k}"}) for k in range(3)],
              chunk(0, {"content": " w3"}, "length")]
    schedule = speed_model.stream_schedule(chunks, [8])
    # As the answer whose finish chunk comes apart from its last delta: tokens 2, 4, 6 and 8.
    assert [token for token, _out, _chunk in schedule] == [1, 2, 4, 6, 8]
    assert [out for _token, out, _chunk in schedule] == [0, 2, 4, 6, 8]


def test_stream_schedule_interleaves_the_choices():
    chunks = [role(0), role(1), chunk(0, {"content": "a"}), chunk(0, {"content": "b"}),
              chunk(0, {}, "stop"), chunk(1, {"content": "c"}), chunk(1, {}, "stop")]
    order = [(entry["choices"][0]["index"], entry["choices"][0]["delta"].get("content"))
             for _token, _out, entry in speed_model.stream_schedule(chunks, [2, 1])]
    # Token 1: both roles, then a (choice 0's first of two deltas) and all of choice 1.
    assert order == [(0, ""), (1, ""), (0, "a"), (1, "c"), (1, None), (0, "b"), (0, None)]


def test_merged_joins_text_deltas_of_one_choice_in_order():
    batch = [(0, 0, role()), (0, 1, chunk(0, {"reasoning_content": "think"})),
             (0, 2, chunk(0, {"content": "an"})), (0, 3, chunk(0, {"content": "swer"})),
             (0, 4, chunk(1, {"content": "other"})), (0, 4, chunk(0, {}, "stop"))]
    merged = speed_model.merged(batch)
    assert [out for out, _chunk in merged] == [0, 3, 4, 4]
    assert merged[1][1]["choices"][0]["delta"] == {"reasoning_content": "think",
                                                   "content": "answer"}
    assert merged[2][1]["choices"][0]["index"] == 1
    # Reasoning after content would change the order: it stays apart.
    apart = speed_model.merged([(0, 1, chunk(0, {"content": "a"})),
                                (0, 2, chunk(0, {"reasoning_content": "b"}))])
    assert len(apart) == 2


@pytest.mark.parametrize("min_tokens, expected", [
    (0, ("a ", 1, "stop", "b")),
    (2, ("a ", 1, "stop", "b")),       # "b" ends in token 2: checked
    (3, ("a b c a ", 4, "stop", "b")),  # the first "b" ends before token 3: never checked
])
def test_stop_strings_count_from_the_min_tokens_th_token(min_tokens, expected):
    assert chat.cut_output("a b c a b c", 10, ["b"], min_tokens) == expected


def test_lengthen_writes_on_to_the_asked_length():
    stream = model.TokenStream("key", 0)
    text = "Short answer."
    # Past the budget, which then cuts the answer with finish_reason length.
    assert len(model.split_tokens(sampling.lengthen(text, {"ignore_eos": True}, 50,
                                                    stream))) == 51
    assert len(model.split_tokens(sampling.lengthen(text, {"min_tokens": 50}, 50, stream))) == 51
    assert len(model.split_tokens(sampling.lengthen(text, {"min_tokens": 9}, 50, stream))) == 9
    assert sampling.lengthen(text, {"min_tokens": 2}, 50, stream) == text
    guided = {"ignore_eos": True, "response_format": {"type": "json_object"}}
    assert sampling.lengthen(text, guided, 50, stream) == text


# ---- measured on a stand-in ----------------------------------------------------------------------

DECODE_TPS = 400
MEASURED_FLAGS = ENGINE_FLAGS  # --max-num-seqs 2


@pytest.fixture(scope="module")
def timed(tmp_path_factory, base_vllm):
    """A stand-in decoding 400 tokens/s per sequence, prefill nearly free."""
    host = make_host(tmp_path_factory.mktemp("timed"), base_vllm)
    engine = Engine(host, MEASURED_FLAGS, env={"BIV100_STANDIN_DECODE_TPS": str(DECODE_TPS),
                                               "BIV100_STANDIN_PREFILL_TPS": "1000000"})
    engine.wait_started()
    yield engine
    engine.stop()


def post(engine, body, stream=False):
    """(status, headers, [data events] or parsed body, seconds) of one chat request."""
    body = dict(body, model=SERVED, stream=stream)
    body.setdefault("messages", [{"role": "user", "content": "What is the weather?"}])
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
        headers = {name.lower(): value for name, value in response.getheaders()}
        status = response.status
    finally:
        connection.close()
    seconds = time.monotonic() - started
    if stream and status == 200:
        events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return status, headers, [json.loads(event) for event in events[:-1]], seconds
    return status, headers, json.loads(text), seconds


def model_seconds(prompt_tokens, output_tokens, requests, clients):
    """What the engine's steps take for the timed stand-in's closed loop (engine_steps.py)."""
    steps = engine_steps.EngineSteps(speed_model.Rates(1000000, DECODE_TPS), 2, 2048, True, 10 ** 6)
    works = [engine_steps.Work(prompt_tokens, [output_tokens], 1, prompt_tokens + output_tokens)
             for _request in range(requests)]
    return engine_steps.closed_loop(steps, works, clients).seconds


def test_no_token_leaves_before_the_engine_makes_it(timed):
    """Two clients, two streamed requests each, every answer exactly 200 tokens: about a second
    of the model's time. A loaded machine only makes the answers later: the bound holds on it."""
    output_tokens, per_client, clients = 200, 2, 2
    usages, errors = [], []

    def client():
        try:
            for _request in range(per_client):
                _status, _headers, chunks, _seconds = post(
                    timed, dict(max_tokens=output_tokens, ignore_eos=True,
                                stream_options={"include_usage": True}), stream=True)
                usages.append(chunks[-1]["usage"])
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=client) for _client in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    elapsed = time.monotonic() - started

    assert errors == []
    assert [usage["completion_tokens"] for usage in usages] == [output_tokens] * 4
    assert elapsed >= 0.99 * model_seconds(usages[0]["prompt_tokens"], output_tokens, 4, clients)


def test_a_sequence_slows_while_another_runs_beside_it(timed):
    body = dict(max_tokens=400, ignore_eos=True, **THINKING_OFF)
    alone_model = alone(20, 400, speed_model.Rates(1000000, DECODE_TPS))[0].times[-1]  # ~1 s
    _status, _headers, _answer, measured_alone = post(timed, body)
    together = []

    def send():
        together.append(post(timed, body)[3])

    threads = [threading.Thread(target=send) for _client in range(2)]
    for thread in threads:
        thread.start()
    # Side by side: both run at once (seen whenever the machine gets to it: each runs a second).
    assert gauges_show(timed, running=2, waiting=0)
    for thread in threads:
        thread.join(30)

    assert measured_alone >= alone_model
    # Each keeps 1 / 1.2 of its speed alone: a decode step of two takes 1.2 times one's. A
    # bound from below, which a slow machine cannot break.
    assert len(together) == 2 and all(seconds >= 1.19 * (alone_model - 0.008) for seconds in together)


def test_a_request_beyond_max_num_seqs_waits_its_turn(timed):
    # c is sent once a and b run (each for over 3 s of the model's time, which a slow machine
    # only lengthens: far longer than it takes to see them run and send c), and the gauges are
    # read until they show c in line beside them.
    body = dict(max_tokens=400, ignore_eos=True, **THINKING_OFF)
    results = {}

    def send(name):
        results[name] = post(timed, dict(body, max_tokens=1200) if name in "ab" else body)

    threads = [threading.Thread(target=send, args=(name,)) for name in "abc"]
    for thread in threads[:2]:
        thread.start()
    assert gauges_show(timed, running=2, waiting=0)
    threads[2].start()
    assert gauges_show(timed, running=2, waiting=1)
    for thread in threads:
        thread.join(30)

    assert all(results[name][0] == 200 for name in "abc")


def test_a_non_streamed_answer_leaves_when_its_last_token_is_due(timed):
    status, _headers, answer, seconds = post(timed, dict(max_tokens=80, ignore_eos=True))
    assert status == 200 and answer["usage"]["completion_tokens"] == 80
    assert seconds >= 79 / DECODE_TPS


def test_text_completions_follow_the_same_model(timed):
    connection = http.client.HTTPConnection("127.0.0.1", timed.port, timeout=30)
    started = time.monotonic()
    connection.request("POST", "/v1/completions", json.dumps(
        {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True,
         "stream": True, "stream_options": {"include_usage": True}}))
    response = connection.getresponse()
    text = response.read().decode()
    seconds = time.monotonic() - started
    connection.close()
    events = [json.loads(line[len("data: "):]) for line in text.splitlines()
              if line.startswith("data: {")]
    assert response.status == 200 and events[-1]["usage"]["completion_tokens"] == 60
    assert "".join(event["choices"][0]["text"] for event in events if event["choices"])
    assert seconds >= 59 / DECODE_TPS


def test_first_streamed_chunk_waits_for_the_prefill(start):
    engine = start(env={"BIV100_STANDIN_PREFILL_TPS": "1000"})
    prompt = "word " * 1500  # about 1500 tokens: 1.5 s of prefill
    connection = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=30)
    started = time.monotonic()
    connection.request("POST", "/v1/chat/completions", json.dumps(
        {"model": SERVED, "stream": True, "max_tokens": 4,
         "messages": [{"role": "user", "content": prompt}]}))
    response = connection.getresponse()
    headers_after = time.monotonic() - started
    first_line = response.readline()
    first_chunk_after = time.monotonic() - started
    response.read()
    connection.close()
    # The headers at once (milliseconds; a loaded machine's tens), long before the prefill ends.
    assert first_line.startswith(b"data: ") and headers_after < 0.75
    assert first_chunk_after >= 1500 / 1000


# ---- ignore_eos, min_tokens, stream_options ---------------------------------------------------

@pytest.fixture(scope="module")
def quick(tmp_path_factory, base_vllm):
    host = make_host(tmp_path_factory.mktemp("quick"), base_vllm)
    engine = Engine(host, ENGINE_FLAGS).wait_started()
    yield engine
    engine.stop()


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_ignore_eos_answers_exactly_the_budget(quick, limit):
    natural = quick.chat(**{limit: 300}, **THINKING_OFF)[1]
    assert natural["usage"]["completion_tokens"] < 300
    assert natural["choices"][0]["finish_reason"] == "stop"
    status, answer = quick.chat(**{limit: 300}, ignore_eos=True, **THINKING_OFF)
    assert status == 200 and answer["usage"]["completion_tokens"] == 300
    assert answer["choices"][0]["finish_reason"] == "length"
    content = answer["choices"][0]["message"]["content"]
    assert content.startswith(natural["choices"][0]["message"]["content"])


def test_min_tokens_keeps_the_model_writing(quick):
    status, answer = quick.chat(max_tokens=300, min_tokens=120, **THINKING_OFF)
    assert status == 200 and answer["usage"]["completion_tokens"] == 120
    assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body, message", [
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1."),
    ({"min_tokens": 20, "max_tokens": 10},
     "min_tokens must be less than or equal to max_tokens=10, got 20."),
    ({"min_tokens": "many"}, "'loc': ('body', 'min_tokens'), 'msg': 'Input should be a valid integer'"),
])
def test_min_tokens_is_checked_as_vllm_checks_it(quick, body, message):
    status, answer = quick.chat(**body)
    assert status == 400 and message in answer["error"]["message"]


def test_include_usage_ends_the_stream_with_a_usage_chunk(quick):
    _status, _headers, chunks, _seconds = post(
        quick, dict(max_tokens=50, stream_options={"include_usage": True}), stream=True)
    last = chunks[-1]
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert set(last["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert last["usage"]["total_tokens"] == (last["usage"]["prompt_tokens"]
                                             + last["usage"]["completion_tokens"])
    assert all("usage" not in chunk for chunk in chunks[:-1])


def test_include_usage_is_true_by_default_once_stream_options_is_given(quick):
    given = post(quick, dict(max_tokens=5, stream_options={}), stream=True)[2]
    off = post(quick, dict(max_tokens=5, stream_options={"include_usage": False}), stream=True)[2]
    assert given[-1]["choices"] == [] and "usage" in given[-1]
    assert all("usage" not in chunk for chunk in off)


def test_continuous_usage_stats_count_each_choices_tokens(quick):
    chunks = post(quick, dict(max_tokens=60, n=2, stream_options={
        "include_usage": True, "continuous_usage_stats": True}), stream=True)[2]
    final = chunks[-1]["usage"]
    by_choice = {}
    for entry in chunks[:-1]:
        by_choice.setdefault(entry["choices"][0]["index"], []).append(
            entry["usage"]["completion_tokens"])
    assert set(by_choice) == {0, 1}
    assert all(counts[0] == 0 and counts == sorted(counts) for counts in by_choice.values())
    assert sum(counts[-1] for counts in by_choice.values()) == final["completion_tokens"]


def test_merged_stream_carries_the_whole_answer(quick):
    whole = quick.chat(max_tokens=400, ignore_eos=True)[1]["choices"][0]["message"]
    chunks = post(quick, dict(max_tokens=400, ignore_eos=True), stream=True)[2]
    deltas = [entry["choices"][0]["delta"] for entry in chunks if entry["choices"]]
    assert "".join(delta.get("content") or "" for delta in deltas) == whole["content"]
    assert len(deltas) < 400  # tokens due together left together


# ---- the simulated marker ----------------------------------------------------------------------

def test_every_response_says_it_is_simulated(quick):
    name, value = SIMULATED_HEADER
    assert (name, value) == ("x-biv100-simulated", "engine stand-in")
    connection = http.client.HTTPConnection("127.0.0.1", quick.port, timeout=10)
    seen = []
    for method, path, body in [("GET", "/health", None), ("GET", "/v1/models", None),
                               ("GET", "/metrics", None), ("GET", "/nowhere", None),
                               ("POST", "/v1/chat/completions", "{broken"),
                               ("POST", "/v1/chat/completions",
                                json.dumps({"model": SERVED, "max_tokens": 3, "messages": [
                                    {"role": "user", "content": "hi"}]})),
                               ("POST", "/v1/chat/completions",
                                json.dumps({"model": SERVED, "max_tokens": 3, "stream": True,
                                            "messages": [{"role": "user", "content": "hi"}]}))]:
        connection.request(method, path, body)
        response = connection.getresponse()
        response.read()
        seen.append((path, response.status, response.getheader(name)))
    connection.close()
    assert [status for _path, status, _value in seen] == [200, 200, 200, 404, 400, 200, 200]
    assert all(marker == value for _path, _status, marker in seen)


def test_bad_rates_stop_the_start(start):
    engine = start(env={"BIV100_STANDIN_DECODE_TPS": "0"}, wait=False)
    assert engine.wait_exit() == 1
    assert "BIV100_STANDIN_DECODE_TPS=0 is not a positive number" in engine.output()
