"""tune.yml on the lab: a search of one host's engine settings finds the stand-in's best feasible
setting over the shipped space within its budget, proposes it, and leaves the host as it was; a
deploy of the proposal is recorded good with the higher score. A run killed mid-candidate leaves
the host on its old settings after the next run (or a rollback), and a resumed run does not
measure again what the killed one recorded. A space with an invalid candidate and one that
cannot fit in memory shows both as such, with nothing started for the invalid one.
Every figure is the lab's stand-in's, and says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from lab_files import STATE, current_release, engine_process, host_state, lock_holder, option_values, recorded, run_pids
from lab_guard import built_lab
from playbook_runs import REPO, ended, kill_controller, run_playbook

pytestmark = pytest.mark.lab

TUNE = "tune.yml"
GATES = yaml.safe_load((REPO / "roles" / "serving" / "defaults" / "main.yml").read_text())["serving_competition"]
# Prompts of about 7,000 tokens answered with 256, and a limit on the time per output token: the
# lab's speed model then has one best setting of the shipped space that holds the limit, inside
# the space (tests/integration/data/long_prompts.yml says why).
WORKLOAD = str(REPO / "tests" / "integration" / "data" / "long_prompts.yml")
SHIPPED_SPACE = yaml.safe_load((REPO / "files" / "tune" / "default.yml").read_text())
TPOT_LIMIT_MS = 1.2
# What the speed model makes best of the shipped space under that workload and limit
# (tests/unit/lab/test_standin_settings.py predicts it): four sequences side by side (eight
# break the limit), each prompt in one prefill chunk, which starts at the highest memory share
# only with expandable segments.
BEST = {"max_num_seqs": 4, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.95}
GIVEN = {"serving_gates": {**GATES, "throughput": {**GATES["throughput"], "latency": {"tpot_p99_ms": TPOT_LIMIT_MS}}},
         "serving_bench_workload": WORKLOAD}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One host: a search runs on one."""
    yield from built_lab(tmp_path_factory, n_hosts=1)


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    """sub700 deployed and proven with Sub168's settings, every gate measured."""
    run = run_playbook("deploy.yml", lab.inventory_path, tmp_path_factory.mktemp("deploy"),
                       extravars={"serving_release": "sub700", **GIVEN})
    assert run.rc == 0, run.stats
    return lab.hosts[0]


def tune(lab, tmp_path, **extravars):
    return run_playbook(TUNE, lab.inventory_path, tmp_path, limit=lab.hosts[0].name,
                        extravars={**GIVEN, **extravars})


def said(run) -> str:
    """What the run printed without its colours, its lines joined as the YAML callback may fold them."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", run.stdout()).split()).replace("''", "'")


def run_dir(run) -> Path:
    (plan,) = [result for result in run.events if result.get("event") == "runner_on_ok"
               and result["event_data"].get("task") == "Begin the tuning run, or go on with the one named"]
    return Path(plan["event_data"]["res"]["run_dir"])


def records(folder: Path, name: str = "candidates.jsonl") -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def what_runs(host) -> tuple:
    """The engine's command line and environment, and its env file: what the host runs."""
    argv, environ = engine_process(host)
    return argv, environ, host.path("/etc/biv100-serving/engine.env").read_text()


def serving_unrecorded(host, folder: Path) -> bool:
    """Whether the engine serves a max_num_seqs that no candidate recorded in folder has."""
    try:
        argv, _environ = engine_process(host)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False  # between two engines
    recorded_seqs = {record["settings"]["engine_args"]["max_num_seqs"] for record in records(folder)}
    return int(option_values(argv)["--max-num-seqs"]) not in recorded_seqs


def settings_of(record) -> tuple:
    """(max_num_seqs, max_num_batched_tokens, expandable segments) of a candidate's record."""
    return (record["settings"]["engine_args"]["max_num_seqs"],
            record["settings"]["engine_args"]["max_num_batched_tokens"],
            bool(record["settings"]["engine_allocator"].get("expandable_segments")))


def write_space(tmp_path, text: str) -> str:
    path = tmp_path / "space.yml"
    path.write_text(text)
    return str(path)


def test_a_search_over_the_shipped_space_proposes_the_best_setting_and_leaves_the_host_as_it_was(
        lab, deployed, tmp_path):
    host = deployed
    before, running = host_state(lab), what_runs(host)

    run = tune(lab, tmp_path / "tune")

    assert run.rc == 0, run.stats
    folder = run_dir(run)
    # Memory first: the largest candidate started at the space's highest share.
    (step,) = records(folder, "memory.jsonl")
    assert step["status"] == "started" and step["settings"]["engine_args"]["gpu_memory_utilization"] == 0.95
    written = records(folder)
    # max_num_seqs 1 would refuse the probes' n=2 requests: listed invalid first, never started.
    invalid = [record for record in written if record["status"] == "invalid"]
    assert {record["settings"]["engine_args"]["max_num_seqs"] for record in invalid} == {1} and len(invalid) == 6
    assert all("below the 2 choices (n) a probe asks for" in record["problems"][0] for record in invalid)
    measured = [record for record in written if record["status"] != "invalid"]
    # The rest of the grid, each once on the whole workload, within the budget: 18 settings, the
    # incumbent (Sub168 at the 0.95 the step-down chose) among them, measured first.
    assert len(measured) == len({record["id"] for record in measured}) == 18
    assert len(measured) <= SHIPPED_SPACE["budget"]["max_candidates"]
    assert all(record["factor"] == 1.0 and record["round"] == 1 for record in measured)
    assert measured[0]["incumbent"] and measured[0]["status"] == "measured"
    # 8192 batched tokens do not start without expandable segments; eight sequences break the
    # TPOT limit; every other setting is measured and holds it.
    statuses = {settings_of(record): record["status"] for record in measured}
    assert {setting for setting, status in statuses.items() if status == "failed_to_start"} == {
        (seqs, 8192, False) for seqs in (2, 4, 8)}, statuses
    assert {setting for setting, status in statuses.items() if status == "missed_gate"} == {
        setting for setting in statuses if setting[0] == 8 and setting != (8, 8192, False)}, statuses
    assert all(record["figures"]["simulated"] for record in measured if record["status"] == "measured")
    proposal = yaml.safe_load((folder / "proposal.yml").read_text())
    assert {key: proposal["engine_args"][key] for key in BEST} == BEST
    assert proposal["engine_allocator"]["expandable_segments"] is True
    assert proposal["engine_args"]["max_model_len"] == 256000  # the rest as the host runs it
    text = said(run)
    assert re.search(r"candidate 16 c[0-9a-f]{10} \(.*\): score \d+ >= 8000, TTFT p99 \d+ ms; best so far c[0-9a-f]{10} "
                     r"score \d+ \[simulated\]", text), text[-3000:]
    assert re.search(r"candidate 18 c[0-9a-f]{10} \(.*\): score \d+ >= 8000, TTFT p99 \d+ ms; missed a gate: throughput "
                     r"gate: latency over its limit: TPOT p99 [\d.]+ ms > 1.2 ms", text), text[-3000:]
    assert re.search(r"the search will cost 27 full benches and at most 27 engine starts, some \d+ (s|min) of benching", text)
    assert (f"on the weighted score at the bench's offered load, TPOT p99 <= {TPOT_LIMIT_MS:g} ms, tune proposes"
            in text), text[-3000:]
    # The best lies inside the space's sequences; its chunk is the largest the space tries.
    assert "judged pass" in text and "max_num_seqs 4 is the" not in text
    assert "max_num_batched_tokens 8192 is the largest value the space tries" in text
    assert f"deploy.yml -i {lab.inventory_path} -e @{folder}/proposal.yml" in text
    # The host runs exactly what it ran before: its release files, engine settings and env file.
    assert host_state(lab) == before
    assert what_runs(host) == running
    assert current_release(host)["id"] == "sub700"
    (line,) = [json.loads(text) for text in (tmp_path / "tune" / "ledger" / "ledger.jsonl").read_text().splitlines()]
    assert line["tune"]["proposed"] and "failure" not in line and line["release"] == "sub700"

    # The team adopts it through the normal path, every gate included.
    adopt = run_playbook("deploy.yml", lab.inventory_path, tmp_path / "adopt",
                         extravars={"serving_release": "sub701", **GIVEN, **proposal})
    assert adopt.rc == 0, adopt.stats
    record = current_release(host)
    assert (record["id"], record["status"]) == ("sub701", "good")
    assert {key: recorded(record, "engine")["args"][key] for key in BEST} == BEST
    old = json.loads(host.path(f"{STATE}/releases/sub700/release.json").read_text())
    # The model's 23,400 against Sub168's 18,300 on this bench.
    assert recorded(record, "gates")["bench"]["score"] > 1.1 * recorded(old, "gates")["bench"]["score"]
    assert option_values(engine_process(host)[0])["--max-num-seqs"] == "4"


def test_a_tune_killed_mid_candidate_is_undone_by_a_rollback_and_the_resumed_run_skips_what_it_measured(
        lab, deployed, tmp_path):
    host = deployed
    before, running = host_state(lab), what_runs(host)
    release = current_release(host)["id"]
    space = write_space(tmp_path, "name: seqs\nengine_args:\n  max_num_seqs: [2, 4, 8]\n"
                                  "budget: {max_candidates: 10, max_minutes: 30}\n")
    results = tmp_path / "runs"
    given = {**GIVEN, "tune_space": space, "tune_results_dir": str(results)}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), BIV100_LEDGER_DIR=str(tmp_path / "ledger"))
    command = [str(Path(sys.executable).with_name("ansible-playbook")), TUNE, "-i", str(lab.inventory_path),
               "-l", host.name, "-e", json.dumps(given)]
    controller = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
    # Killed once the incumbent and one other are recorded and the engine serves a third
    # candidate's settings, not yet recorded.
    holder = None
    try:
        deadline = time.monotonic() + 300
        while controller.poll() is None and time.monotonic() < deadline:
            holder = holder or lock_holder(host)
            found = [path.parent for path in results.glob("*/candidates.jsonl")]
            if found and len(records(found[0])) == 2 and serving_unrecorded(host, found[0]):
                break
            time.sleep(0.05)
    finally:
        kill_controller(controller)
    (folder,) = [path.parent for path in results.glob("*/run.json")]
    measured = records(folder)
    assert len(measured) == 2, measured
    assert what_runs(host) != running  # the kill left a candidate's settings on the engine
    assert ended(lambda: not run_pids(holder["run_id"]))

    # The current release's recorded settings, brought back by a rollback to it.
    back = run_playbook("rollback.yml", lab.inventory_path, tmp_path / "rollback",
                        extravars={"serving_rollback_to": release})
    assert back.rc == 0, back.stats
    assert what_runs(host) == running

    resumed = tune(lab, tmp_path / "resume", tune_space=space, tune_results_dir=str(results), tune_resume=folder.name)

    assert resumed.rc == 0, resumed.stats
    assert f"resuming tuning run {folder.name} over space seqs: 2 candidate(s) already recorded" in said(resumed)
    after = records(folder)
    assert len(after) == len({record["id"] for record in after}) == 3  # the two measured are not run again
    assert after[:2] == measured
    assert what_runs(host) == running
    # The release files are untouched (the rollback to the current release notes itself in the state).
    assert {key: value for key, value in host_state(lab).items() if STATE not in key} \
        == {key: value for key, value in before.items() if STATE not in key}


def test_a_space_with_an_invalid_candidate_and_one_that_cannot_fit_shows_both_and_starts_no_invalid_one(
        lab, deployed, tmp_path):
    host = deployed
    running = what_runs(host)
    space = write_space(tmp_path, "name: odd\nengine_args:\n  gpu_memory_utilization: [0.95, 0.80]\n"
                                  "  no_such_flag: [null, 1]\nbudget: {max_candidates: 10, max_minutes: 30}\n")

    run = tune(lab, tmp_path, tune_space=space)

    assert run.rc == 0, run.stats
    folder = run_dir(run)
    by_status = {}
    for record in records(folder):
        by_status.setdefault(record["status"], []).append(record)
    invalid = by_status.pop("invalid")
    assert len(invalid) == 2 and all(record["settings"]["engine_args"]["no_such_flag"] == 1
                                     and "no_such_flag" in " ".join(record["problems"]) and record["round"] is None
                                     for record in invalid)
    (too_big,) = by_status.pop("failed_to_start")
    assert too_big["settings"]["engine_args"]["gpu_memory_utilization"] == 0.80
    assert "KV cache" in too_big["log_tail"], too_big["log_tail"]
    (incumbent,) = by_status.pop("measured")
    assert incumbent["incumbent"] and not by_status
    # No engine was ever started with the invalid candidates' argument.
    started = [json.dumps(event["event_data"]["res"].get("invocation", {})) for event in run.events
               if event.get("event") in ("runner_on_ok", "runner_on_failed")
               and event["event_data"].get("task") == "Run the engine, restarting it on a new release or drift"]
    assert started and not any("no-such-flag" in text for text in started)
    text = said(run)
    assert "is invalid, never started" in text and "failed to start" in text
    assert "the incumbent" in text and "stays" in text
    assert what_runs(host) == running
