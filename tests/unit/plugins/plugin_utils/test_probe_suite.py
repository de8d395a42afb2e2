"""Probe suites: what a bad suite is refused for, how values fill a probe, how answers are judged."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jmespath
import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils import _probe_suite
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import (
    SuiteError,
    judge,
    load_suites,
    module_request,
    select,
    table,
    with_values,
)

VALUES = {"served_model_name": "qwen3_5", "max_model_len": 256000, "long_prompt_words": 12288}
PROBE = """
- name: chat
  tags: [chat]
  checks: protocol
  guards: no answer
  request:
    method: POST
    path: /v1/chat/completions
    body:
      messages: [{role: user, content: {$repeat: "hi ", times: "${long_prompt_words}"}}]
      max_tokens: "${max_model_len}"
      metadata: "len ${max_model_len}"
  expect:
    - status == `200`
    - body.model == ${served_model_name}
"""


def suite(tmp_path, text, name="suite.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_values_fill_requests_with_their_types_and_expectations_as_literals(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    filled = with_values(probe, VALUES)
    request = module_request(filled)

    assert request["body"]["model"] == "qwen3_5"  # a chat body without model asks for the served one
    assert request["body"]["max_tokens"] == 256000 and request["body"]["metadata"] == "len 256000"
    # $repeat stays for the host to expand: long prompts never travel.
    assert request["body"]["messages"][0]["content"] == {"$repeat": "hi ", "times": 12288}
    assert filled.expect[1] == 'body.model == `"qwen3_5"`'


def test_judging_names_the_first_unmet_expectation_with_an_excerpt(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    filled = with_values(probe, VALUES)

    good = judge(filled, {"status": 200, "body": {"model": "qwen3_5"}, "latency_ms": 5.0})
    bad = judge(filled, {"status": 200, "body": {"model": "other"}, "latency_ms": 7.0})

    assert good.passed and good.failed_expectation is None
    assert not bad.passed and bad.failed_expectation == 'body.model == `"qwen3_5"`'
    assert '"other"' in bad.excerpt
    assert table([good, bad]) == ["pass  chat  5 ms", "FAIL  chat  7 ms"]


def test_an_expectation_on_a_missing_part_of_the_answer_fails(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    verdict = judge(with_values(probe, VALUES), {"status": None, "error": "connection refused"})
    assert not verdict.passed and "connection refused" in verdict.excerpt


@pytest.mark.parametrize("text, message", [
    ("- {name: a, checks: protocol, guards: g, request: {path: /health}}\n", "expect is missing"),
    ("- {name: a, guards: g, request: {path: /health}, expect: [status]}\n", "checks is missing"),
    ("- {name: a, checks: weights, guards: g, request: {path: /health}, expect: [status]}\n",
     "checks is 'weights', not one of protocol, model"),
    ("- {name: a, checks: protocol, guards: g, request: {path: /health}, expect: ['status ==']}\n", "is not jmespath"),
    ("- {name: a, checks: protocol, guards: g, request: {path: /health, verb: GET}, expect: [status]}\n",
     "unknown request keys verb"),
    ("- {name: a, checks: protocol, guards: g, colour: red, request: {path: /health}, expect: [status]}\n",
     "unknown keys colour"),
    ("name: a\n", "must be a list of probes"),
    ("- [a\n", "is not YAML"),
])
def test_a_bad_suite_is_refused_naming_its_file_and_probe(tmp_path, text, message):
    path = suite(tmp_path, text)
    with pytest.raises(SuiteError, match=message) as refused:
        load_suites([path])
    assert path in str(refused.value)


def test_a_probe_name_is_unique_across_suites(tmp_path):
    first = suite(tmp_path, "- {name: a, checks: protocol, guards: g, request: {path: /health}, expect: [status]}\n")
    second = suite(tmp_path, "- {name: a, checks: protocol, guards: g, request: {path: /x}, expect: [status]}\n",
                   "more.yml")
    with pytest.raises(SuiteError, match="probe a is also defined in"):
        load_suites([first, second])


def test_without_jmespath_loading_a_suite_names_the_missing_package(tmp_path, monkeypatch):
    # As the import sanity test loads the plugins: ansible-core alone, no jmespath.
    monkeypatch.setattr(_probe_suite, "jmespath", None)
    monkeypatch.setattr(_probe_suite, "JMESPATH_IMPORT_ERROR", ImportError("No module named 'jmespath'"))
    with pytest.raises(SuiteError, match=r"need the jmespath Python package on the controller"):
        load_suites([suite(tmp_path, PROBE)])


def test_an_unknown_value_and_a_missing_suite_are_refused(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    with pytest.raises(SuiteError, match=r"\$\{long_prompt_words\} is none of"):
        with_values(probe, {"served_model_name": "q", "max_model_len": 1})
    with pytest.raises(SuiteError, match="does not exist"):
        load_suites([str(tmp_path / "nowhere.yml")])


def test_folders_tags_and_skips_select_probes(tmp_path):
    folder = tmp_path / "suites"
    folder.mkdir()
    suite(folder, "- {name: a, tags: [x], checks: protocol, guards: g, request: {path: /a}, expect: [status]}\n", "1.yml")
    suite(folder, "- {name: b, tags: [y], checks: model, guards: g, request: {path: /b}, expect: [status]}\n", "2.yml")
    probes = load_suites([str(folder)])

    assert [probe.name for probe in select(probes, [], [])] == ["a", "b"]
    assert [probe.name for probe in select(probes, ["y"], [])] == ["b"]
    assert [probe.name for probe in select(probes, [], ["a"])] == ["b"]
    assert [probe.name for probe in select(probes, [], [], checks=["protocol"])] == ["a"]
    assert [probe.name for probe in select(probes, [], [], checks=["model"])] == ["b"]
    assert [probe.name for probe in select(probes, [], [], checks=["protocol", "model"])] == ["a", "b"]
    with pytest.raises(SuiteError, match="probe_skip names no probe: c"):
        select(probes, [], ["c"])
    with pytest.raises(SuiteError, match="probe_checks: weights is none of protocol, model"):
        select(probes, [], [], checks=["weights"])


# ---- the expectation functions ------------------------------------------------------------

def judged(tmp_path, expectations, answer, request_body=None):
    """The verdict of a probe with these expectations on this answer."""
    body = request_body or {"messages": [{"role": "user", "content": "Hi"}]}
    text = ("- name: p\n  tags: [t]\n  checks: protocol\n  guards: g\n  request:\n    method: POST\n"
            "    path: /v1/chat/completions\n    body: " + json.dumps(body) + "\n  expect:\n"
            + "".join(f"    - {json.dumps(expectation)}\n" for expectation in expectations))
    (probe,) = load_suites([suite(tmp_path, text)])
    return judge(with_values(probe, dict(VALUES, answer_schema={
        "type": "object", "required": ["answer"]})), answer)


def content(text):
    return {"status": 200, "body": {"choices": [{"message": {"content": text}}]}}


@pytest.mark.parametrize("expression, expected", [
    ("from_json(c)", {"a": [1, None]}),
    ("from_json(bad)", None),
    ("from_json(nan)", None),
    ("from_json(padded)", {"a": [1, None]}),
    ("from_json(missing)", None),
    ("json_valid(c)", True),
    ("json_valid(null_text)", True),
    ("json_valid(bad)", False),
    ("json_valid(nan)", False),
    ("json_valid(missing)", False),
    ("type(from_json(c)) == 'object'", True),
    ("schema_errors(from_json(c), `{\"required\": [\"b\"]}`)", ["#: 'b' is a required property"]),
    ("schema_ok(from_json(c), `{\"properties\": {\"a\": {\"type\": \"array\"}}}`)", True),
    ("schema_ok(from_json(c), `{\"properties\": {\"a\": {\"items\": {\"type\": \"integer\"}}}}`)", False),
    ("schema_ok(`1`, `true`)", True),
    ("regex_match(c, '\"a\"')", True),
    ("regex_match(c, '^\"a\"')", False),
    ("regex_fullmatch(id, 'chatcmpl-[0-9a-f]+')", True),
    ("regex_fullmatch(id, 'chatcmpl')", False),
    ("map(&json_valid(@), list)", [True, False]),
])
def test_the_functions_jmespath_lacks(expression, expected):
    data = {"c": '{"a": [1, null]}', "padded": ' {"a": [1, null]}\n', "bad": "{not json}",
            "nan": "NaN", "null_text": "null", "id": "chatcmpl-0f3a", "list": ["[]", "["]}
    assert jmespath.search(expression, data, options=_probe_suite._options()) == expected


def test_a_json_object_expectation_fails_on_an_answer_that_only_looks_like_one(tmp_path):
    expectations = ["json_valid(body.choices[0].message.content)",
                    "type(from_json(body.choices[0].message.content)) == 'object'"]

    assert judged(tmp_path, expectations, content('{"answer": 42}')).passed
    assert judged(tmp_path, expectations, content("{not json}")).failed_expectation == \
        expectations[0]
    assert judged(tmp_path, expectations, content("[1, 2]")).failed_expectation == \
        expectations[1]
    assert not judged(tmp_path, expectations, content("```json\n{}\n```")).passed


def test_a_schema_comes_from_the_request_a_value_or_a_literal(tmp_path):
    request_body = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                "required": ["n"]}}}}
    from_request = ["schema_ok(from_json(body.choices[0].message.content), "
                    "request.body.response_format.json_schema.schema)"]
    from_value = ["schema_ok(from_json(body.choices[0].message.content), ${answer_schema})"]
    literal = ['schema_ok(from_json(body.choices[0].message.content), '
               '`{"type": "object", "required": ["answer"]}`)']

    assert judged(tmp_path, from_request, content('{"n": 3}'), request_body).passed
    assert not judged(tmp_path, from_request, content('{"n": 3.5}'), request_body).passed
    assert not judged(tmp_path, from_request, content('{"m": 3}'), request_body).passed
    for expectations in (from_value, literal):
        assert judged(tmp_path, expectations, content('{"answer": 1}')).passed
        assert not judged(tmp_path, expectations, content('{"other": 1}')).passed


def test_every_tool_call_is_checked_against_the_tools_parameters(tmp_path):
    request_body = {"messages": [], "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                              "properties": {"city": {"type": "string"}}}}}]}
    expectations = ["schema_ok(map(&from_json(@), body.choices[0].message.tool_calls[*]"
                    ".function.arguments), {type: 'array', minItems: `1`, "
                    "items: request.body.tools[0].function.parameters})"]

    def calls(*arguments):
        return {"status": 200, "body": {"choices": [{"message": {"tool_calls": [
            {"function": {"name": "get_weather", "arguments": text}} for text in arguments]}}]}}

    assert judged(tmp_path, expectations, calls('{"city": "Paris"}', '{"city": "Oslo"}'),
                  request_body).passed
    for wrong in (calls('{"city": "Paris"}', '{"town": "Oslo"}'), calls('{"city": 1}'),
                  calls("{city: Paris}"), calls()):
        assert not judged(tmp_path, expectations, wrong, request_body).passed


def test_a_schema_that_cannot_be_applied_fails_the_expectation_naming_why(tmp_path):
    expectations = ['schema_ok(from_json(body.choices[0].message.content), '
                    '`{"$ref": "#/$defs/missing"}`)']
    verdict = judged(tmp_path, expectations, content("{}"))

    assert not verdict.passed
    assert "does not resolve" in verdict.failed_expectation


def test_a_missing_schema_fails_instead_of_passing(tmp_path):
    # A typo in the path to the request's schema gives null, which is no schema at all.
    verdict = judged(tmp_path, ["schema_ok(from_json(body.choices[0].message.content), "
                                "request.body.no_such_schema)"], content("{}"))
    assert not verdict.passed and "invalid type" in verdict.failed_expectation


@pytest.mark.parametrize("expectation, message", [
    ("from_jsn(body)", r"calls from_jsn\(\), which is neither one of jmespath's functions"),
    ("regex_match(body.id)", r"calls regex_match\(\) with 1 arguments, 2 expected"),
    ("schema_ok(body, `{}`, `{}`)", r"calls schema_ok\(\) with 3 arguments, 2 expected"),
    ("regex_fullmatch(body.id, '(chatcmpl')", r"'\(chatcmpl' is not a regular expression"),
])
def test_a_misused_function_fails_the_suite_when_it_is_loaded(tmp_path, expectation, message):
    text = ("- {name: a, checks: protocol, guards: g, request: {path: /health}, expect: [" + json.dumps(expectation)
            + "]}\n")
    with pytest.raises(SuiteError, match=message):
        load_suites([suite(tmp_path, text)])


def test_expectations_see_the_request_as_filled_in(tmp_path):
    verdict = judged(tmp_path, ["request.body.model == ${served_model_name}",
                                "request.path == '/v1/chat/completions'"], content(""))
    assert verdict.passed


def test_the_shipped_suite_asks_for_two_choices_at_most_besides_the_probe_that_must_be_refused():
    probes = _probe_suite.load_suites([str(Path(__file__).resolve().parents[4] / "files" / "probes")])
    assert _probe_suite.most_choices(probes) == 2
    assert _probe_suite.most_choices([]) == 1
