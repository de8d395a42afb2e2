"""The ledger's files: whole lines appended, and the Markdown table made from all of them."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.callback.ledger import (
    SHOWN_FAILURE_CHARS,
    CallbackModule,
    append_lines,
    outcome_line,
    read_lines,
    write_table,
)

GOOD = {"time": "2026-11-29T20:00:00Z", "host": "h1", "playbook": "deploy.yml", "submission": "sub511",
        "release": "sub511", "state": "good", "files_changed": ["a.py", "b.py"],
        "guard": "12 protected files as recorded (after stage)", "probes": "49/49 probes passed",
        "mappings": [{"idea": "n within max_num_seqs", "place": "serving_chat.py", "change": "patch",
                      "entry": "n-within-max-num-seqs"}]}
ROLLED_BACK = {"time": "2026-11-29T20:00:00Z", "host": "h2", "playbook": "deploy.yml",
               "submission": "sub511", "release": "sub510", "state": "rolled back",
               "rollback": {"from": "sub511", "to": "sub510", "files": ["a.py"]},
               "probes": "49/49 probes passed", "failure": "Probe the engine: 1 of 49 probes failed"}


def test_lines_are_appended_and_the_table_is_made_from_all_of_them(tmp_path):
    ledger = tmp_path / "ledger" / "ledger.jsonl"
    append_lines(ledger, [GOOD])
    append_lines(ledger, [ROLLED_BACK])
    write_table(tmp_path / "ledger" / "LEDGER.md", read_lines(ledger))

    assert [line["host"] for line in read_lines(ledger)] == ["h1", "h2"]
    rows = (tmp_path / "ledger" / "LEDGER.md").read_text().splitlines()
    assert rows[4].startswith("| time | host | playbook | submission | release | state |")
    assert rows[6] == ("| 2026-11-29T20:00:00Z | h1 | deploy.yml | sub511 | sub511 | good | 2 | "
                       "12 protected files as recorded (after stage) | 49/49 probes passed |  | "
                       "n within max_num_seqs → serving_chat.py (patch) |  |")
    assert "| sub511 → sub510 (1 files) |" in rows[7]


def test_the_end_of_run_line_says_release_state_rollback_and_failure():
    assert outcome_line(GOOD) == "sub511 good; 49/49 probes passed"
    assert outcome_line(ROLLED_BACK) == ("sub510 rolled back; rolled back from sub511; 49/49 probes "
                                         "passed; failed at Probe the engine: 1 of 49 probes failed")
    assert outcome_line(None) == "untouched"


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

    rows = table.read_text().splitlines()[6:]
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
    """A ledger callback that writes under tmp_path, and end(hosts) ending its run."""
    callback = CallbackModule()
    callback.get_option = lambda name: str(tmp_path)
    callback._playbook = "deploy.yml"

    def end(*hosts):
        callback.v2_playbook_on_stats(Named("", processed=dict.fromkeys(hosts, 1)))
        return read_lines(tmp_path / "ledger.jsonl")

    callback.end = end
    return callback


def test_the_json_line_keeps_the_whole_failure_and_the_run_ends_with_one_line_per_host(ledger, capsys):
    tail = ["ERROR 11-29 18:00:04 [engine.py:412] Engine failed to start",
            "Traceback (most recent call last):", "RuntimeError: CUDA error: out of memory"]
    ledger.v2_runner_on_ok(task_result("h1", "Stage the payload", "biv100.serving.serving_overlay",
                                       {"release": "sub511", "payload_digest": "ab12", "changed_files": []}))
    ledger.v2_runner_on_failed(task_result("h1", "Wait until the engine serves the model",
                                           "biv100.serving.engine_health", {
                                               "msg": "engine process 4711 ended; log tail (3 lines of "
                                                      "/var/log/biv100-serving/engine.log) in log_tail",
                                               "log_tail": tail}))
    ledger.v2_runner_on_ok(task_result("h2", "Stage the payload", "biv100.serving.serving_overlay",
                                       {"release": "sub511", "payload_digest": "ab12", "changed_files": []}))
    ledger.v2_runner_on_failed(task_result("h2", "Check", "ansible.builtin.assert",
                                           {"msg": MULTI_LINE_FAILURE + "\n" + "x" * 5000}))

    first, second = ledger.end("h1", "h2", "h3")

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


# --- the clients' key ------------------------------------------------------------------------

SECRET = "sk-biv100-ledger-77aa88bb"


def test_the_ledger_records_the_engines_arguments_and_never_its_key(ledger, tmp_path):
    argv = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000",
            f"--api-key={SECRET}", "--api-key", SECRET]
    ledger.v2_runner_on_ok(task_result("h1", "Run the engine", "biv100.serving.engine_process", {
        "command": argv, "env": {"VLLM_API_KEY": SECRET}, "action": "start"}))

    [line] = ledger.end("h1")

    assert line["engine_args"] == ["--port", "8000", "--api-key=********", "--api-key", "********"]
    assert SECRET not in (tmp_path / "ledger.jsonl").read_text()
    assert SECRET not in (tmp_path / "LEDGER.md").read_text()


def test_a_host_lost_mid_run_is_recorded_and_shown_unreachable_where_it_was_lost(ledger, capsys):
    ledger.v2_runner_on_ok(task_result("h2", "Guard the model layer", "biv100.serving.model_guard",
                                       {"guard": {"checked": 1200, "mismatches": []}, "msg": "ok"}))
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
