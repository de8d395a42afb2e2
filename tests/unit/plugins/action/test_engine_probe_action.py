"""The controller half of biv100.serving.engine_probe, driven through ActionModule.run().

The host is a canned reply: each call the action makes to the module is recorded and answered
with the answers a test chose, so that only the controller's reading and judging is tested.
(Named apart from tests/unit/plugins/modules/test_engine_probe.py: the test folders are not
packages, so two test files may not share a name.)
"""

from __future__ import annotations

import json
import re
import textwrap
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader

from ansible_collections.biv100.serving.plugins.action import engine_probe as probe_action

HOST = "gpu1"
SUITE = """
- name: chat
  tags: [chat]
  checks: protocol
  guards: no answer
  request:
    method: POST
    path: /v1/chat/completions
    body:
      messages: [{role: user, content: hi}]
  expect:
    - status == `200`
    - body.model == ${served_model_name}
- name: models
  tags: [models]
  checks: protocol
  guards: the model list
  request:
    method: GET
    path: /v1/models
  expect:
    - status == `200`
"""


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "suite.yml"
    path.write_text(textwrap.dedent(SUITE))
    return str(path)


def run_action(args: dict, answers=None):
    """(result, calls): ActionModule.run() with a host that answers every request with `answers`."""
    calls = []

    def execute_module(module_name, module_args=None, task_vars=None, **_):
        assert module_name == probe_action.MODULE
        calls.append(module_args)
        return {"changed": False, "results": answers(module_args) if callable(answers) else answers}

    task = SimpleNamespace(args=dict(args), check_mode=False, async_val=0, action=probe_action.MODULE)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = probe_action.ActionModule(task, connection, None, DataLoader(), None)
    action._execute_module = execute_module
    return action.run(task_vars={"inventory_hostname": HOST}), calls


def suite_args(suite, **options):
    return dict({"suites": [suite], "values": {"served_model_name": "qwen3_5"}, "url": "http://127.0.0.1:8000"},
                **options)


def test_every_probe_passing_is_summarised_and_the_requests_travel_in_one_call(suite, tmp_path):
    answers = [{"status": 200, "body": {"model": "qwen3_5"}, "latency_ms": 5.0},
               {"status": 200, "body": {"data": []}, "latency_ms": 1.0}]
    results_file = tmp_path / "results.json"
    result, calls = run_action(suite_args(suite, results_file=str(results_file)), answers)
    assert not result.get("failed") and result["msg"] == f"{HOST}: 2/2 probes passed", result
    (call,) = calls
    # The suite options stay on the controller; only the requests made of them are sent.
    assert set(call) == {"url", "requests"}
    assert [request["path"] for request in call["requests"]] == ["/v1/chat/completions", "/v1/models"]
    assert call["requests"][0]["body"]["model"] == "qwen3_5"
    assert json.loads(results_file.read_text())["summary"] == "2/2 probes passed"


def test_a_relative_results_file_is_written_under_the_project_folder(suite, tmp_path, monkeypatch):
    # The project folder is where ansible.cfg is: never the collection, which may be read-only.
    project = tmp_path / "project"
    (project / "ansible.cfg").parent.mkdir()
    (project / "ansible.cfg").write_text("[defaults]\n")
    monkeypatch.setattr(probe_action.C, "CONFIG_FILE", str(project / "ansible.cfg"))
    answers = [{"status": 200, "body": {"model": "qwen3_5"}, "latency_ms": 5.0},
               {"status": 200, "body": {"data": []}, "latency_ms": 1.0}]
    result, _calls = run_action(suite_args(suite, results_file="build/probes/run/h1.json"), answers)
    assert result["results_file"] == str(project / "build/probes/run/h1.json")
    assert json.loads((project / "build/probes/run/h1.json").read_text())["summary"] == "2/2 probes passed"


def test_a_failing_probe_fails_the_task_naming_it_its_guard_and_the_expectation(suite):
    answers = [{"status": 200, "body": {"model": "other"}, "latency_ms": 5.0},
               {"status": 200, "body": {"data": []}, "latency_ms": 1.0}]
    result, _calls = run_action(suite_args(suite), answers)
    assert result["failed"] and result["failed_probes"] == ["chat"]
    assert result["msg"].startswith(f"{HOST}: 1 of 2 probes failed, first chat (guards: no answer): expected "), result
    assert "body.model" in result["msg"]


def test_tags_select_the_probes_sent(suite):
    result, calls = run_action(suite_args(suite, tags=["models"]), [{"status": 200, "body": {}, "latency_ms": 1.0}])
    assert result["msg"] == f"{HOST}: 1/1 probes passed"
    assert [request["path"] for request in calls[0]["requests"]] == ["/v1/models"]


def test_a_bad_suite_is_refused_before_any_request_is_sent(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("- name: chat\n  checks: protocol\n  guards: no answer\n  request: {method: GET, path: /v1/models}\n"
                      "  expect: ['status ==']\n")
    with pytest.raises(AnsibleActionFail) as refusal:
        run_action(suite_args(str(broken)), [])
    assert f"{broken} probe chat: " in str(refusal.value) and "status ==" in str(refusal.value), str(refusal.value)


def test_no_probe_selected_is_refused_before_any_request_is_sent(suite):
    with pytest.raises(AnsibleActionFail, match="no probe selected"):
        run_action(suite_args(suite, tags=["nothing-has-this-tag"]), [])


def test_suites_and_requests_together_are_refused(suite):
    with pytest.raises(AnsibleActionFail, match=re.escape("mutually exclusive: requests|suites")):
        run_action(suite_args(suite, requests=[{"method": "GET", "path": "/v1/models"}]), [])


def test_without_suites_it_is_the_module_alone(suite):
    args = {"url": "http://127.0.0.1:8000", "requests": [{"method": "GET", "path": "/v1/models"}]}
    result, calls = run_action(args, [{"status": 200}])
    assert calls == [args] and result == {"changed": False, "results": [{"status": 200}]}
