"""biv100.serving.serving_report: the fleet's ledger and the tuning runs drawn on the controller,
through ActionModule.run() and through real ansible-playbook runs of the collection's report
playbook, which find the ledger where the ledger callback writes it and the tuning runs in
build/tune, and change nothing anywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.biv100.serving.plugins.action import serving_report as report_action
from ansible_collections.biv100.serving.plugins.plugin_utils._report import INDEX
from ansible_collections.biv100.serving.plugins.plugin_utils._report_figures import PLOTS
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import append_candidate, candidate_record
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import make_candidate

REPO = Path(__file__).resolve().parents[4]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def bench(score, simulated=True):
    latency = {"mean": 100.0, "p50": 90.0, "p90": 150.0, "p99": 210.0}
    return {"score": score, "input_tps": 2000.0, "output_tps": (score - 340) / 0.83, "total_tps": 9000.0,
            "request_tps": 2.0, "requests": {"ok": 8, "failed": 0}, "ttft_ms": latency, "tpot_ms": latency,
            "itl_ms": latency, "e2e_ms": latency, "weights": {"output": 0.83, "input": 0.17},
            "gate": {"score": 8000, "passed": score >= 8000}, "simulated": simulated, "workload": "random"}


def quality(deviation, simulated=True):
    return {"score": 0.9, "cases": 10, "correct": 9, "baseline": {"release": "sub168", "score": 0.9},
            "deviation": deviation, "bound": 0.04, "passed": abs(deviation) <= 0.04, "simulated": simulated}


LINES = [
    {"time": "2026-12-01T10:00:00Z", "host": "h1", "playbook": "deploy.yml", "release": "sub168", "state": "good",
     "bench": bench(7900.0), "quality": quality(0.0)},
    {"time": "2026-12-01T11:00:00Z", "host": "h1", "playbook": "deploy.yml", "release": "sub510", "state": "good",
     "bench": bench(8400.0), "quality": quality(-0.012)},
    {"time": "2026-12-01T12:00:00Z", "host": "h1", "playbook": "deploy.yml", "release": "sub511", "state": "good"},
]


INCUMBENT = make_candidate({"engine_args": {"max_num_seqs": 4}, "engine_allocator": {}, "engine_env": {}},
                           incumbent=True)
WIDER = make_candidate({**INCUMBENT, "engine_args": {"max_num_seqs": 8}})


@pytest.fixture(autouse=True)
def no_tuning_runs_of_the_checkout(monkeypatch, tmp_path):
    """The action's default folder of tuning runs is the project's build/tune, here this
    checkout's: the tests name theirs, so that runs tune.yml left there change nothing."""
    monkeypatch.setattr(report_action, "tune_dir", lambda: tmp_path / "no-tuning-runs")


def write_tuning_run(folder: Path, name: str) -> Path:
    """A run of tune.yml: the incumbent and one wider candidate measured, one round."""
    path = folder / name / "candidates.jsonl"
    for candidate, score in ((INCUMBENT, 7800.0), (WIDER, 8300.0)):
        append_candidate(path, candidate_record(
            candidate, "measured", round_number=1, factor=1.0, time="2026-12-01T14:00:00Z",
            figures={"score": score, "ttft_p99_ms": score / 20, "simulated": True, "gate_score": 8000.0}))
    return path


def write_ledger(folder: Path, lines=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines or LINES))
    return folder


def run_action(args: dict, check_mode=False, task_vars=None):
    task = SimpleNamespace(args=dict(args), check_mode=check_mode, async_val=0, action="biv100.serving.serving_report")
    task_vars = dict(task_vars or {})
    templar = Templar(loader=DataLoader(), variables=task_vars)
    action = report_action.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None,
                                        DataLoader(), templar, None)
    return action.run(task_vars=task_vars)


def test_the_report_is_written_and_a_second_run_with_the_same_ledger_changes_nothing(tmp_path):
    ledger = write_ledger(tmp_path / "ledger")
    dest = tmp_path / "report"

    first = run_action({"ledger_dir": str(ledger), "dest": str(dest)})
    written = {name: (dest / name).read_bytes() for name in [*PLOTS, INDEX]}
    second = run_action({"ledger_dir": str(ledger), "dest": str(dest)})

    assert first["changed"] and sorted(first["files_changed"]) == sorted([*PLOTS, INDEX])
    assert first["releases"] == ["sub168", "sub510", "sub511"] and first["hosts"] == ["h1"]
    assert first["index"] == str(dest / INDEX) and first["plots"] == [str(dest / name) for name in PLOTS]
    assert first["msg"] == f"3 releases on 1 hosts from 3 lines of {ledger / 'ledger.jsonl'}: {dest / INDEX}"
    for name in PLOTS:
        assert written[name].startswith(PNG_SIGNATURE)
    assert not second["changed"] and second["files_changed"] == []
    assert {name: (dest / name).read_bytes() for name in written} == written
    assert sorted(path.name for path in dest.iterdir()) == sorted(written)  # no temporary file left


def test_a_new_ledger_line_changes_what_it_changes_and_check_mode_writes_nothing(tmp_path):
    ledger = write_ledger(tmp_path / "ledger")
    dest = tmp_path / "report"
    run_action({"ledger_dir": str(ledger), "dest": str(dest)})
    before = {name: (dest / name).read_bytes() for name in [*PLOTS, INDEX]}
    write_ledger(ledger, LINES + [{**LINES[2], "time": "2026-12-01T13:00:00Z", "bench": bench(8800.0)}])

    checked = run_action({"ledger_dir": str(ledger), "dest": str(dest)}, check_mode=True)

    # sub511 gains a score and TTFT/TPOT points, not a quality deviation.
    assert checked["changed"] and checked["files_changed"] == ["score.png", "latency.png", INDEX]
    assert {name: (dest / name).read_bytes() for name in before} == before
    fresh = run_action({"ledger_dir": str(ledger), "dest": str(tmp_path / "new")}, check_mode=True)
    assert fresh["changed"] and not (tmp_path / "new").exists()


def canary(verdict):
    """A canary analysis as the ledger callback records it on the canary host's line."""
    side = {"count": 3, "min": 1.0, "p25": 2.0, "median": 3.0, "p75": 4.0, "max": 5.0, "mean": 3.0}
    return {"verdict": verdict, "score": 100.0, "accepted": False, "trials": 3,
            "baseline": {"host": "h2", "kind": "same window", "release": "sub168"}, "reasons": [],
            "thresholds": {"pass": 75.0, "marginal": 50.0}, "simulated": True,
            "metrics": [{"name": "score", "group": "throughput", "better": "higher", "margin_pct": 2.0,
                         "critical": True, "classification": "Pass", "conclusive": True, "shift_pct": 0.0,
                         "interval_pct": [-1.0, 1.0], "confidence": 0.9, "p_value": 1.0,
                         "canary": side, "baseline": side}]}


def test_a_canary_plot_is_returned_with_the_plots_and_removed_when_its_analysis_leaves_the_ledger(tmp_path):
    judged = [{**LINES[1], "canary": canary("pass")}, {**LINES[2], "canary": canary("marginal")}]
    ledger = write_ledger(tmp_path / "ledger", [LINES[0], *judged])
    dest = tmp_path / "report"
    dest.mkdir()
    (dest / "notes.png").write_bytes(b"the team's own")

    first = run_action({"ledger_dir": str(ledger), "dest": str(dest)})
    assert first["plots"] == [str(dest / name) for name in [*PLOTS, "canary-sub510.png", "canary-sub511.png"]]
    assert "canary-sub511.png" in first["files_changed"] and first["files_removed"] == []

    write_ledger(ledger, [LINES[0], judged[0], LINES[2]])
    checked = run_action({"ledger_dir": str(ledger), "dest": str(dest)}, check_mode=True)
    assert checked["changed"] and checked["files_removed"] == ["canary-sub511.png"]
    assert (dest / "canary-sub511.png").is_file()

    second = run_action({"ledger_dir": str(ledger), "dest": str(dest)})
    assert second["files_removed"] == ["canary-sub511.png"] and second["files_changed"] == [INDEX]
    assert second["plots"] == [str(dest / name) for name in [*PLOTS, "canary-sub510.png"]]
    assert sorted(path.name for path in dest.iterdir()) == sorted([*PLOTS, "canary-sub510.png", INDEX, "notes.png"])
    third = run_action({"ledger_dir": str(ledger), "dest": str(dest)})
    assert not third["changed"] and third["files_removed"] == third["files_changed"] == []


def test_tuning_runs_are_drawn_and_a_tuning_plot_is_removed_when_its_run_is_gone(tmp_path):
    ledger = write_ledger(tmp_path / "ledger")
    tunes, dest = tmp_path / "tune", tmp_path / "report"
    write_tuning_run(tunes, "run-1")
    write_tuning_run(tunes, "run-2")
    args = {"ledger_dir": str(ledger), "dest": str(dest), "tune_dir": str(tunes)}

    first = run_action(args)
    assert first["tuning_runs"] == ["run-1", "run-2"] and first["tune_dir"] == str(tunes)
    assert first["plots"] == [str(dest / name) for name in [*PLOTS, "tune-run-1.png", "tune-run-2.png"]]
    assert first["msg"].endswith(f"3 lines of {ledger / 'ledger.jsonl'} and 2 tuning runs of {tunes}: {dest / INDEX}")
    assert (dest / "tune-run-2.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "Tuning runs" in (dest / INDEX).read_text() and WIDER["id"] in (dest / INDEX).read_text()

    (tunes / "run-2" / "candidates.jsonl").unlink()
    checked = run_action(args, check_mode=True)
    assert checked["files_removed"] == ["tune-run-2.png"] and (dest / "tune-run-2.png").is_file()
    second = run_action(args)
    assert second["files_removed"] == ["tune-run-2.png"] and second["files_changed"] == [INDEX]
    assert sorted(path.name for path in dest.iterdir()) == sorted([*PLOTS, INDEX, "tune-run-1.png"])
    assert not run_action(args)["changed"]


def test_without_tuning_runs_the_page_says_so_and_a_tune_dir_named_must_exist(tmp_path):
    ledger = write_ledger(tmp_path / "ledger")
    result = run_action({"ledger_dir": str(ledger), "dest": str(tmp_path / "report")})
    assert result["tuning_runs"] == [] and result["tune_dir"] == str(tmp_path / "no-tuning-runs")
    assert "No tuning run found" in (tmp_path / "report" / INDEX).read_text()

    with pytest.raises(AnsibleActionFail, match=f"tune_dir {tmp_path / 'absent'} is not a folder"):
        run_action({"ledger_dir": str(ledger), "dest": str(tmp_path / "other"), "tune_dir": str(tmp_path / "absent")})
    broken = tmp_path / "tune" / "run" / "candidates.jsonl"
    broken.parent.mkdir(parents=True)
    broken.write_text("{}\n")
    with pytest.raises(AnsibleActionFail, match=f"{broken}: line 1 has no id"):
        run_action({"ledger_dir": str(ledger), "dest": str(tmp_path / "other"), "tune_dir": str(tmp_path / "tune")})
    assert not (tmp_path / "other").exists()


def test_the_variable_serving_ledger_dir_names_the_ledger_as_for_the_callback(tmp_path):
    write_ledger(tmp_path / "fleet-ledger")
    result = run_action({"dest": str(tmp_path / "report")},
                        task_vars={"serving_ledger_dir": trust_as_template("{{ base }}/fleet-ledger"),
                                   "base": str(tmp_path)})
    assert result["ledger"] == str(tmp_path / "fleet-ledger" / "ledger.jsonl")


def test_a_missing_ledger_fails_naming_where_it_was_looked_for(tmp_path):
    with pytest.raises(AnsibleActionFail, match=f"no deployment ledger at {tmp_path / 'ledger.jsonl'}: "):
        run_action({"ledger_dir": str(tmp_path), "dest": str(tmp_path / "report")})
    (tmp_path / "ledger.jsonl").write_text("{not json\n")
    with pytest.raises(AnsibleActionFail, match=r"ledger.jsonl: line 1: not JSON"):
        run_action({"ledger_dir": str(tmp_path), "dest": str(tmp_path / "report")})
    assert not (tmp_path / "report").exists()


def test_a_compared_fleets_ledger_is_read_by_its_folders_name_or_named_when_missing(tmp_path):
    write_ledger(tmp_path / "biv100")
    write_ledger(tmp_path / "lab")
    result = run_action({"ledger_dir": str(tmp_path / "biv100"), "dest": str(tmp_path / "report"),
                         "compare": [str(tmp_path / "lab")]})
    page = (tmp_path / "report" / "index.html").read_text()
    assert result["changed"] and "<th>lab</th>" in page

    with pytest.raises(AnsibleActionFail, match=f"compare: no deployment ledger at {tmp_path / 'gone' / 'ledger.jsonl'}"):
        run_action({"ledger_dir": str(tmp_path / "biv100"), "dest": str(tmp_path / "other"),
                    "compare": [str(tmp_path / "gone")]})
    assert not (tmp_path / "other").exists()


# --- real runs: the report playbook with any inventory ------------------------------------------

@pytest.fixture
def project(tmp_path):
    """A playbook project of its own (ansible.cfg with the ledger callback on, resolving
    biv100.serving from this checkout) whose inventory folder `fleet` lists a host that cannot be
    reached, and whose ledger is at ledger/fleet; run(*args, **env) runs the collection's report
    playbook there."""
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {REPO / 'collections'}\n"
                                          "callbacks_enabled = biv100.serving.ledger\n")
    fleet = tmp_path / "inventory" / "fleet"
    fleet.mkdir(parents=True)
    (fleet / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu1": {"ansible_host": "192.0.2.1"}}}}))
    write_ledger(tmp_path / "ledger" / "fleet")

    def run(*args, **env):
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("ANSIBLE_", "BIV100_"))}
        environment.update(ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **env)
        done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "inventory/fleet",
                               "biv100.serving.report", *args], cwd=tmp_path, env=environment, capture_output=True,
                              text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run.root = tmp_path
    return run


def test_the_playbook_draws_the_fleets_ledger_into_build_report_and_adds_no_ledger_line(project):
    ledger = project.root / "ledger" / "fleet" / "ledger.jsonl"
    before = ledger.read_bytes()

    first = project()
    second = project()

    report = project.root / "build" / "report" / "fleet"
    assert sorted(path.name for path in report.iterdir()) == sorted([*PLOTS, INDEX])
    assert "localhost                  : ok=2    changed=1" in first
    assert "localhost                  : ok=2    changed=0" in second
    assert "gpu1" not in first + second  # the inventory's host is never contacted
    # The report's own task is the collection's, yet the run leaves the ledger as it was.
    assert ledger.read_bytes() == before and not (project.root / "ledger" / "fleet" / "LEDGER.md").exists()


def test_the_playbook_draws_the_tuning_runs_of_the_projects_build_tune(project):
    write_tuning_run(project.root / "build" / "tune", "20261201T140000Z")

    output = project()

    report = project.root / "build" / "report" / "fleet"
    assert (report / "tune-20261201T140000Z.png").is_file()
    assert f"and 1 tuning runs of {project.root}/build/tune: {report / INDEX}" in output


def test_the_ledger_is_found_where_the_callback_would_write_it(project):
    elsewhere = write_ledger(project.root / "ledgers" / "from-env", LINES[:1])
    named = write_ledger(project.root / "ledgers" / "from-var", LINES[:2])

    by_env = project(BIV100_LEDGER_DIR=str(elsewhere))
    # The variable wins over the environment, as it does for the callback; a relative folder is
    # relative to the current one.
    by_var = project("-e", "serving_ledger_dir=ledgers/from-var", BIV100_LEDGER_DIR=str(elsewhere))
    by_default = project()

    report = project.root / "build" / "report" / "fleet" / "index.html"
    assert f"1 releases on 1 hosts from 1 lines of {elsewhere / 'ledger.jsonl'}: {report}" in by_env
    assert f"2 releases on 1 hosts from 2 lines of {named / 'ledger.jsonl'}: {report}" in by_var
    assert f"3 releases on 1 hosts from 3 lines of {project.root}/ledger/fleet/ledger.jsonl: {report}" in by_default
