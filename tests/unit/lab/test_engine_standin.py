"""The lab's engine stand-in, run as the lab runs it: a process serving loopback HTTP.

Each engine gets a host-like folder of its own: a copy of the vllm files the stand-in reads
(from the real 0.10.1.1 release, patched with the payload's own patches where a test says so),
the lab's ixsmi reporting four GPUs, and a model folder.
"""

import ast
import errno
import json
import os
import select
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from engine_standin import cli, flag_table, server, startup
from standin_engines import (
    ENGINE_FLAGS,
    LAB_DIR,
    MODEL_CONFIG,
    SERVED,
    STANDIN_DIR,
    WEATHER_TOOL,
    Engine,
    make_host,
)


@pytest.fixture(scope="module")
def stock(tmp_path_factory, base_vllm):
    """One engine on the unpatched 0.10.1.1 serving files, shared by the read-only tests."""
    host = make_host(tmp_path_factory.mktemp("stock"), base_vllm)
    engine = Engine(host, ENGINE_FLAGS).wait_started()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def patched(tmp_path_factory, base_vllm):
    """One engine on serving files carrying the payload's n check and thinking validator."""
    host = make_host(tmp_path_factory.mktemp("patched"), base_vllm, patched=True)
    engine = Engine(host, ENGINE_FLAGS).wait_started()
    yield engine
    engine.stop()


def failed_start(start, flags=None, **options):
    engine = start(flags, wait=False, **options)
    return engine.wait_exit(), engine.output()


def tool_request(**extra):
    return dict(tools=[WEATHER_TOOL], **extra)


# ---- the command line ----------------------------------------------------------------------

def test_flag_table_is_what_the_generator_reads_from_the_release(base_vllm):
    committed = json.loads((STANDIN_DIR / "flags-0.10.1.1.json").read_text())
    assert flag_table.build_table(base_vllm) == committed


def test_parser_takes_the_sub168_command_line():
    args = cli.parse_args(["/opt/models/qwen3_5", "--max-model-len", "256000",
                           "--max-num-seqs", "2", "--gpu-memory-utilization", "0.95",
                           "--max-num-batched-tokens", "4096", "--enable-chunked-prefill",
                           "--enforce-eager", "--dtype", "half", "-tp", "4",
                           "--no-enable-prefix-caching", "--max_num_seqs", "2"])
    assert (args.max_model_len, args.tensor_parallel_size, args.dtype) == (256000, 4, "half")
    assert args.enable_chunked_prefill is True and args.enable_prefix_caching is False


def test_max_model_len_takes_vllm_human_readable_numbers():
    assert cli.parse_args(["--max-model-len", "32k"]).max_model_len == 32000
    assert cli.parse_args(["--max-model-len", "1K"]).max_model_len == 1024


@pytest.mark.parametrize("flags, message", [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--dtype", "fp16"], "argument --dtype: invalid choice: 'fp16'"),
    (["--max-num-seqs", "two"], "argument --max-num-seqs: invalid int value: 'two'"),
    (["--reasoning-parser", "qwen9"], "argument --reasoning-parser: invalid choice: 'qwen9'"),
])
def test_invalid_command_lines_exit_2_as_argparse(start, flags, message):
    status, output = failed_start(start, flags)
    assert status == 2
    assert "usage: api_server.py" in output and message in output


def test_auto_tool_choice_without_a_parser_fails(start):
    status, output = failed_start(start, ["--enable-auto-tool-choice"])
    assert status == 1
    assert "--enable-auto-tool-choice requires --tool-call-parser" in output


def test_tool_parser_must_be_registered_in_the_release(start):
    status, output = failed_start(start, ["--enable-auto-tool-choice", "--tool-call-parser",
                                          "qwen4_coder"])
    assert status == 1 and "invalid tool call parser: qwen4_coder" in output


def test_help_says_it_is_the_simulated_engine():
    result = subprocess.run([sys.executable, "-m", "engine_standin", "--help"],
                            env=dict(os.environ, PYTHONPATH=str(LAB_DIR)),
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "simulated engine" in result.stdout


# ---- start-up checks -----------------------------------------------------------------------

def test_tensor_parallel_above_the_gpus_ixsmi_lists_fails(start):
    status, output = failed_start(start, ENGINE_FLAGS + ["-tp", "8"])
    assert status == 1
    assert "please set tensor_parallel_size (8) to less than max local gpu count (4)" in output


def test_cuda_visible_devices_limits_the_gpus(start):
    status, output = failed_start(start, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert status == 1 and "max local gpu count (2)" in output


def test_unknown_allocator_key_fails_with_pytorch_message(start):
    status, output = failed_start(
        start, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_mb:64"})
    assert status == 1
    assert "RuntimeError: Unrecognized CachingAllocator option: max_split_mb" in output


@pytest.mark.parametrize("config", [
    "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6",
    "roundup_power2_divisions:[256:1,512:2,>:8],backend:native",
    "roundup_power2_divisions:4,pinned_num_register_threads:8,release_lock_on_cudamalloc:True",
])
def test_allocator_configs_pytorch_accepts(config):
    startup.check_allocator_config(config)


@pytest.mark.parametrize("config, message", [
    ("expandable_segments:true", "Expected a single True/False argument"),
    ("max_split_size_mb:20", "max_split_size_mb too small"),
    ("garbage_collection_threshold:1.0", "garbage_collect_threshold too big"),
    ("roundup_power2_divisions:[256:3]", "has to be power of 2"),
    ("roundup_power2_divisions:[256:1", "Expected closing bracket"),
    ("backend:cudaMalloc", "Unknown allocator backend"),
])
def test_allocator_values_pytorch_rejects(config, message):
    with pytest.raises(startup.StartupError, match=message):
        startup.check_allocator_config(config)


def test_unregistered_architecture_fails(start):
    status, output = failed_start(start, architecture="Qwen3_5ForConditionalGeneration")
    assert status == 1
    assert ("Model architectures ['Qwen3_5ForConditionalGeneration'] are not supported "
            "for now") in output


def test_max_model_len_above_the_model_fails_unless_allowed(start):
    flags = ENGINE_FLAGS + ["--max-model-len", "8192"]
    status, output = failed_start(start, flags)
    assert status == 1 and "User-specified max_model_len (8192) is greater" in output
    allowed = start(flags, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert allowed.request("GET", "/v1/models")[1]["data"][0]["max_model_len"] == 8192


@pytest.mark.parametrize("flags, message", [
    (["-tp", "3"], "Total number of attention heads (32) must be divisible by tensor "
                   "parallel size (3)."),
    (["--gpu-memory-utilization", "1.5"], "GPU memory utilization must be less than 1.0."),
    (["--max-num-batched-tokens", "1024", "--no-enable-chunked-prefill"],
     "max_num_batched_tokens (1024) is smaller than max_model_len (4096)."),
])
def test_launch_parameters_the_engine_configs_reject(start, flags, message):
    status, output = failed_start(start, ENGINE_FLAGS + flags)
    assert status == 1 and message in output


def test_port_is_bound_at_once_and_served_only_after_loading(start):
    engine = start(env={"LOAD": "1.5"}, wait=False).wait_logged("Loading model weights")
    with socket.socket() as other, pytest.raises(OSError) as bound:
        other.bind(("127.0.0.1", engine.port))
    assert bound.value.errno == errno.EADDRINUSE
    with pytest.raises(urllib.error.URLError):
        engine.request("GET", "/health")
    engine.wait_started()
    assert engine.request("GET", "/health") == (200, "")


def test_a_burst_of_clients_is_queued_for_accept_not_dropped():
    """Many clients connecting at once all complete their handshake while the server is busy
    (here: not accepting at all), as with uvicorn's backlog of 2048; past a small backlog the
    kernel drops their SYNs and each waits a second for TCP to send it again."""
    listener = server.EngineHTTPServer(("127.0.0.1", 0))
    clients = []
    try:
        listener.server_activate()  # listening; no thread accepts
        for _client in range(64):
            client = socket.socket()
            client.setblocking(False)
            assert client.connect_ex(listener.server_address) in (0, errno.EINPROGRESS)
            clients.append(client)
        # A connect whose SYN was dropped stays in progress for a second, until its retransmission.
        _readable, connected, _errors = select.select([], clients, [], 0.5)
        assert len(connected) == 64
        assert all(client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for client in clients)
    finally:
        for client in clients:
            client.close()
        listener.server_close()


def test_logs_like_vllm(stock):
    output = stock.output()
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{stock.port}" in output
    assert "INFO:     Application startup complete." in output


# ---- routes --------------------------------------------------------------------------------

def test_health_ping_version_metrics(stock):
    assert stock.request("GET", "/health") == (200, "")
    assert stock.request("GET", "/ping") == (200, "")
    assert stock.request("GET", "/version") == (200, {"version": "0.10.1.1+corex.4.3.0"})
    stock.chat(max_tokens=4)
    status, metrics = stock.request("GET", "/metrics")
    assert status == 200
    assert f'vllm:prompt_tokens_total{{model_name="{SERVED}"}}' in metrics
    assert "# TYPE vllm:generation_tokens_total counter" in metrics


def test_models_lists_the_served_name_with_max_model_len(stock):
    status, models = stock.request("GET", "/v1/models")
    card = models["data"][0]
    assert status == 200 and models["object"] == "list" and len(models["data"]) == 1
    assert (card["id"], card["object"], card["owned_by"]) == (SERVED, "model", "vllm")
    assert card["max_model_len"] == MODEL_CONFIG["max_position_embeddings"]
    assert card["permission"][0]["object"] == "model_permission"


def test_unknown_route_is_404(stock):
    assert stock.request("GET", "/v2/nothing") == (404, {"detail": "Not Found"})


# ---- chat ----------------------------------------------------------------------------------

def test_chat_answer_shape_usage_and_determinism(stock):
    status, answer = stock.chat(max_tokens=200, chat_template_kwargs={"enable_thinking": False})
    choice = answer["choices"][0]
    usage = answer["usage"]
    assert status == 200 and answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-") and answer["model"] == SERVED
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "stop" and choice["message"]["reasoning_content"] is None
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    again = stock.chat(max_tokens=200, chat_template_kwargs={"enable_thinking": False})[1]
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    other_seed = stock.chat(max_tokens=200, seed=7,
                            chat_template_kwargs={"enable_thinking": False})[1]
    assert other_seed["choices"][0]["message"]["content"] != choice["message"]["content"]


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_completion_length_is_capped(stock, limit):
    status, answer = stock.chat(**{limit: 3})
    assert status == 200
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["choices"][0]["finish_reason"] == "length"


def test_stop_string_ends_the_answer(stock):
    full = stock.chat(chat_template_kwargs={"enable_thinking": False})[1]
    words = full["choices"][0]["message"]["content"].split()
    answer = stock.chat(stop=[words[2]], chat_template_kwargs={"enable_thinking": False})[1]
    choice = answer["choices"][0]
    assert choice["message"]["content"] == " ".join(words[:2]) + " "
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", words[2])
    earliest = stock.chat(stop=[words[3], words[1]],
                          chat_template_kwargs={"enable_thinking": False})[1]["choices"][0]
    assert earliest["message"]["content"] == words[0] + " "


def test_n_choices_differ(stock):
    answer = stock.chat(n=2, max_tokens=100)[1]
    contents = [choice["message"]["content"] for choice in answer["choices"]]
    assert [choice["index"] for choice in answer["choices"]] == [0, 1]
    assert contents[0] != contents[1]


def test_logprobs(stock):
    answer = stock.chat(logprobs=True, top_logprobs=2,
                        chat_template_kwargs={"enable_thinking": False})[1]
    entries = answer["choices"][0]["logprobs"]["content"]
    assert "".join(entry["token"] for entry in entries) == \
        answer["choices"][0]["message"]["content"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in entries)


def test_json_response_formats_give_json(stock):
    answer = stock.chat(response_format={"type": "json_object"},
                        chat_template_kwargs={"enable_thinking": False})[1]
    assert isinstance(json.loads(answer["choices"][0]["message"]["content"]), dict)
    schema = {"type": "object", "properties": {"count": {"type": "integer"}}}
    answer = stock.chat(response_format={"type": "json_schema",
                                         "json_schema": {"name": "c", "schema": schema}},
                        chat_template_kwargs={"enable_thinking": False})[1]
    assert isinstance(json.loads(answer["choices"][0]["message"]["content"])["count"], int)


def test_stream_carries_the_same_answer_and_usage_only_when_asked(stock):
    whole = stock.chat(max_tokens=300)[1]
    message = whole["choices"][0]["message"]
    chunks, done = stock.stream(max_tokens=300, stream_options={"include_usage": True})
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert done and chunks[0]["object"] == "chat.completion.chunk"
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(delta.get("content") or "" for delta in deltas) == message["content"]
    assert "".join(delta.get("reasoning_content") or "" for delta in deltas) == \
        message["reasoning_content"]
    # vLLM dumps the streamed usage without None fields (prompt_tokens_details).
    streamed_usage = {name: value for name, value in whole["usage"].items() if value is not None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == streamed_usage
    assert all("usage" not in chunk for chunk in stock.stream(max_tokens=5)[0])


def test_thinking_gives_reasoning_content_unless_switched_off(stock):
    thinking = stock.chat()[1]["choices"][0]["message"]
    plain = stock.chat(chat_template_kwargs={"enable_thinking": False})[1]["choices"][0]
    assert thinking["reasoning_content"] and "<think>" not in (thinking["content"] or "")
    assert plain["message"]["reasoning_content"] is None


def test_auto_tool_call_is_a_qwen3_style_tool_call(stock):
    answer = stock.chat(**tool_request(chat_template_kwargs={"enable_thinking": False}))[1]
    choice = answer["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)


def test_streamed_tool_call(stock):
    chunks, _events = stock.stream(**tool_request(chat_template_kwargs={"enable_thinking": False}))
    calls = [delta for chunk in chunks for delta in chunk["choices"][0]["delta"]
             .get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads("".join(call["function"]["arguments"] for call in calls))
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choices_call_the_tool(stock, tool_choice):
    answer = stock.chat(**tool_request(tool_choice=tool_choice))[1]
    message = answer["choices"][0]["message"]
    assert message["content"] == "" and message["tool_calls"][0]["function"]["name"] == \
        "get_weather"


def test_tool_choice_none_answers_in_text(stock):
    message = stock.chat(**tool_request(tool_choice="none"))[1]["choices"][0]["message"]
    assert message["tool_calls"] == [] and message["content"]


def test_assistant_tool_calls_with_content_null_are_accepted(stock):
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "chatcmpl-tool-1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "sunny"}]
    assert stock.chat(messages=history, tools=[WEATHER_TOOL])[0] == 200


@pytest.mark.parametrize("body, status, error_type, message", [
    ({"model": "other"}, 404, "NotFoundError", "The model `other` does not exist."),
    ({"max_tokens": -1}, 400, "BadRequestError", "max_tokens must be at least 1, got -1."),
    ({"n": 0}, 400, "BadRequestError", "n must be at least 1, got 0."),
    ({"max_tokens": 5000}, 400, "BadRequestError", "'max_tokens' or 'max_completion_tokens' "
                                                   "is too large: 5000."),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "BadRequestError",
     "This model's maximum context length is 4096 tokens."),
    ({"stream_options": {"include_usage": True}}, 400, "Bad Request",
     "Stream options can only be defined when `stream=True`."),
    ({"tool_choice": "auto"}, 400, "Bad Request", "When using `tool_choice`, `tools` must be"),
])
def test_bad_requests_get_vllm_errors(stock, body, status, error_type, message):
    answer_status, answer = stock.chat(**body)
    error = answer["error"]
    assert answer_status == status == error["code"]
    assert error["type"] == error_type and message in error["message"]
    assert error["param"] is None


def test_malformed_json_is_400(stock):
    status, answer = stock.request("POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and answer["error"]["code"] == 400


def test_auto_tool_choice_needs_the_server_flags(start):
    engine = start(["--served-model-name", SERVED, "-tp", "4"])
    status, answer = engine.chat(**tool_request())
    assert status == 400
    assert '"auto" tool choice requires --enable-auto-tool-choice' in answer["error"]["message"]


def test_api_key_guards_v1_routes(start):
    engine = start(ENGINE_FLAGS + ["--api-key", "s3cret"])
    assert engine.request("GET", "/v1/models") == (401, {"error": "Unauthorized"})
    assert engine.request("GET", "/health")[0] == 200
    assert engine.request("GET", "/v1/models",
                          headers={"Authorization": "Bearer s3cret"})[0] == 200


# ---- the installed serving files decide -----------------------------------------------------

def test_n_above_max_num_seqs_is_served_by_stock_files(stock):
    status, answer = stock.chat(n=3, max_tokens=5)
    assert status == 200 and len(answer["choices"]) == 3


def test_n_above_max_num_seqs_is_refused_by_the_patched_files(patched):
    status, answer = patched.chat(n=3, max_tokens=5)
    assert status == 400
    assert answer["error"]["message"] == ("n=3 exceeds this server's max_num_seqs (2): "
                                          "ask for at most 2 choices")
    assert patched.chat(n=2, max_tokens=5)[0] == 200


def test_stock_files_think_before_tool_calls(stock):
    message = stock.chat(**tool_request())[1]["choices"][0]["message"]
    assert message["reasoning_content"] and message["tool_calls"]


def test_patched_files_switch_thinking_off_for_tool_calls(patched):
    message = patched.chat(**tool_request())[1]["choices"][0]["message"]
    assert message["reasoning_content"] is None and message["tool_calls"]
    asked = patched.chat(**tool_request(chat_template_kwargs={"enable_thinking": True}))[1]
    assert asked["choices"][0]["message"]["reasoning_content"]
    assert patched.chat()[1]["choices"][0]["message"]["reasoning_content"]


def test_thinking_can_use_up_a_small_budget_on_stock_files(stock, patched):
    # 60 tokens hold the tool call, not the thinking before it.
    stock_choice = stock.chat(**tool_request(max_tokens=60))[1]["choices"][0]
    patched_choice = patched.chat(**tool_request(max_tokens=60))[1]["choices"][0]
    assert stock_choice["message"]["tool_calls"] == []
    assert stock_choice["finish_reason"] == "length"
    assert patched_choice["message"]["tool_calls"]


# ---- misbehaviour on request ---------------------------------------------------------------

def test_never_healthy_keeps_the_port_without_serving(start):
    engine = start(env={"BIV100_STANDIN_NEVER_HEALTHY": "1"}, wait=False)
    engine.wait_logged("the engine never finishes loading")
    with pytest.raises(urllib.error.URLError):
        engine.request("GET", "/health")
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", engine.port))


def test_crash_after_n_chat_requests(start):
    engine = start(env={"BIV100_STANDIN_CRASH_AFTER": "2"})
    assert engine.chat(max_tokens=2)[0] == 200
    assert engine.chat(max_tokens=2)[0] == 200
    assert engine.wait_exit() == 1
    assert "died after 2 chat requests" in engine.output()


def test_break_n_returns_one_choice_too_few(start):
    engine = start(env={"BIV100_STANDIN_BREAK": "n"})
    assert len(engine.chat(n=2, max_tokens=5)[1]["choices"]) == 1
    assert engine.chat(max_tokens=5)[0] == 200


def test_break_tools_returns_the_call_as_text(start):
    engine = start(env={"BIV100_STANDIN_BREAK": "tools"})
    message = engine.chat(**tool_request(chat_template_kwargs={"enable_thinking": False}))[1][
        "choices"][0]["message"]
    assert message["tool_calls"] == [] and "<tool_call>" in message["content"]


def test_break_max_completion_tokens_is_the_old_400(start):
    engine = start(env={"BIV100_STANDIN_BREAK": "max_completion_tokens"})
    assert engine.chat(max_completion_tokens=5)[0] == 400
    assert engine.chat(max_tokens=5)[0] == 200


def test_break_tool_content_none_is_a_500(start):
    engine = start(env={"BIV100_STANDIN_BREAK": "tool_content_none"})
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "chatcmpl-tool-1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "rain"}]
    assert engine.chat(messages=history, tools=[WEATHER_TOOL])[0] == 500
    assert engine.chat(max_tokens=5)[0] == 200


def test_break_thinking_tools_spends_the_budget_thinking(start):
    engine = start(env={"BIV100_STANDIN_BREAK": "thinking_tools"})
    choice = engine.chat(**tool_request(max_tokens=200))[1]["choices"][0]
    assert choice["message"]["tool_calls"] == [] and choice["finish_reason"] == "length"
    unaffected = engine.chat(**tool_request(chat_template_kwargs={"enable_thinking": False}))
    assert unaffected[1]["choices"][0]["message"]["tool_calls"]


def test_unknown_break_kind_fails_at_start(start):
    status, output = failed_start(start, env={"BIV100_STANDIN_BREAK": "everything"})
    assert status == 1 and "BIV100_STANDIN_BREAK=everything" in output


# ---- it runs on the hosts' Python ----------------------------------------------------------

@pytest.mark.parametrize("module", sorted(STANDIN_DIR.glob("*.py")), ids=lambda path: path.name)
def test_sources_are_python_3_8_syntax(module):
    ast.parse(module.read_text(), feature_version=(3, 8))
