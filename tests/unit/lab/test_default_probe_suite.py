"""The default probe suite against the lab's engine stand-in, run on the test machine: it passes
on an engine carrying the payload's fixes, each regression probe fails when the stand-in is
told to reproduce the failure that probe guards against, and each strict probe fails on the
stand-in's good answer made wrong in the one way it guards against."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.modules.engine_probe import send_copies
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import (
    judge,
    load_suites,
    module_request,
    with_values,
)

from probe_values import probe_values
from standin_engines import ENGINE_FLAGS, SERVED, Engine, make_host

DEFAULT_SUITE = Path(__file__).resolve().parents[3] / "files" / "probes" / "default.yml"
MAX_MODEL_LEN = 4096  # the stand-in's model config
MAX_NUM_BATCHED_TOKENS = 1024
FLAGS = ENGINE_FLAGS + ["--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)]
# The values the probe role gives the suite, for this engine.
VALUES = probe_values({"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 2,
                       "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}, SERVED)
# Each regression probe, and how the stand-in reproduces the failure it guards against: a
# BIV100_STANDIN_BREAK kind, the base's serving files without the payload's patches, or the
# engine's environment.
REPRODUCED = {
    "max-completion-tokens": {"break": "max_completion_tokens"},
    "stream-max-completion-tokens": {"break": "max_completion_tokens"},
    "n-two": {"break": "n"},
    "n-above-max-num-seqs": {"patched": False},
    # The allocator without max_split_size_mb: long prefills side by side find no block (a slow
    # prefill keeps the probe's two requests side by side on a busy machine, as in
    # test_standin_settings.py).
    "two-long-prompts-at-once": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8",
                                         "BIV100_STANDIN_PREFILL_TPS": "2000"}},
    "tool-result-after-null-content": {"break": "tool_content_none"},
    # The failure needs both: no validator switching thinking off, and thinking that runs long.
    "tool-call-with-thinking-on": {"break": "thinking_tools", "patched": False},
}

PROBES = load_suites([str(DEFAULT_SUITE)])


def run_probes(engine, names=None):
    """{name: Verdict} of the suite's probes (or the named ones) against the engine."""
    url = f"http://127.0.0.1:{engine.port}"
    verdicts = {}
    for probe in PROBES:
        if names is None or probe.name in names:
            filled = with_values(probe, VALUES)
            verdicts[probe.name] = judge(filled, send_copies(url, None, module_request(filled), 2000))
    return verdicts


@pytest.fixture(scope="module")
def fixed_engine(tmp_path_factory, base_vllm):
    """An engine on serving files that carry the payload's fixes."""
    host = make_host(tmp_path_factory.mktemp("fixed"), base_vllm, patched=True)
    engine = Engine(host, FLAGS).wait_started()
    yield engine
    engine.stop()


def test_the_suite_is_at_least_sixty_probes_each_naming_what_it_guards():
    assert len(PROBES) >= 60
    assert all(probe.guards and probe.tags and probe.expect for probe in PROBES)


def test_every_probe_passes_on_an_engine_with_the_fixes(fixed_engine):
    verdicts = run_probes(fixed_engine)

    failures = {name: (verdict.failed_expectation, verdict.excerpt)
                for name, verdict in verdicts.items() if not verdict.passed}
    assert failures == {}
    assert len(verdicts) == len(PROBES)


def test_every_regression_probe_has_a_reproduction():
    regression = {probe.name for probe in PROBES if "regression" in probe.tags}
    assert regression == set(REPRODUCED)


@pytest.mark.parametrize("name", sorted(REPRODUCED))
def test_a_regression_probe_fails_when_its_failure_is_reproduced(start, name):
    how = REPRODUCED[name]
    env = dict(how.get("env", {}), **({"BIV100_STANDIN_BREAK": how["break"]} if "break" in how else {}))
    engine = start(FLAGS, env=env, patched=how.get("patched", True))

    verdict = run_probes(engine, {name})[name]

    assert not verdict.passed, f"{name} passed on an engine reproducing its failure"
    assert verdict.failed_expectation and verdict.excerpt


def test_tool_calls_left_as_text_fail_the_tool_probes(start):
    engine = start(FLAGS, env={"BIV100_STANDIN_BREAK": "tools"}, patched=True)

    verdicts = run_probes(engine, {"tool-auto", "tool-stream", "tool-required"})

    assert not verdicts["tool-auto"].passed and not verdicts["tool-stream"].passed


def test_prose_in_braces_for_a_json_object_fails_the_strict_probe(start):
    # The engine the lab's gate test deploys to show a strict probe rolling a release back.
    engine = start(FLAGS, env={"BIV100_STANDIN_BREAK": "json_object"}, patched=True)

    verdict = run_probes(engine, {"response-format-json-object"})["response-format-json-object"]

    assert not verdict.passed and "json_valid" in verdict.failed_expectation


# ---- strict probes against wrong answers ----------------------------------------------------

def set_content(text):
    def wrong(answer):
        answer["body"]["choices"][0]["message"]["content"] = text
    return wrong


def set_arguments(text, call=0):
    def wrong(answer):
        answer["body"]["choices"][0]["message"]["tool_calls"][call]["function"]["arguments"] = text
    return wrong


def add_call(arguments):
    def wrong(answer):
        calls = answer["body"]["choices"][0]["message"]["tool_calls"]
        calls.append(copy.deepcopy(calls[0]))
        calls[-1]["function"]["arguments"] = arguments
    return wrong


def set_in(path, value):
    """Set the value at a path of keys and indexes of the answer."""
    def wrong(answer):
        target = answer
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return wrong


def add_one_to_total(answer):
    answer["body"]["usage"]["total_tokens"] += 1


def extra_property(answer):
    message = answer["body"]["choices"][0]["message"]
    message["content"] = json.dumps(dict(json.loads(message["content"]), nickname="x"))


def later_chunk_with_other_id(answer):
    answer["stream"]["events"][1]["id"] = "chatcmpl-other"


# (probe, label, how the stand-in's good answer is made wrong, the expectation it then fails)
WRONG_ANSWERS = [
    ("response-format-json-object", "not-json", set_content("{not json}"),
     "json_valid(body.choices[0].message.content)"),
    ("response-format-json-object", "an-array", set_content("[1, 2]"),
     "type(from_json(body.choices[0].message.content)) == 'object'"),
    ("response-format-json-object", "fenced", set_content('```json\n{"answer": 1}\n```'),
     "json_valid(body.choices[0].message.content)"),
    ("response-format-json-schema", "fractional-integer",
     set_content('{"city": "Paris", "population": 2.5}'),
     "schema_ok(from_json(body.choices[0].message.content), "
     "request.body.response_format.json_schema.schema)"),
    ("response-format-json-schema", "missing-required", set_content('{"city": "Paris"}'),
     "schema_ok(from_json(body.choices[0].message.content), "
     "request.body.response_format.json_schema.schema)"),
    ("response-format-json-schema-nested", "additional-property", extra_property,
     "schema_ok(from_json(body.choices[0].message.content), "
     "request.body.response_format.json_schema.schema)"),
    ("tool-auto", "arguments-not-json", set_arguments("city=Paris"),
     "json_valid(body.choices[0].message.tool_calls[0].function.arguments)"),
    ("tool-auto", "arguments-off-schema", set_arguments('{"town": "Paris"}'),
     "schema_ok(from_json(body.choices[0].message.tool_calls[0].function.arguments), "
     "request.body.tools[0].function.parameters)"),
    ("tool-named", "arguments-wrong-type", set_arguments('{"city": 7}'),
     "schema_ok(from_json(body.choices[0].message.tool_calls[0].function.arguments), "
     "request.body.tools[0].function.parameters)"),
    ("tool-required", "second-call-off-schema", add_call("{}"),
     "schema_ok(map(&from_json(@), body.choices[0].message.tool_calls[*].function.arguments), "
     "{type: 'array', items: request.body.tools[0].function.parameters})"),
    ("tool-stream", "streamed-arguments-cut", set_in(["stream", "choices", 0, "tool_calls", 0,
                                                      "arguments"], '{"city": "Par'),
     "json_valid(stream.choices[0].tool_calls[0].arguments)"),
    ("stream-json-object", "reassembled-not-json",
     set_in(["stream", "choices", 0, "content"], '{"answer": "x"'),
     "json_valid(stream.choices[0].content)"),
    ("stream-json-schema", "reassembled-off-schema",
     set_in(["stream", "choices", 0, "content"], '{"city": null, "population": 1}'),
     "schema_ok(from_json(stream.choices[0].content), "
     "request.body.response_format.json_schema.schema)"),
    ("chat-basic", "id-shape", set_in(["body", "id"], "cmpl-1"),
     "regex_fullmatch(body.id, 'chatcmpl-[0-9A-Za-z_-]+')"),
    ("chat-basic", "created-not-an-integer", set_in(["body", "created"], 1700000000.5),
     "floor(body.created) == body.created"),
    ("chat-basic", "unknown-finish-reason", set_in(["body", "choices", 0, "finish_reason"], "eos"),
     "contains(['stop', 'length'], body.choices[0].finish_reason)"),
    ("chat-usage", "total-not-the-sum", add_one_to_total,
     "body.usage.total_tokens == sum([body.usage.prompt_tokens, body.usage.completion_tokens])"),
    ("n-two", "same-index-twice", set_in(["body", "choices", 1, "index"], 0),
     "body.choices[*].index == [`0`, `1`]"),
    ("stop-sequence", "stop-not-reported", set_in(["body", "choices", 0, "stop_reason"], None),
     "body.choices[0].stop_reason == 'e'"),
    ("logprobs", "top-logprobs-short",
     lambda answer: answer["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"].pop(),
     "length(body.choices[0].logprobs.content[?length(top_logprobs) != `2`]) == `0`"),
    ("stream-chunk-shape", "chunk-of-another-id", later_chunk_with_other_id,
     "max(stream.events[*].id) == min(stream.events[*].id)"),
    ("chat-unicode", "json-escapes-as-text", set_content("\\u957f\\u57ce"),
     "regex_match(body.choices[0].message.content, '\\\\u[0-9a-fA-F]{4}') == `false`"),
    ("completions-basic", "chat-object", set_in(["body", "object"], "chat.completion"),
     "body.object == 'text_completion'"),
    ("tokenize-prompt", "count-off-by-one",
     lambda answer: answer["body"].update(count=answer["body"]["count"] + 1),
     "body.count == length(body.tokens)"),
]


@pytest.mark.parametrize("name, label, make_wrong, failed", WRONG_ANSWERS,
                         ids=[f"{name}-{label}" for name, label, _wrong, _failed in WRONG_ANSWERS])
def test_a_strict_probe_fails_on_the_answer_made_wrong(fixed_engine, name, label, make_wrong,
                                                       failed):
    (probe,) = [with_values(probe, VALUES) for probe in PROBES if probe.name == name]
    answer = send_copies(f"http://127.0.0.1:{fixed_engine.port}", None, module_request(probe), 2000)
    assert judge(probe, answer).passed, judge(probe, answer).failed_expectation

    make_wrong(answer)
    verdict = judge(probe, answer)

    assert not verdict.passed
    assert verdict.failed_expectation == failed
