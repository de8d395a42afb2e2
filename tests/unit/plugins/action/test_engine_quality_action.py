"""biv100.serving.engine_quality, the action, driven through ActionModule.run().

The host half is biv100.serving.engine_probe: each call the action makes to it is recorded and
answered as the test chooses - canned results, or the module's own request code run against a
small HTTP engine on loopback - so that what is tested is the set, the scoring and the gate.
"""

from __future__ import annotations

import ast
import importlib
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from gates_defaults import QUALITY_BOUND

from json_engine import JsonEngine

from ansible_collections.biv100.serving.plugins.action import engine_quality as quality_action
from ansible_collections.biv100.serving.plugins.modules import engine_probe

HOST = "gpu1"
URL = "http://127.0.0.1:8000"
PLUGINS = Path(__file__).resolve().parents[4] / "plugins"
SET = """
name: small
defaults: {temperature: 0, seed: 7, max_tokens: 16, chat_template_kwargs: {enable_thinking: false}}
cases:
  - {name: add, prompt: "Compute 1 + 2. Answer with the number only.", reference: 3, scorer: number}
  - {name: pick, prompt: "Which of these numbers is the largest? A) 1 B) 9 C) 3 D) 4. Answer with the letter only.",
     reference: B, scorer: choice}
  - {name: reverse, prompt: "Reverse the word 'abc'. Answer with the reversed word only.", reference: cba, scorer: exact}
  - {name: date, prompt: "Write the date March 5, 2024 in ISO 8601 format (YYYY-MM-DD), nothing else.",
     reference: '2024-03-05', scorer: regex}
"""
RIGHT = {"add": "3", "pick": "B", "reverse": "cba", "date": "2024-03-05"}


@pytest.fixture
def small_set(tmp_path):
    path = tmp_path / "small.yml"
    path.write_text(textwrap.dedent(SET))
    return str(path)


def chat(content, headers=None):
    return {"status": 200, "body": {"choices": [{"message": {"role": "assistant", "content": content}}]},
            "error": None, "headers": headers or {}, "latency_ms": 3.0}


def answering(contents: dict, headers=None):
    """A host whose engine answers each case with contents[name] (a dict result as it is)."""
    def answer(module_args):
        return [contents[request["name"]] if isinstance(contents[request["name"]], dict)
                else chat(contents[request["name"]], headers) for request in module_args["requests"]]
    return answer


def run_action(args: dict, answers, module_result=None):
    """(result, calls): ActionModule.run() with a host whose engine_probe answers with answers
    (a list of results, or a function of the module's arguments), the task's bound the
    competition's unless args has one."""
    args = {"bound": QUALITY_BOUND, **args}
    calls = []

    def execute_module(module_name, module_args=None, task_vars=None, **_):
        assert module_name == "biv100.serving.engine_probe"
        calls.append(module_args)
        if module_result is not None:
            return module_result
        return {"changed": False, "results": answers(module_args) if callable(answers) else answers}

    task = SimpleNamespace(args=dict(args), check_mode=False, async_val=0, action="biv100.serving.engine_quality")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = quality_action.ActionModule(task, connection, None, DataLoader(), None)
    action._execute_module = execute_module
    return action.run(task_vars={"inventory_hostname": HOST}), calls


def test_all_answers_right_without_a_baseline(small_set):
    result, calls = run_action({"set": small_set, "served_model_name": "qwen3_5", "api_key": "sk-1"},
                               answering(RIGHT))
    assert not result.get("failed"), result
    assert {key: result[key] for key in ("set", "score", "cases", "correct", "failed_cases", "baseline", "deviation",
                                         "bound", "passed", "simulated", "changed")} == {
        "set": "small", "score": 1.0, "cases": 4, "correct": 4, "failed_cases": [], "baseline": None,
        "deviation": None, "bound": QUALITY_BOUND, "passed": True, "simulated": False, "changed": False}
    assert result["msg"] == "quality 1.000 (no baseline yet: this release's score becomes one once it is good)"
    (call,) = calls
    assert set(call) == {"url", "api_key", "requests"} and call["url"] == URL and call["api_key"] == "sk-1"
    first = call["requests"][0]
    assert first == {"name": "add", "method": "POST", "path": "/v1/chat/completions", "timeout": 60.0, "body": {
        "model": "qwen3_5", "messages": [{"role": "user", "content": "Compute 1 + 2. Answer with the number only."}],
        "temperature": 0, "seed": 7, "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}}


def test_some_answers_wrong_are_named_with_what_was_expected_and_given(small_set):
    result, _calls = run_action({"set": small_set}, answering(
        {**RIGHT, "add": "1 + 2 = 4", "date": {"status": 500, "body": {"message": "engine died"}, "error": None}}))
    assert not result.get("failed") and (result["score"], result["correct"]) == (0.5, 2)
    assert result["failed_cases"] == [
        {"name": "add", "expected": "3", "given": "1 + 2 = 4"},
        {"name": "date", "expected": "/2024-03-05/", "given": "(HTTP 500: engine died)"}]


def test_a_baseline_within_the_bound_passes(small_set):
    result, _calls = run_action({"set": small_set, "baseline": {"release": "sub168", "score": 0.75}},
                                answering({**RIGHT, "pick": "C"}))
    assert (result["score"], result["deviation"], result["passed"]) == (0.75, 0.0, True)
    assert result["baseline"] == {"release": "sub168", "score": 0.75}
    assert result["msg"] == "quality 0.750 vs 0.750 of sub168: +0.0 % within ±4 %"


def test_a_baseline_missed_is_data_not_a_failed_task(small_set):
    result, _calls = run_action({"set": small_set, "baseline": {"release": "sub168", "score": "1.0"}},
                                answering({**RIGHT, "pick": "C"}))
    assert not result.get("failed") and result["passed"] is False and result["deviation"] == -0.25
    assert result["msg"] == "quality 0.750 vs 1.000 of sub168: -25.0 % beyond ±4 %"


def test_a_wider_bound(small_set):
    result, _calls = run_action({"set": small_set, "baseline": {"release": "sub168", "score": 1.0}, "bound": 0.3},
                                answering({**RIGHT, "pick": "C"}))
    assert result["passed"] and result["bound"] == 0.3 and result["msg"].endswith("-25.0 % within ±30 %")


def test_an_answer_marked_simulated_says_so(small_set):
    result, _calls = run_action({"set": small_set}, answering(RIGHT, headers={"x-biv100-simulated": "1"}))
    assert result["simulated"] is True and result["score"] == 1.0


def test_the_default_set_is_sent_whole_and_failed_requests_score_zero():
    result, calls = run_action({}, lambda args: [{"status": 500, "body": None, "text": "oops", "error": None}
                                                 for _request in args["requests"]])
    requests = calls[0]["requests"]
    assert len(requests) == result["cases"] >= 30 and "api_key" not in calls[0]
    assert all(request["body"]["temperature"] == 0 and "model" not in request["body"] for request in requests)
    assert (result["score"], result["passed"], len(result["failed_cases"])) == (0.0, False, result["cases"])
    assert not result.get("failed") and result["failed_cases"][0]["given"] == "(HTTP 500: oops)"


# ---- when the engine cannot be asked, the task fails ---------------------------------------


def test_an_engine_that_answers_nothing_fails_the_task(small_set):
    refused = {"status": None, "error": "[Errno 111] Connection refused", "headers": {}}
    result, _calls = run_action({"set": small_set}, lambda args: [refused] * len(args["requests"]))
    assert result["failed"] and "score" not in result
    assert result["msg"] == f"the engine at {URL} could not be asked: [Errno 111] Connection refused"


def test_a_refused_key_fails_the_task(small_set):
    result, _calls = run_action({"set": small_set, "api_key": "wrong"},
                                lambda args: [{"status": 401, "body": {"message": "Unauthorized"}}] * 4)
    assert result["failed"] and result["msg"] == f"the engine at {URL} refused every request (HTTP 401): check api_key"


def test_a_failed_module_call_fails_the_task(small_set):
    result, _calls = run_action({"set": small_set, "url": "https://gpu1:8000"}, None, module_result={
        "failed": True, "msg": "url https://gpu1:8000: only http:// is probed"})
    assert result["failed"] and result["msg"] == (
        "the quality set could not be sent to https://gpu1:8000: url https://gpu1:8000: only http:// is probed")


@pytest.mark.parametrize("args, message", [
    ({"set": "nope"}, "no quality set named 'nope'"),
    ({"baseline": {"release": "sub168"}}, "missing required arguments: score"),
    ({"baseline": {"release": "sub168", "score": 1.5}}, "baseline score must be from 0 to 1, not 1.5"),
    ({"bound": -0.1}, "bound must be at least 0"),
    ({"timeout": 0}, "timeout must be above 0"),
    ({"colour": "red"}, "Unsupported parameters"),
])
def test_bad_arguments_are_refused_before_any_request(args, message):
    with pytest.raises(AnsibleActionFail, match=message):
        run_action(args, [])


def test_the_bound_has_no_default_of_its_own(small_set):
    # The competition's is the gates role's to pass (serving_competition, the serving role's).
    task = SimpleNamespace(args={"set": small_set}, check_mode=False, async_val=0,
                           action="biv100.serving.engine_quality")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = quality_action.ActionModule(task, connection, None, DataLoader(), None)
    with pytest.raises(AnsibleActionFail, match="missing required arguments: bound"):
        action.run(task_vars={"inventory_hostname": HOST})


def test_a_bad_set_is_refused_before_any_request(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\ncases: [{name: a, prompt: p, reference: 2024-03-05, scorer: regex}]\n")
    calls = []
    with pytest.raises(AnsibleActionFail, match=f"quality set {broken} case a: reference must be a text"):
        calls = run_action({"set": str(broken)}, [])[1]
    assert calls == []


# ---- with engine_probe's own request code, over loopback -----------------------------------


class Engine(JsonEngine):
    """Answers a chat request with RIGHT's answer to its prompt, marked simulated as the lab's
    stand-in marks its answers (the header's case as a server may send it)."""

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = request["messages"][0]["content"]
        content = {"Compute 1 + 2.": "3", "Which of": "B", "Reverse": "cba", "Write the date": "2024-03-05"}
        answer = next(text for start, text in content.items() if prompt.startswith(start))
        self.send_json({"choices": [{"message": {"role": "assistant", "content": answer}}]},
                       headers={"X-BIV100-Simulated": "1"})


@pytest.fixture
def engine_url(loopback_server):
    return loopback_server(Engine)[0]


def test_engine_probes_answers_carry_the_headers_the_gate_reads(small_set, engine_url):
    def over_loopback(module_args):
        return [engine_probe.send_copies(module_args["url"], module_args.get("api_key"), request, 2000)
                for request in module_args["requests"]]

    result, _calls = run_action({"set": small_set, "url": engine_url}, over_loopback)
    assert (result["score"], result["simulated"]) == (1.0, True), result


# ---- the documentation -------------------------------------------------------------------


def module_documentation(name: str) -> dict:
    tree = ast.parse((PLUGINS / "modules" / f"{name}.py").read_text())
    return {node.targets[0].id: yaml.safe_load(node.value.value) for node in tree.body if isinstance(node, ast.Assign)
            and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")}


def documented_options(name: str) -> dict:
    documentation = module_documentation(name)["DOCUMENTATION"]
    options = dict(documentation["options"])
    for fragment in documentation.get("extends_documentation_fragment", []):
        if fragment.startswith("biv100.serving."):
            module = importlib.import_module(f"ansible_collections.biv100.serving.plugins.doc_fragments.{fragment[15:]}")
            options.update(yaml.safe_load(module.ModuleDocFragment.DOCUMENTATION).get("options") or {})
    return options


def comparable(options: dict) -> dict:
    return {name: (spec.get("type", "str"), spec.get("default"), bool(spec.get("required")),
                   comparable(spec.get("suboptions") or spec.get("options") or {}))
            for name, spec in options.items()}


def test_the_documentation_is_the_actions_argument_spec():
    assert comparable(documented_options("engine_quality")) == comparable(quality_action.ARGUMENT_SPEC)


def test_the_docs_module_holds_documentation_only():
    # As ansible.builtin.debug's: the action is the code, and nothing can run on a host.
    tree = ast.parse((PLUGINS / "modules" / "engine_quality.py").read_text())
    assert [node.targets[0].id for node in tree.body if isinstance(node, ast.Assign)] == [
        "DOCUMENTATION", "EXAMPLES", "RETURN"]
    assert all(isinstance(node, ast.Assign) or (isinstance(node, ast.ImportFrom) and node.module == "__future__")
               for node in tree.body)


def test_only_engine_probes_documented_options_travel(small_set):
    _result, (call,) = run_action({"set": small_set, "api_key": "k", "timeout": 5}, answering(RIGHT))
    probe_options = documented_options("engine_probe")
    assert set(call) <= set(probe_options)
    for request in call["requests"]:
        assert set(request) <= set(probe_options["requests"]["suboptions"])
    assert not any(name.startswith("_") for name in call)
