"""The ledger's files: whole lines appended, and the Markdown table made from all of them."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.callback.ledger import (
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
