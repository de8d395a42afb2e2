"""The comparison that holds the stand-in to the real engine (tests/lab/conformance): it sees
the defects it is there to see, and leaves out only the documented differences."""

from __future__ import annotations

import json

from conformance import ALLOWED, command_line, differences, protocol
from engine_standin import cli


def sse(*events, done=True):
    lines = [f"data: {json.dumps(event)}\n\n" for event in events]
    return {"status": 200, "content_type": "text/event-stream; charset=utf-8",
            "text": "".join(lines) + ("data: [DONE]\n\n" if done else "")}


def chunk(delta, finish=None, **extra):
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [choice]}


def usage(prompt, completion):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                     "completion_tokens": completion}}


def error(message, kind="BadRequestError"):
    return {"status": 400, "content_type": "application/json",
            "text": json.dumps({"error": {"message": message, "type": kind, "param": None, "code": 400}})}


REAL_STREAM = sse(chunk({"role": "assistant", "content": ""}), chunk({"content": ""}),
                  chunk({"content": "\u0006x"}), chunk({"content": "q"}, "length", stop_reason=None),
                  usage(21, 3))


def test_a_stream_that_differs_only_as_a_random_model_must_passes():
    # Other text, other token counts, a stop where the random model ran to max_tokens.
    standin = sse(chunk({"role": "assistant", "content": ""}), chunk({"content": "Hello"}),
                  chunk({"content": " there"}, "stop", stop_reason=None), usage(9, 2))
    assert differences(standin, REAL_STREAM) == []
    real = protocol(REAL_STREAM)
    assert (real.chunks, real.usage_chunks) == ({0: ["role", "content", "finish"]}, 1)


def test_a_chunk_field_the_real_engine_does_not_send_is_a_defect():
    standin = sse(chunk({"role": "assistant", "content": ""}, stop_reason=None),
                  chunk({"content": "Hello"}, stop_reason=None),
                  chunk({"content": "!"}, "length", stop_reason=None), usage(9, 2))
    assert differences(standin, REAL_STREAM) == [
        "keys of content chunks: only the stand-in's ['.stop_reason'], only the real engine's []",
        "keys of role chunks: only the stand-in's ['.stop_reason'], only the real engine's []"]


def test_a_finish_chunk_apart_from_the_last_delta_and_a_missing_done_are_defects():
    standin = sse(chunk({"role": "assistant", "content": ""}), chunk({"content": "Hello"}),
                  chunk({}, "length", stop_reason=None), usage(9, 1), done=False)
    found = differences(standin, REAL_STREAM)
    assert "[DONE]: stand-in False, real True" in found
    assert "keys of finish chunks: only the stand-in's [], only the real engine's ['.delta.content']" in found


def test_usage_that_does_not_add_up_is_a_defect_though_counts_may_differ():
    broken = usage(9, 2)
    broken["usage"]["total_tokens"] = 12
    standin = sse(chunk({"role": "assistant", "content": ""}),
                  chunk({"content": "a"}, "length", stop_reason=None), broken)
    assert differences(standin, REAL_STREAM) == [
        "usage: stand-in (('completion_tokens', 'prompt_tokens', 'total_tokens'), False), real "
        "(('completion_tokens', 'prompt_tokens', 'total_tokens'), True)"]


def test_error_messages_are_compared_with_their_token_counts_taken_out():
    real = error("This model's maximum context length is 256000 tokens. However, your request "
                 "has 1536115 input tokens. Please reduce the length of the input messages. None")
    assert differences(error(real_text(real).replace("1536115", "256024")), real) == []
    found = differences(error(real_text(real).replace("256000 tokens.", "4096 tokens.")), real)
    assert len(found) == 1 and found[0].startswith("error: ")
    assert differences(error(real_text(real), kind="Bad Request"), real)


def real_text(answer):
    return json.loads(answer["text"])["error"]["message"]


def test_a_status_or_content_type_apart_is_a_defect_and_server_text_is_not_compared():
    metrics = {"status": 200, "content_type": "text/plain; version=0.0.4", "text": "vllm:a 1\n"}
    assert differences(dict(metrics, text="vllm:b 2\n"), metrics) == []
    assert differences(dict(metrics, status=500), metrics) == ["status: stand-in 500, real 200"]
    assert differences({"status": 200, "content_type": "application/json", "text": ""},
                       {"status": 200, "content_type": None, "text": ""}) == [
        "Content-Type: stand-in 'application/json', real ''"]


def test_a_tool_call_only_one_model_made_is_allowed_but_other_keys_are_not():
    def answer(message):
        return {"status": 200, "content_type": "application/json",
                "text": json.dumps({"object": "chat.completion", "choices": [{"message": message}]})}

    called = {"content": None, "tool_calls": [{"id": "t", "type": "function",
                                               "function": {"name": "f", "arguments": "{}"}}]}
    assert differences(answer(called), answer({"content": "text", "tool_calls": []})) == []
    assert differences(answer(dict(called, extra=1)), answer({"content": "text", "tool_calls": []})) == [
        "keys: only the stand-in's ['.choices[].message.extra'], only the real engine's []"]


def test_every_allowed_difference_says_why_and_what_is_compared_instead():
    assert set(ALLOWED) == {"token counts", "what the model writes", "server text"}
    assert all("Compared instead" in why for why in ALLOWED.values())


def test_the_command_lines_try_every_flag_of_the_table_with_good_and_bad_values():
    table = cli.load_flag_table()
    cases = command_line.flag_cases(table)
    assert {case[0] for case in cases} >= {spec["names"][0] for spec in table["flags"]}
    assert ["--max-num-seqs", "one"] in cases and ["--dtype", "not-a-choice"] in cases
    verdicts = {json.dumps(case): command_line.standin_verdict(case)["status"] for case in cases}
    assert verdicts['["--max-num-seqs", "1"]'] == 0 and verdicts['["--max-num-seqs", "one"]'] == 2
    assert verdicts['["--config", "x"]'] == 1
    assert command_line.sub168_cases(["--max-num-seqs", "2", "--enforce-eager"])[1] == [
        "--max_num_seqs", "2", "--enforce_eager"]


def test_a_parser_that_disagrees_is_named_with_what_each_side_said():
    cases = [["--max-num-seqs", "one"], ["--max-num-seqs", "1"]]
    found = command_line.disagreements(cases, [{"status": 0, "error": []}, {"status": 0, "error": []}])
    assert len(found) == 1 and found[0].startswith('["--max-num-seqs", "one"]: stand-in 2 ')


def test_reasoning_where_the_random_model_writes_content_is_allowed_but_not_a_tool_call():
    standin = sse(chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "Let"}),
                  chunk({"content": "A"}, "length", stop_reason=None), usage(9, 2))
    assert differences(standin, REAL_STREAM) == []
    called = sse(chunk({"role": "assistant", "content": ""}),
                 chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "length",
                       stop_reason=None), usage(9, 2))
    assert differences(called, REAL_STREAM)[0] == (
        "chunk sequences: stand-in {0: ['role', 'tool_call', 'finish']}, "
        "real {0: ['role', 'text', 'finish']}")
