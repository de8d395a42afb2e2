"""The ledger's files: whole lines appended, the Markdown table made from all of them, and where
they live: outside the inventory folder, which Ansible reads whole as inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.biv100.serving.plugins.callback.ledger import (
    SHOWN_FAILURE_CHARS,
    CallbackModule,
    outcome_line,
    write_table,
)
from ansible_collections.biv100.serving.plugins.plugin_utils import _bench_record as bench_record
from ansible_collections.biv100.serving.plugins.plugin_utils import _json_lines as json_lines
from ansible_collections.biv100.serving.plugins.plugin_utils import _run_record as run_record
from ansible_collections.biv100.serving.plugins.plugin_utils._ledger_location import ledger_home
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import project_root

GOOD = {"time": "2026-11-29T20:00:00Z", "host": "h1", "playbook": "deploy.yml", "submission": "sub511",
        "release": "sub511", "state": "good", "files_changed": ["a.py", "b.py"],
        "guard": "12 protected files as recorded (after stage)", "probes": "49/49 probes passed",
        "mappings": [{"source": "n within max_num_seqs", "place": "serving_chat.py", "change": "patch",
                      "entry": "n-within-max-num-seqs"}],
        "changes": [{"kind": "file", "source": "n within max_num_seqs", "place": "serving_chat.py", "change": "patch",
                     "what": "entrypoints/openai/serving_chat.py", "proven_by": ["n-above-max-num-seqs"]},
                    {"kind": "setting", "source": "", "place": "computility-run.yaml env",
                     "change": "environment variable", "what": "VLLM_LOGGING_LEVEL = DEBUG", "proven_by": []}]}
ROLLED_BACK = {"time": "2026-11-29T20:00:00Z", "host": "h2", "playbook": "deploy.yml",
               "submission": "sub511", "release": "sub510", "state": "rolled back",
               "rollback": {"from": "sub511", "to": "sub510", "files": ["a.py"]},
               "probes": "49/49 probes passed", "failure": "Probe the engine: 1 of 49 probes failed"}


def read_lines(path):
    return [line for _number, line in json_lines.read(path)]


def runs_table(path):
    """The rows of LEDGER.md's table of runs, its header first."""
    return path.read_text().partition("## Runs\n")[2].strip().splitlines()


def test_lines_are_appended_and_the_table_is_made_from_all_of_them(tmp_path):
    ledger = tmp_path / "ledger" / "ledger.jsonl"
    json_lines.append(ledger, [GOOD])
    json_lines.append(ledger, [ROLLED_BACK])
    write_table(tmp_path / "ledger" / "LEDGER.md", read_lines(ledger))

    assert [line["host"] for line in read_lines(ledger)] == ["h1", "h2"]
    text = (tmp_path / "ledger" / "LEDGER.md").read_text()
    iterations, runs = text.split("## Runs\n")
    assert "### sub511\n\nh1 good, h2 rolled back to sub510; platform: no verdict recorded\n" in iterations
    assert ("| n within max_num_seqs | serving_chat.py | patch | entrypoints/openai/serving_chat.py | "
            "n-above-max-num-seqs ✓ |") in iterations
    assert ("| (no mapping declared) | computility-run.yaml env | environment variable | "
            "VLLM_LOGGING_LEVEL = DEBUG |  |") in iterations
    rows = runs.strip().splitlines()
    assert rows[0].startswith("| time | host | playbook | submission | release | state |")
    assert rows[2] == ("| 2026-11-29T20:00:00Z | h1 | deploy.yml | sub511 | sub511 | good | 2 | "
                       "12 protected files as recorded (after stage) | 49/49 probes passed |  |  |  |  |  | 2 |  |")
    assert "| sub511 → sub510 (1 files) |" in rows[3]


# --- the gates' figures ------------------------------------------------------------------------

# What engine_bench and engine_quality return (their figures at the top level, beside msg).
BENCH_RESULT = {"changed": False, "msg": "score 8412 >= 8000", "score": 8412.4, "input_tps": 2100.0,
                "output_tps": 9705.3, "total_tps": 11805.3, "request_tps": 2.4,
                "requests": {"ok": 64, "failed": 0},
                "ttft_ms": {"mean": 120.0, "p50": 110.0, "p90": 160.0, "p99": 212.34},
                "tpot_ms": {"mean": 30.0, "p50": 29.0, "p90": 35.0, "p99": 41.0},
                "itl_ms": {"mean": 30.0, "p50": 29.0, "p90": 35.0, "p99": 41.0},
                "e2e_ms": {"mean": 8000.0, "p50": 7900.0, "p90": 9000.0, "p99": 9900.0},
                "weights": {"output": 0.83, "input": 0.17}, "gate": {"score": 8000, "passed": True},
                "simulated": True, "workload": "random 1024/256"}
QUALITY_RESULT = {"changed": False, "msg": "0.957 within 4 % of sub168", "score": 0.9568, "cases": 200,
                  "correct": 191, "baseline": {"release": "sub168", "score": 0.969}, "deviation": -0.0126,
                  "bound": 0.04, "passed": True, "simulated": True}


def test_the_table_shows_score_output_rate_ttft_p99_and_quality_after_the_probes(tmp_path):
    table = tmp_path / "LEDGER.md"
    figures = {key: value for key, value in BENCH_RESULT.items() if key not in ("changed", "msg")}
    quality = {key: value for key, value in QUALITY_RESULT.items() if key not in ("changed", "msg")}
    write_table(table, [
        {**GOOD, "bench": figures, "quality": quality},
        {**GOOD, "bench": {**figures, "simulated": False}, "quality": {**quality, "simulated": False}},
        # The first release is its own quality baseline: a score, no deviation.
        {**GOOD, "quality": {**quality, "baseline": None, "deviation": None}},
        ROLLED_BACK])

    header, _rule, *rows = runs_table(table)
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns[8:13] == ["probes", "score", "output tok/s", "TTFT p99", "quality"]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [row[9:13] for row in cells] == [
        ["8412 (sim)", "9705.3 (sim)", "212.3 ms (sim)", "0.957, -1.3 % (sim)"],
        ["8412", "9705.3", "212.3 ms", "0.957, -1.3 %"],
        ["", "", "", "0.957 (sim)"],
        ["", "", "", ""]]
    assert all(len(row) == len(columns) for row in cells)


def gates_result(bench=None, quality=None):
    """The gates role's result: its verdicts and the figures it measured."""
    return {"verdicts": [{"gate": "throughput", "passed": True, "summary": "score 8412 >= 8000"}],
            "record": {"bench": bench_record.kept(bench) if bench else None,
                       "quality": {key: value for key, value in quality.items() if key not in ("changed", "msg")}
                       if quality else None}}


def test_the_bench_and_quality_results_are_recorded_with_the_contracts_keys(ledger):
    ledger.record("h1", phase="gates", instance="vllm", staged=STAGED)
    ledger.record("h1", gated=gates_result(BENCH_RESULT, QUALITY_RESULT))
    # A bench that misses the gate is recorded, then the gates fail the host.
    missed = {**BENCH_RESULT, "score": 6120.0, "gate": {"score": 8000, "passed": False}, "failed": True,
              "msg": "score 6120 < 8000"}
    ledger.record("h2", phase="gates", instance="vllm", staged=STAGED)
    ledger.record("h2", gated=gates_result(missed))
    ledger.v2_runner_on_failed(task_result("h2", "Hold the release to every gate", "ansible.builtin.assert",
                                           {"failed": True, "msg": "throughput gate: score 6120 < 8000"}))
    # One whose bench failed before it measured anything records no figures.
    ledger.record("h3", phase="gates", instance="vllm", guarded={"msg": "ok"})
    ledger.v2_runner_on_failed(task_result("h3", "Benchmark the engine", "biv100.serving.engine_bench",
                                           {"failed": True, "msg": "engine not answering"}))

    first, second, third = ledger.end("h1", "h2", "h3", failed=("h2", "h3"))

    assert first["bench"] == {key: value for key, value in BENCH_RESULT.items() if key not in ("changed", "msg")}
    assert first["quality"] == {key: value for key, value in QUALITY_RESULT.items() if key not in ("changed", "msg")}
    assert second["bench"]["gate"] == {"score": 8000, "passed": False} and "failed" not in second["bench"]
    assert second["failure"] == "Hold the release to every gate: throughput gate: score 6120 < 8000"
    assert "bench" not in third and "quality" not in third and third["guard"] == "ok"


def test_the_end_of_run_line_says_release_state_rollback_and_failure():
    assert outcome_line(GOOD) == "sub511 good; 49/49 probes passed"
    assert outcome_line(ROLLED_BACK) == ("sub510 rolled back; rolled back from sub511; 49/49 probes "
                                         "passed; failed at Probe the engine: 1 of 49 probes failed")
    assert outcome_line(None) == "untouched"


def test_the_end_of_run_line_gives_the_gates_headline_figures():
    measured = {**GOOD, "bench": {"score": 9912.4, "output_tps": 1650.2, "gate": {"score": 8000, "passed": True},
                                  "simulated": True},
                "quality": {"score": 0.9756, "deviation": -0.0244, "baseline": {"release": "sub168", "score": 1.0},
                            "simulated": True}}
    assert outcome_line(measured) == (
        "sub511 good; 49/49 probes passed; score 9912 >= 8000 (output 1650 tok/s) [simulated]; "
        "quality 0.976 (-2.4 % vs sub168) [simulated]")
    slow = {**GOOD, "bench": {"score": 6120, "output_tps": 5400, "gate": {"score": 8000, "passed": False}},
            "quality": {"score": 1.0, "deviation": None, "baseline": None}}
    assert outcome_line(slow) == "sub511 good; 49/49 probes passed; score 6120 < 8000 (output 5400 tok/s); quality 1.000"


# --- one line per host, whatever the failure says ----------------------------------------------

# A failure message of several lines, as any task may give one.
MULTI_LINE_FAILURE = (
    "Wait until the engine serves the model: engine process 4711 ended while waiting for "
    "http://127.0.0.1:8000 (last: connection refused); log tail (/var/log/biv100-serving/engine.log):\n"
    "ERROR 11-29 18:00:04 [engine.py:412] Engine failed to start\n"
    "Traceback (most recent call last):\n"
    "RuntimeError: CUDA error: out of memory")


def test_a_failure_of_several_lines_is_its_first_line_at_the_end_of_the_run():
    line = outcome_line({**ROLLED_BACK, "failure": MULTI_LINE_FAILURE})

    assert "\n" not in line
    assert line.endswith("failed at Wait until the engine serves the model: engine process 4711 ended "
                         "while waiting for http://127.0.0.1:8000 (last: connection refused); log tail "
                         "(/var/log/biv100-serving/engine.log): [+3 lines]")


def test_a_very_long_failure_is_cut_at_the_end_of_the_run():
    line = outcome_line({**ROLLED_BACK, "failure": "Probe the engine: " + "x" * 5000})

    failure = line.split("failed at ", 1)[1]
    assert len(failure) == SHOWN_FAILURE_CHARS and failure.endswith("...")


def test_a_table_row_stays_one_bounded_line(tmp_path):
    table = tmp_path / "LEDGER.md"
    write_table(table, [{**ROLLED_BACK, "failure": MULTI_LINE_FAILURE},
                        {**GOOD, "guard": "FAILED: 2 files differ:\nsampler.py\nsequence.py"},
                        {**ROLLED_BACK, "failure": "x" * 5000}])

    rows = runs_table(table)[2:]
    assert len(rows) == 3
    assert rows[0].endswith("; log tail (/var/log/biv100-serving/engine.log): [+3 lines] |")
    assert "| FAILED: 2 files differ: [+2 lines] |" in rows[1]
    assert len(rows[2]) < SHOWN_FAILURE_CHARS + 300


class Named:
    def __init__(self, name, **attributes):
        self.name = name
        self.__dict__.update(attributes)

    def get_name(self):
        return self.name


def task_result(host, task, action, answer):
    return Named("", _host=Named(host), _result=answer,
                 _task=Named(task, resolved_action=action, action=action))


@pytest.fixture
def ledger(tmp_path):
    """A ledger callback that writes under tmp_path; record(host, **boundary) writes a phase
    boundary into the host's run record as the serving_run action does; end(*hosts, failed=())
    ends the run, the hosts named in failed having ended it failed."""
    callback = CallbackModule()
    callback.get_option = lambda name: str(tmp_path)
    callback._playbook = "deploy.yml"
    records = {}

    def record(host, **boundary):
        records[host] = run_record.update(records.get(host), run="r1", host=host, **boundary)
        callback.v2_runner_on_ok(task_result(host, "Record the phase", "biv100.serving.serving_run",
                                             {"changed": False, "ansible_facts": {"serving_run": records[host]}}))

    def end(*hosts, failed=()):
        callback.v2_playbook_on_stats(Named("", processed=dict.fromkeys(hosts, 1), failures=dict.fromkeys(failed, 1)))
        return read_lines(tmp_path / "ledger.jsonl")

    callback.record = record
    callback.end = end
    return callback


STAGED = {"release": "sub511", "payload_digest": "ab12", "changed_files": [], "changed": False}


def test_the_json_line_keeps_the_whole_failure_and_the_run_ends_with_one_line_per_host(ledger, capsys):
    tail = ["ERROR 11-29 18:00:04 [engine.py:412] Engine failed to start",
            "Traceback (most recent call last):", "RuntimeError: CUDA error: out of memory"]
    ledger.record("h1", phase="engine", staged=STAGED)
    ledger.v2_runner_on_failed(task_result("h1", "Wait until the engine serves the model",
                                           "biv100.serving.engine_health", {
                                               "msg": "engine process 4711 ended; log tail (3 lines of "
                                                      "/var/log/biv100-serving/engine.log) in log_tail",
                                               "log_tail": tail}))
    ledger.record("h2", phase="engine", staged=STAGED)
    ledger.v2_runner_on_failed(task_result("h2", "Check", "ansible.builtin.assert",
                                           {"msg": MULTI_LINE_FAILURE + "\n" + "x" * 5000}))

    first, second = ledger.end("h1", "h2", "h3", failed=("h1", "h2"))

    assert first["failure_log_tail"] == tail and first["failure"].endswith(" in log_tail")
    assert second["failure"] == "Check: " + MULTI_LINE_FAILURE + "\n" + "x" * 5000
    shown = capsys.readouterr().out.split("RELEASES", 1)[1].strip("* \n").splitlines()
    assert shown == ["h1: sub511 pending; failed at Wait until the engine serves the model: engine "
                     "process 4711 ended; log tail (3 lines of /var/log/biv100-serving/engine.log) in "
                     "log_tail",
                     "h2: sub511 pending; failed at Check: Wait until the engine serves the model: engine "
                     "process 4711 ended while waiting for http://127.0.0.1:8000 (last: connection "
                     "refused); log tail (/var/log/biv100-serving/engine.log): [+4 lines]",
                     "h3: untouched"]


def test_a_failed_loop_is_recorded_by_its_first_failed_item_named_by_its_label(ledger):
    ledger.record("h1", phase="stage", staged=STAGED)
    held = "/var/lib/biv100-serving/lock is held by run R (bob@ci, pid 7) since T"
    ledger.v2_runner_on_failed(task_result("h1", "Take each host's lock", "biv100.serving.serving_lock", {
        "msg": "One or more items failed",
        "results": [{"failed": False, "msg": "this run took the lock", "_ansible_item_label": "h1"},
                    {"failed": True, "msg": held, "ansible_loop_var": "serving_hold_host",
                     "serving_hold_host": "h2"},
                    {"failed": True, "msg": "never shown", "_ansible_item_label": "h3"}]}))

    (line,) = ledger.end("h1", failed=("h1",))

    assert line["failure"] == f"Take each host's lock: h2: {held}"


# --- the clients' key ------------------------------------------------------------------------

SECRET = "sk-biv100-ledger-77aa88bb"


def test_the_ledger_records_the_engines_arguments_and_never_its_key(ledger, tmp_path):
    argv = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000",
            f"--api-key={SECRET}", "--api-key", SECRET]
    ledger.record("h1", phase="engine", instance="vllm",
                  engine={"command": argv, "env": {"VLLM_API_KEY": SECRET}, "action": "start", "changed": True})

    [line] = ledger.end("h1")

    assert line["engine_args"] == ["--port", "8000", "--api-key=********", "--api-key", "********"]
    assert SECRET not in (tmp_path / "ledger.jsonl").read_text()
    assert SECRET not in (tmp_path / "LEDGER.md").read_text()


def test_a_host_lost_mid_run_is_recorded_and_shown_unreachable_where_it_was_lost(ledger, capsys):
    ledger.record("h2", phase="stage", guarded={"guard": {"checked": 1200, "mismatches": []}, "msg": "ok"})
    ledger.v2_runner_on_unreachable(task_result("h2", "Stage the payload", "biv100.serving.serving_overlay",
                                                {"msg": "Failed to connect to the host via ssh: Connection refused",
                                                 "unreachable": True}))

    (line,) = ledger.end("h2")

    assert line["unreachable"] == "Stage the payload: Failed to connect to the host via ssh: Connection refused"
    shown = capsys.readouterr().out.split("RELEASES", 1)[1].strip("* \n").splitlines()
    assert shown == ["h2: no release pending; unreachable at Stage the payload: Failed to connect to the "
                     "host via ssh: Connection refused"]


def test_a_table_row_says_where_a_host_was_lost(tmp_path):
    write_table(tmp_path / "LEDGER.md", [{"host": "h2", "release": None, "unreachable": "Stage the payload: gone"}])
    assert (tmp_path / "LEDGER.md").read_text().splitlines()[-1].endswith("| unreachable at Stage the payload: gone |")


# --- where the ledger lives: outside the inventory folder -----------------------------------

REPO = Path(__file__).resolve().parents[4]


def test_the_ledger_is_at_the_project_root_in_a_folder_named_after_the_fleet(tmp_path, monkeypatch):
    (tmp_path / "inventory" / "biv100").mkdir(parents=True)
    (tmp_path / "inventory" / "biv100" / "hosts.yml").write_text("all: {}\n")
    monkeypatch.chdir(tmp_path / "inventory")
    root = project_root(str(tmp_path / "ansible.cfg"))

    assert root == tmp_path
    assert ledger_home(root, [str(tmp_path / "inventory" / "biv100")]) == tmp_path / "ledger" / "biv100"
    # An inventory file names the fleet after its folder; a host list names none.
    assert ledger_home(root, ["biv100/hosts.yml"]) == tmp_path / "ledger" / "biv100"
    assert ledger_home(root, ["h1,h2,", str(tmp_path / "inventory" / "biv100")]) == tmp_path / "ledger" / "biv100"
    assert ledger_home(root, ["localhost,"]) == tmp_path / "ledger" / "default"
    # A system-wide or user configuration, or none, is no project's: the current folder is the root.
    assert project_root("/etc/ansible/ansible.cfg") == project_root(None) == tmp_path / "inventory"
    assert project_root(str(Path("~/.ansible.cfg").expanduser())) == tmp_path / "inventory"


# --- real runs: the ledger never warns as an inventory ---------------------------------------------

PLAYBOOK = """\
- name: Guard a package and record it, which gives every host a ledger line
  hosts: all
  gather_facts: false
  vars:
    serving_run_id: unit-run
  tasks:
    - name: Guard the model layer
      biv100.serving.model_guard:
        package_root: "{{ guarded_package }}"
        state_dir: "{{ guarded_state }}"
        phase: unit
      register: guard_result

    - name: Record what the guard found
      biv100.serving.serving_run:
        phase: done
        guarded: "{{ guard_result }}"
"""


@pytest.fixture
def project(tmp_path):
    """A playbook project of its own (ansible.cfg with the ledger on, resolving biv100.serving from
    this checkout) with an inventory folder; run(*args, config=..., env=...) runs ansible-playbook
    there and returns its output."""
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {REPO / 'collections'}\n"
                                          "callbacks_enabled = biv100.serving.ledger\n")
    (tmp_path / "vllm" / "model_executor").mkdir(parents=True)
    (tmp_path / "vllm" / "model_executor" / "sampler.py").write_text("SAMPLER = 1\n")
    fleet = tmp_path / "inventory" / "fleet"
    (fleet / "group_vars").mkdir(parents=True)
    (fleet / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"h1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (fleet / "group_vars" / "all.yml").write_text(yaml.safe_dump({
        "guarded_package": str(tmp_path / "vllm"), "guarded_state": str(tmp_path / "state")}))
    (tmp_path / "deploy.yml").write_text(PLAYBOOK)

    def run(*args, config=tmp_path / "ansible.cfg", **env):
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("ANSIBLE_", "BIV100_"))}
        environment.update(ANSIBLE_CONFIG=str(config), ANSIBLE_NOCOLOR="1", **env)
        done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "inventory/fleet",
                               "deploy.yml", *args], cwd=tmp_path, env=environment, capture_output=True,
                              text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    run.root = tmp_path
    return run


def inventory_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines()
            if "[WARNING]" in line or "inventory source" in line or "Failed to parse" in line]


def test_each_run_appends_to_the_fleets_ledger_at_the_project_root_and_nothing_reads_it_as_inventory(project):
    first = project()
    second = project()

    ledger = project.root / "ledger" / "fleet"
    assert inventory_warnings(first) == inventory_warnings(second) == []
    assert not (project.root / "inventory" / "fleet" / "ledger").exists()
    lines = read_lines(ledger / "ledger.jsonl")
    assert [line["host"] for line in lines] == ["h1"] * 2
    assert (ledger / "LEDGER.md").read_text().count("| h1 |") == 2


def test_a_check_mode_run_adds_no_line(project):
    elsewhere = project.root / "ledgers" / "fleet"
    project("--check", config=REPO / "ansible.cfg", BIV100_LEDGER_DIR=str(elsewhere))
    assert not (elsewhere / "ledger.jsonl").exists()
    project(config=REPO / "ansible.cfg", BIV100_LEDGER_DIR=str(elsewhere))
    assert len(read_lines(elsewhere / "ledger.jsonl")) == 1


def test_serving_ledger_dir_names_the_folder_over_the_environment_and_an_extra_var_over_the_inventory(project):
    group_vars = project.root / "inventory" / "fleet" / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text() + 'serving_ledger_dir: "{{ inventory_dir }}/../../from-inventory"\n')

    project(BIV100_LEDGER_DIR=str(project.root / "from-env"))
    project("-e", "serving_ledger_dir=from-extra-vars")

    assert not (project.root / "from-env").exists() and not (project.root / "ledger").exists()
    assert len(read_lines(project.root / "from-inventory" / "ledger.jsonl")) == 1
    assert len(read_lines(project.root / "from-extra-vars" / "ledger.jsonl")) == 1


# --- hosts of several engine instances ------------------------------------------------------


def test_each_instance_of_a_host_gets_its_line_named_host_slash_instance(ledger, capsys):
    ledger.record("h5", phase="stage", staged={**STAGED, "changed_files": ["a.py"]})
    for name, port in (("vllm-1", "8000"), ("vllm-2", "8001")):
        ledger.record("h5", phase="engine", instance={"name": name, "label": f"h5/{name}"}, engine={
            "name": name, "command": ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", port]})
        ledger.record("h5", phase="gates", probed={"summary": f"75/75 probes passed on {name}", "probes": []})
        ledger.record("h5", gated=gates_result(BENCH_RESULT))
    ledger.record("h5", phase="done", marked={"release": "sub511", "status": "good"})
    # A host of one engine has one line, named after the host.
    ledger.record("h1", phase="engine", instance="vllm", engine={
        "name": "vllm", "command": ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]})
    ledger.record("h1", phase="gates", probed={"summary": "75/75 probes passed", "probes": []})

    lines = ledger.end("h1", "h5")

    assert [line["host"] for line in lines] == ["h1", "h5/vllm-1", "h5/vllm-2"]
    assert lines[0]["probes"] == "75/75 probes passed" and "instances" not in lines[0]
    assert [line["engine_args"] for line in lines[1:]] == [["--port", "8000"], ["--port", "8001"]]
    assert all(line["release"] == "sub511" and line["state"] == "good" and line["bench"]["score"] == 8412.4
               for line in lines[1:])
    shown = capsys.readouterr().out.split("RELEASES", 1)[1].strip("* \n").splitlines()
    assert [line.split(":")[0] for line in shown] == ["h1", "h5/vllm-1", "h5/vllm-2"]
    assert "75/75 probes passed on vllm-2" in shown[2]


def test_the_canary_analysis_is_kept_on_the_canarys_line_beside_the_gates_figures(ledger, capsys):
    ledger.record("h1", phase="gates", instance="vllm", staged=STAGED)
    ledger.record("h1", gated=gates_result(BENCH_RESULT))
    ledger.record("h1", phase="canary", instance="")
    metric = {"name": "score", "group": "throughput", "better": "higher", "margin_pct": 2.0, "critical": True,
              "classification": "Low", "conclusive": True, "shift_pct": -8.8, "interval_pct": [-9.3, -8.3],
              "confidence": 0.9, "p_value": 0.1, "u": 0.0, "canary": {"count": 3}, "baseline": {"count": 3}}
    ledger.record("h1", canary={
        "verdict": "fail", "score": 0.0, "accepted": False, "promote": False, "trials": 3, "simulated": True,
        "baseline": {"host": "h2", "kind": "same window", "release": "sub510"}, "thresholds": {"pass": 75, "marginal": 50},
        "reasons": ["score -8.8 % [-9.3, -8.3] (90 % interval) < -2 %"], "metrics": [metric], "msg": "h1: ..."})

    (line,) = ledger.end("h1")

    assert line["bench"]["score"] == BENCH_RESULT["score"] and "probes" not in line
    assert line["canary"]["verdict"] == "fail" and line["canary"]["baseline"]["host"] == "h2"
    assert "u" not in line["canary"]["metrics"][0] and "promote" not in line["canary"]
    assert not [key for key in line if key.startswith("_")]
    shown = capsys.readouterr().out.split("RELEASES", 1)[1]
    assert "canary fail, score 0 vs h2 (same window, sub510), 3 trials [simulated]" in shown


def test_a_tuning_run_has_its_own_line_and_its_candidates_are_neither_the_engine_nor_a_failure(ledger, capsys):
    ledger.record("h1", phase="tune", marked={"release": "sub510", "status": "good"})
    # A candidate that missed a gate is the search's finding, recorded by the run, not the host's failure.
    ledger.v2_runner_on_failed(task_result("h1", "Hold the release to every gate", "ansible.builtin.assert",
                                           {"failed": True, "msg": "functional gate: 73/75 probes passed"}))
    tuned = {"run": "r1", "space": "default", "measured": 24, "candidates": 24, "proposed": "cd92cddae13",
             "incumbent": "c7088e12f1b", "msg": "h1: tune proposes cd92cddae13"}
    # What the host runs again after the run, and what the run found.
    ledger.record("h1", phase="done", instance="vllm", tuned={"proposed": True, "tune": tuned}, engine={
        "name": "vllm", "command": ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "2"]})

    (line,) = ledger.end("h1")

    assert line["tune"] == tuned and "failure" not in line and "bench" not in line
    assert line["engine_args"] == ["--max-num-seqs", "2"]  # what the host runs again after the run
    shown = capsys.readouterr().out.split("RELEASES", 1)[1]
    assert "sub510 good; tuning run r1: 24 candidates measured over space default, proposes cd92cddae13" in shown
