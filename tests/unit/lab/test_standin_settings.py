"""The stand-in's answer to its launch settings and allocator options: the memory a BI-V100 holds
at start, fragmentation under long prompts, the KV cache bounding what runs, and the weighted
score its model predicts; as pure functions, then on stand-in processes."""

import http.client
import json
import threading
import time

import pytest
from engine_defaults import SUB168
from engine_standin import memory_model, settings, speed_model, startup

from standin_engines import ENGINE_FLAGS, SERVED, metric

GIB = memory_model.GIB
LAB = memory_model.LAB_QWEN3_5_CONFIG
# The lab's engine environment: its rates, and the deploy's allocator options.
LAB_ENV = {"BIV100_STANDIN_PREFILL_TPS": "200000", "BIV100_STANDIN_DECODE_TPS": "6000",
           "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8,max_split_size_mb:512"}
EXPANDABLE = dict(LAB_ENV, PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.8,max_split_size_mb:512,"
                                                   "expandable_segments:True")
# The default bench's requests (files/bench/default.yml): prompts of 1024 tokens, answers
# spread over 128 to 256.
BENCH = (1024, [128, 160, 192, 224, 256])


def plan(environ=None, **engine_args):
    engine = settings.from_engine_args(dict(SUB168, **engine_args), LAB, environ or LAB_ENV)
    return memory_model.MemoryPlan(memory_model.ModelShape.from_config(LAB), engine)


def refusal(environ=None, **engine_args):
    with pytest.raises(memory_model.StartFailure) as failed:
        plan(environ, **engine_args).check()
    return str(failed.value)


# ---- memory at start -------------------------------------------------------------------------

def test_sub168_starts_with_a_kv_cache_for_one_max_length_sequence_and_some():
    sub168 = plan()
    sub168.check()
    assert (sub168.budget, sub168.weights) == (pytest.approx(30.4 * GIB), 10 * GIB)
    # The activation's 2 GiB, and an eighth of it the allocator holds fragmented beside it
    # (max_split_size_mb keeps the large blocks whole; expandable segments leave none).
    assert (sub168.non_torch, sub168.activation) == (0.75 * GIB, 2.25 * GIB)
    assert plan(EXPANDABLE).activation == 2 * GIB
    assert plan(dict(LAB_ENV, PYTORCH_CUDA_ALLOC_CONF="")).activation == 2.5 * GIB
    # 64 layers x 2 KV heads per GPU x 128 x 2 bytes, keys and values.
    assert sub168.kv_per_token == 64 * 1024
    assert sub168.kv_cache == pytest.approx(17.4 * GIB)
    assert (sub168.blocks, sub168.kv_tokens) == (17817, 285072)
    assert sub168.max_concurrency == pytest.approx(1.11, abs=0.005)
    assert "the rest of the memory reserved for KV Cache is 17.40GiB" in sub168.profile_line()


@pytest.mark.parametrize("utilization, batched, expandable, starts", [
    (0.95, 4096, False, True), (0.90, 4096, False, True), (0.89, 4096, False, False), (0.80, 4096, False, False),
    (0.89, 4096, True, True), (0.88, 4096, True, False),
    (0.86, 2048, False, True), (0.85, 2048, False, False),
    (0.95, 8192, True, True), (0.94, 8192, True, False),
    (0.96, 8192, False, False), (0.95, 8192, False, False),
])
def test_the_kv_cache_must_hold_one_sequence_of_max_model_len(utilization, batched, expandable, starts):
    """At max_model_len 256000 the threshold is 0.895 with 4096 batched tokens on the deploy's
    allocator options, 0.887 with expandable segments: every token of max_num_batched_tokens
    costs half a MiB of activation at start, and the allocator holds an eighth more of it
    fragmented without expandable segments; 8192 tokens then need 0.965, so they start at 0.95
    only with expandable segments."""
    engine_args = {"gpu_memory_utilization": utilization, "max_num_batched_tokens": batched}
    environ = EXPANDABLE if expandable else LAB_ENV
    if starts:
        plan(environ, **engine_args).check()
    else:
        message = refusal(environ, **engine_args)
        assert message.startswith("ValueError: The model's max seq len (256000) is larger than "
                                  "the maximum number of tokens that can be stored in KV cache (")
        assert message.endswith("Try increasing `gpu_memory_utilization` or decreasing "
                                "`max_model_len` when initializing the engine.")


def test_a_shorter_context_starts_where_256000_does_not():
    plan(gpu_memory_utilization=0.80, max_model_len=200000).check()


def test_no_memory_left_for_the_cache_and_a_share_above_the_runtimes_fail():
    assert refusal(gpu_memory_utilization=0.39) == (
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.")
    plan(gpu_memory_utilization=0.96).check()
    # The CUDA context and the runtime keep 1 GiB outside the engine's share.
    assert refusal(gpu_memory_utilization=0.97).startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ")
    assert "(simulated: allocating the KV cache)" in refusal(gpu_memory_utilization=0.97)


def test_float32_doubles_the_weights_and_the_cache_and_fp8_halves_the_cache():
    assert plan(dtype="float32").weights == 2 * plan().weights
    assert plan(dtype="float32").kv_per_token == 2 * plan().kv_per_token
    assert "larger than the maximum number of tokens" in refusal(dtype="float32")
    assert plan(dtype="bfloat16").kv_per_token == plan(dtype="auto").kv_per_token == plan().kv_per_token
    assert plan(kv_cache_dtype="fp8").kv_per_token == plan().kv_per_token // 2
    assert "out of memory" in refusal(dtype="float32", tensor_parallel_size=1)


def test_the_kv_cache_per_token_comes_from_the_models_config():
    shape = memory_model.ModelShape.from_config(LAB)
    assert shape.kv_bytes_per_token(2, 4) == 2 * 2 * 128 * 2 * 64
    assert shape.kv_bytes_per_token(2, 8) == 2 * 1 * 128 * 2 * 64
    assert shape.kv_bytes_per_token(2, 16) == shape.kv_bytes_per_token(2, 8)  # a head each at least
    hybrid = memory_model.ModelShape.from_config({"text_config": {
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "hidden_size": 2048, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}})
    # Two full-attention layers hold KV; the head dim is hidden_size / heads.
    assert hybrid.kv_bytes_per_token(2, 1) == 2 * 4 * 128 * 2 * 1
    # A config without the geometry (the unit tests' model) is the lab's Qwen3.5.
    bare = memory_model.ModelShape.from_config({"num_attention_heads": 32})
    assert bare.kv_bytes_per_token(2, 4) == shape.kv_bytes_per_token(2, 4)


def test_without_chunked_prefill_a_prompt_is_one_step_and_the_profile_runs_out_of_memory():
    assert settings.from_engine_args(dict(SUB168, max_num_batched_tokens=None,
                                          enable_chunked_prefill=False), LAB).max_num_batched_tokens == 256000
    # The scheduler refuses fewer batched tokens than max_model_len without chunking.
    with pytest.raises(startup.StartupError, match=r"max_num_batched_tokens \(4096\) is smaller "
                                                   r"than max_model_len \(256000\)"):
        plan(enable_chunked_prefill=False)
    assert "(simulated: the memory profile run)" in refusal(
        enable_chunked_prefill=False, max_num_batched_tokens=256000)


def test_vllms_defaults_for_the_batched_tokens():
    def batched(**engine_args):
        args = {name: value for name, value in dict(SUB168, **engine_args).items() if value is not None}
        return settings.from_engine_args(args, LAB).max_num_batched_tokens

    # Chunked: 2048, raised to 5120 for a multimodal architecture (the lab's Qwen3.5 is one).
    assert batched(max_num_batched_tokens=None) == 5120
    assert settings.from_engine_args({"max_model_len": 4096, "enable_chunked_prefill": True},
                                     {"max_position_embeddings": 4096}).max_num_batched_tokens == 2048
    with pytest.raises(startup.StartupError, match=r"max_num_batched_tokens \(4\) must be greater "
                                                   r"than or equal to max_num_seqs \(8\)"):
        batched(max_num_batched_tokens=4, max_num_seqs=8)


# ---- fragmentation -------------------------------------------------------------------------

@pytest.mark.parametrize("conf, fragments", [
    ("", True),
    ("garbage_collection_threshold:0.8", True),
    ("garbage_collection_threshold:0.8,max_split_size_mb:512", False),
    ("max_split_size_mb:1024", False),
    ("max_split_size_mb:1025", True),
    ("expandable_segments:True", False),
    ("expandable_segments:False,max_split_size_mb:4096", True),
    ("roundup_power2_divisions:[256:1,512:2],max_split_size_mb:256", False),
    ("max_split_size_mb:256,max_split_size_mb:2048", True),  # the last one counts
    ("backend:cudaMallocAsync", True),
])
def test_the_allocator_options_that_remove_fragmentation(conf, fragments):
    startup.check_allocator_config(conf)  # every one of them PyTorch accepts
    assert memory_model.allocator_fragments(conf) is fragments


def test_only_prompts_over_1024_tokens_are_long():
    assert not memory_model.is_long_prompt(1024) and memory_model.is_long_prompt(1025)


# ---- the predicted score -------------------------------------------------------------------

def test_sub168_on_the_lab_predicts_the_default_bench_about_30_percent_above_the_gate():
    predicted = speed_model.predicted_score(SUB168, *BENCH, LAB_ENV, concurrency=8)
    assert predicted.refused is None
    assert predicted.score == pytest.approx(10503, abs=1)
    assert predicted.score == pytest.approx(speed_model.weighted_score(predicted.input_tps, predicted.output_tps))
    assert len(predicted.latencies["ttft_ms"]) == 24
    # Two run at once and six wait: as many clients as it runs measure the same throughput.
    assert speed_model.predicted_score(SUB168, *BENCH, LAB_ENV, concurrency=2).score == pytest.approx(
        predicted.score, rel=0.01)


def test_the_score_grows_with_max_num_seqs_and_so_does_the_time_per_token():
    predictions = [speed_model.predicted_score(dict(SUB168, max_num_seqs=seqs), *BENCH, LAB_ENV, concurrency=8)
                   for seqs in (1, 2, 4, 8)]
    assert [round(predicted.score) for predicted in predictions] == [7442, 10503, 13530, 15679]
    tpot = [speed_model.percentile(predicted.latencies["tpot_ms"], 99) for predicted in predictions]
    assert tpot == sorted(tpot) and len(set(tpot)) == 4
    # Fewer clients than max_num_seqs leave sequences unused.
    assert speed_model.predicted_score(dict(SUB168, max_num_seqs=8), *BENCH, LAB_ENV,
                                       concurrency=2).score == pytest.approx(predictions[1].score, rel=0.01)


def test_the_tuning_benchs_best_under_its_latency_limit_is_inside_the_space():
    """The tuning test's bench (tests/integration/data/long_prompts.yml) and TPOT limit: the
    search space's best that holds the limit is max_num_seqs 4 with 8192 batched tokens, which
    start only with expandable segments at 0.95 (test_tune.py asserts the tuner finds it)."""
    def predicted(seqs, batched, environ):
        return speed_model.predicted_score(dict(SUB168, max_num_seqs=seqs, max_num_batched_tokens=batched),
                                           7000, 256, environ, concurrency=8, requests=16)

    feasible = {}
    for seqs in (1, 2, 4, 8):
        for batched in (2048, 4096, 8192):
            for expandable, environ in ((False, LAB_ENV), (True, EXPANDABLE)):
                prediction = predicted(seqs, batched, environ)
                if prediction.refused is None and speed_model.percentile(prediction.latencies["tpot_ms"], 99) <= 1.2:
                    feasible[seqs, batched, expandable] = prediction.score
                elif prediction.refused:
                    assert batched == 8192 and not expandable, (seqs, batched, expandable)
    best = max(feasible, key=feasible.get)
    assert best == (4, 8192, True)
    assert all(seqs < 8 for seqs, _batched, _expandable in feasible)  # max_num_seqs 8 breaks the limit
    runner_up = max(score for setting, score in feasible.items() if setting != best)
    assert runner_up < 0.9 * feasible[best]


def test_a_prediction_says_what_fails_instead():
    too_small = speed_model.predicted_score(dict(SUB168, gpu_memory_utilization=0.8), *BENCH, LAB_ENV)
    assert too_small.score is None and "max seq len (256000)" in too_small.refused
    fragmented = dict(LAB_ENV, PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.8")
    long_prompts = speed_model.predicted_score(SUB168, 2000, 100, fragmented)
    assert long_prompts.score is None and "CUDA out of memory" in long_prompts.refused
    # One at a time, or short prompts, or an allocator that keeps the blocks: no failure.
    assert speed_model.predicted_score(dict(SUB168, max_num_seqs=1), 2000, 100, fragmented).score
    assert speed_model.predicted_score(SUB168, 1000, 100, fragmented).score
    assert speed_model.predicted_score(SUB168, 2000, 100, LAB_ENV).score
    forced = dict(LAB_ENV, BIV100_STANDIN_BREAK="fragmentation")
    assert speed_model.predicted_score(SUB168, 2000, 100, forced).refused
    bad_rate = speed_model.predicted_score(SUB168, *BENCH, dict(LAB_ENV, BIV100_STANDIN_DECODE_TPS="0"))
    assert "BIV100_STANDIN_DECODE_TPS=0" in bad_rate.refused
    unknown = speed_model.predicted_score(dict(SUB168, max_num_seq=2), *BENCH, LAB_ENV)
    assert unknown.refused == "max_num_seq is not an argument of vLLM 0.10.1.1's server"


# ---- on stand-in processes -------------------------------------------------------------------

SUB168_FLAGS = ENGINE_FLAGS + ["--max-model-len", "256000", "--max-num-batched-tokens", "4096"]
# The unit tests' model knows 4096 tokens; the allocator options are the deploy's.
LONG_CONTEXT = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "PYTORCH_CUDA_ALLOC_CONF": LAB_ENV["PYTORCH_CUDA_ALLOC_CONF"]}


def test_the_engine_starts_at_sub168_and_logs_its_memory(start):
    engine = start(SUB168_FLAGS + ["--gpu-memory-utilization", "0.95"], env=LONG_CONTEXT)
    output = engine.output()
    assert "the rest of the memory reserved for KV Cache is 17.40GiB." in output
    assert "# cuda blocks: 17817, # CPU blocks: 4096" in output
    assert "Maximum concurrency for 256000 tokens per request: 1.11x" in output
    assert engine.request("GET", "/health") == (200, "")


def test_the_engine_refuses_to_start_when_the_kv_cache_cannot_hold_max_model_len(start):
    engine = start(SUB168_FLAGS + ["--gpu-memory-utilization", "0.80"], env=LONG_CONTEXT, wait=False)
    assert engine.wait_exit() == 1
    output = engine.output()
    assert output.rstrip().splitlines()[-1] == (
        "ValueError: The model's max seq len (256000) is larger than the maximum number of "
        "tokens that can be stored in KV cache (206432). Try increasing `gpu_memory_utilization` "
        "or decreasing `max_model_len` when initializing the engine.")
    # As the real engine, after loading the weights and profiling the memory.
    assert output.index("Model loading took 10.00 GiB") < output.index("Memory profiling takes")


def two_long_prompts(engine, **extra):
    """The (status, body) of two chat requests with 2000-word prompts sent at once, by status."""
    body = dict({"model": SERVED, "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False},
                 "messages": [{"role": "user", "content": "memory " * 2000}]}, **extra)
    results, start = [], threading.Barrier(2)

    def send():
        start.wait()
        results.append(engine.request("POST", "/v1/chat/completions", body))

    threads = [threading.Thread(target=send) for _copy in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return sorted(results, key=lambda result: result[0])


# A slow prefill keeps two long prompts' requests side by side on a busy machine: a second for
# the first's, where a loaded machine was seen to send the two up to 0.06 s apart.
SLOW_PREFILL = {"BIV100_STANDIN_PREFILL_TPS": "2000"}


@pytest.mark.parametrize("conf, fails", [
    ("garbage_collection_threshold:0.8", True),
    ("max_split_size_mb:2048", True),
    ("garbage_collection_threshold:0.8,max_split_size_mb:512", False),
    ("expandable_segments:True", False),
])
def test_long_prompts_side_by_side_run_out_of_memory_unless_the_allocator_keeps_blocks(start, conf, fails):
    engine = start(env=dict(SLOW_PREFILL, PYTORCH_CUDA_ALLOC_CONF=conf))

    (first, second) = two_long_prompts(engine)

    if fails:
        assert first[0] == 200 and second[0] == 500
        assert second[1]["error"]["message"] == "CUDA out of memory. Tried to allocate 1.95 GiB"
        assert "torch.OutOfMemoryError: CUDA out of memory" in engine.output()
    else:
        assert (first[0], second[0]) == (200, 200)
    # Short prompts side by side never fail.
    assert [status for status, _answer in (engine.chat(), engine.chat())] == [200, 200]


def test_long_prompts_one_at_a_time_never_run_out_of_memory(start):
    engine = start(ENGINE_FLAGS + ["--max-num-seqs", "1"],
                   env=dict(SLOW_PREFILL, PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.8"))
    # The second waits for the first's slot, and is prefilled alone.
    assert [status for status, _answer in two_long_prompts(engine)] == [200, 200]


def test_a_streamed_answer_gets_the_out_of_memory_error_as_its_last_event(start):
    engine = start(env=dict(SLOW_PREFILL, PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.8"))

    streams = two_long_prompts(engine, stream=True)

    # Both streams began with 200; one ends with vLLM's streaming error, then [DONE].
    assert [status for status, _text in streams] == [200, 200]
    failed = [text for _status, text in streams if '"error"' in text]
    assert len(failed) == 1
    events = [line[len("data: "):] for line in failed[0].splitlines() if line.startswith("data: ")]
    assert json.loads(events[-2]) == {"error": {
        "message": "CUDA out of memory. Tried to allocate 1.95 GiB", "type": "BadRequestError",
        "param": None, "code": 400}}
    assert events[-1] == "[DONE]" and len(events) == 2


def test_the_break_switch_fragments_whatever_the_allocator(start):
    engine = start(env=dict(SLOW_PREFILL, BIV100_STANDIN_BREAK="fragmentation"))
    assert [status for status, _answer in two_long_prompts(engine)] == [200, 500]


def test_the_kv_cache_bounds_the_requests_running_beside_max_num_seqs(start):
    # 0.38 of a GPU leaves 0.29 GiB of KV cache (the allocator holding an eighth of the 1 GiB
    # activation fragmented beside it): 4656 tokens, fewer than two of these requests.
    engine = start(ENGINE_FLAGS + ["--gpu-memory-utilization", "0.38"],
                   env={"BIV100_STANDIN_DECODE_TPS": "400"})
    assert "# cuda blocks: 291," in engine.output()
    body = {"model": SERVED, "max_tokens": 400, "ignore_eos": True,
            "chat_template_kwargs": {"enable_thinking": False},
            "messages": [{"role": "user", "content": "memory " * 3000}]}

    def send():
        connection = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=30)
        connection.request("POST", "/v1/chat/completions", json.dumps(body))
        connection.getresponse().read()
        connection.close()

    threads = [threading.Thread(target=send) for _copy in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while metric(engine, "vllm:num_requests_waiting") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # max_num_seqs 2 would run both; the cache holds one: the other waits.
    assert metric(engine, "vllm:num_requests_running") == 1
    assert 0.4 < metric(engine, "vllm:gpu_cache_usage_perc") <= 1
    for thread in threads:
        thread.join(30)
    assert metric(engine, "vllm:gpu_cache_usage_perc") == 0
