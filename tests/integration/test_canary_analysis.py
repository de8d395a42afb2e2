"""The canary analysis on the lab: before the canary changes, it is benched side by side with the
next host of the rollout, both on the fleet's release (the A/A trials); after it cleared every
gate, the two are benched side by side again, and the canary is judged against the baseline. The
same release passes at the default settings; a canary 10 % slower fails and is rolled back with
the fleet untouched; one slower within the margin passes; without a host like the canary, its
own record is the baseline; too few trials are inconclusive and stop the rollout before the next
batch, unless accepted. Only the canary ever runs a rejected release. Last, the loop closed: what
tune.yml proposes on the canary's host goes through the fleet's canary to every host.
Every figure is the lab's stand-in's, and says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from engine_standin import speed_model
from lab_files import REPO, STATE, current_release, engine_pids, host_state, recorded
from playbook_runs import ONE_BATCH, run_playbook

# Never beside the other of the two (tests/integration/conftest.py).
pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("one_cpu_heavy_module_at_a_time")]

DEPLOY = "deploy.yml"
JUDGE_TASK = "Judge the canary against its baseline"
# The competition's gates: the analysis compares what the throughput gate measures.
GATES = yaml.safe_load((REPO / "roles" / "serving" / "defaults" / "main.yml").read_text())["serving_competition"]
STANDIN_ENV = yaml.safe_load((REPO / "inventory" / "lab" / "group_vars" / "biv100.yml").read_text())["engine_env"]
DECODE_TPS = float(STANDIN_ENV["BIV100_STANDIN_DECODE_TPS"])
PREFILL_TPS = float(STANDIN_ENV["BIV100_STANDIN_PREFILL_TPS"])


def per_host(variables: dict) -> dict:
    """Extra variables that give each named host's stand-in its own environment variables."""
    return {"standin_env": STANDIN_ENV, "standin_hosts": variables,
            "engine_env": "{{ standin_env | combine(standin_hosts[inventory_hostname] | default({})) }}"}


def slower(fraction: float) -> dict:
    """A stand-in `fraction` slower in everything: prefill, decode and a step's cost."""
    return {"BIV100_STANDIN_DECODE_TPS": str(DECODE_TPS * (1 - fraction)),
            "BIV100_STANDIN_PREFILL_TPS": str(PREFILL_TPS * (1 - fraction)),
            "BIV100_STANDIN_STEP_SECONDS": str(speed_model.STEP_SECONDS / (1 - fraction))}


def deploy(lab, tmp_path, release, **extravars):
    return run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={
        "serving_release": release, "serving_gates": GATES, **extravars})


def analysis(run, canary) -> dict:
    """The canary's last analysis in the run."""
    return [result for result in run.results(canary.name, JUDGE_TASK) if "verdict" in result][-1]


def said(run) -> str:
    """What the run printed without its colours, its lines joined as the YAML callback may fold a
    message, and an apostrophe that it doubled in a quoted one single again."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", run.stdout()).split()).replace("''", "'")


def releases_of(host) -> set[str]:
    return {path.name for path in host.path(f"{STATE}/releases").iterdir()}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """sub600 on every host, in one batch: no canary goes first, so nothing is analysed."""
    run = deploy(lab, tmp_path_factory.mktemp("fleet"), "sub600", **ONE_BATCH)
    assert run.rc == 0, said(run)[-3000:]
    assert "canary analysis skipped: the rollout's first batch holds 4 hosts" in said(run)
    return run


def test_the_same_release_on_canary_and_baseline_passes_and_the_rollout_goes_on(lab, fleet, tmp_path):
    canary, baseline = lab.hosts[0], lab.hosts[1]

    # At the default settings: the trials are paired, and the hosts' gap measured before the change.
    run = deploy(lab, tmp_path, "sub601")

    assert run.rc == 0, said(run)[-3000:]
    assert (f"canary analysis of {canary.name} against {baseline.name} (same window, sub600); their own gap "
            "measured by 3 trials before the canary changes, 3 to 6 trials") in said(run)
    judged = analysis(run, canary)
    # Three trials, or up to six while the machine's noise leaves the verdict open.
    assert (judged["verdict"], judged["score"]) == ("pass", 100.0) and 3 <= judged["trials"] <= 6
    assert judged["simulated"]
    assert judged["baseline"] == {"host": baseline.name, "kind": "same window", "release": "sub600"}
    metrics = {metric["name"]: metric for metric in judged["metrics"]}
    # One figure a side per trial, the latencies the medians of its 24 requests; the quality set
    # and the probes once a side.
    trials = judged["trials"]
    assert (metrics["score"]["canary"]["count"], metrics["ttft_ms"]["baseline"]["count"]) == (trials, trials)
    assert judged["trials_before"] == metrics["score"]["trials_before"] == 3
    assert metrics["probes"]["baseline"]["median"] == 1.0 and metrics["quality"]["canary"]["median"] == 1.0
    for host in lab.hosts:
        assert current_release(host)["id"] == "sub601" and current_release(host)["status"] == "good"
    kept = current_release(canary)["gates"]["canary"]
    assert kept["verdict"] == "pass" and kept["baseline"]["host"] == baseline.name
    assert "canary" not in current_release(baseline)["gates"]
    written = json.loads((REPO / "build" / "canary" / "sub601" / f"{canary.name}.json").read_text())
    assert len(written["pairs"]["e2e_ms"]) == trials and len(written["pairs_before"]["score"]) == 3
    (line,) = [json.loads(text) for text in (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()
               if json.loads(text)["host"] == canary.name]
    assert line["canary"]["verdict"] == "pass"
    # The gates' figures in the ledger stay the canary's own gate bench, not the analysis' runs.
    assert line["bench"]["score"] == current_release(canary)["gates"]["instances"]["vllm"]["bench"]["score"]
    releases = run.stdout().rsplit("RELEASES", maxsplit=1)[-1]
    assert f"canary pass, score 100 vs {baseline.name} (same window, sub600), {trials} trials [simulated]" in releases

    # The same release again, in a row: it passes again (a canary that flips on noise would not).
    (tmp_path / "again").mkdir()
    again = deploy(lab, tmp_path / "again", "sub611")
    assert again.rc == 0, said(again)[-3000:]
    assert analysis(again, canary)["verdict"] == "pass"
    assert all(current_release(host)["id"] == "sub611" for host in lab.hosts)


def test_a_canary_ten_percent_slower_fails_and_only_the_canary_ever_ran_it(lab, fleet, tmp_path):
    canary, others = lab.hosts[0], lab.hosts[1:]
    before, pids, had = host_state(lab), engine_pids(lab), current_release(canary)["id"]
    on_others = {key: value for key, value in before.items() if not key.startswith(f"{canary.name}:")}

    run = deploy(lab, tmp_path, "sub602", **per_host({canary.name: slower(0.10)}))

    assert run.rc != 0 and run.hosts_with("failures") == {canary.name}
    (message,) = [text for text in run.failure_messages(canary.name) if "rolled back to" in text]
    assert re.match(rf"{canary.name}: the canary phase failed at 'Hold the canary to its baseline': canary: "
                    r"score -\d+\.\d % \[-\d+\.\d, -\d+\.\d\] < -5 %", message), message
    assert f"rolled back to {had}, engine healthy" in message
    judged = analysis(run, canary)
    assert (judged["verdict"], judged["score"]) == ("fail", 0.0)
    assert {metric["name"]: metric["classification"] for metric in judged["metrics"]}["score"] == "Low"
    # The canary is back on the release it had; the fleet never changed.
    assert current_release(canary)["id"] == had
    failed = json.loads(canary.path(f"{STATE}/releases/sub602/release.json").read_text())
    assert failed["status"] == "failed" and failed["gates"]["canary"]["verdict"] == "fail"
    assert {key: value for key, value in host_state(lab).items() if not key.startswith(f"{canary.name}:")} == on_others
    assert {name: pid for name, pid in engine_pids(lab).items() if name != canary.name} == \
        {name: pid for name, pid in pids.items() if name != canary.name}
    assert all("sub602" not in releases_of(host) for host in others)


def test_a_canary_slower_within_the_margin_passes(lab, fleet, tmp_path):
    canary = lab.hosts[0]

    run = deploy(lab, tmp_path, "sub603", **per_host({canary.name: slower(0.03)}))

    assert run.rc == 0, said(run)[-3000:]
    judged = analysis(run, canary)
    score = {metric["name"]: metric for metric in judged["metrics"]}["score"]
    # Measured slower, by less than the default 5 % margin.
    assert judged["verdict"] == "pass" and -5 < score["shift_pct"] < 0
    assert all(current_release(host)["id"] == "sub603" for host in lab.hosts)


def test_without_a_host_like_the_canary_its_own_record_is_the_weaker_historical_baseline(lab, fleet, tmp_path):
    canary, others = lab.hosts[0], lab.hosts[1:]
    had = current_release(canary)["id"]
    (tmp_path / "others").mkdir()
    ahead = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "others", limit=",".join(host.name for host in others),
                         extravars={"serving_release": "sub606", "serving_gates": GATES, **ONE_BATCH})
    assert ahead.rc == 0, ahead.stats

    run = deploy(lab, tmp_path, "sub606")

    assert run.rc == 0, said(run)[-3000:]
    assert f"canary analysis of {canary.name} against {canary.name}'s own figures (historical, {had})" in said(run)
    judged = analysis(run, canary)
    assert judged["baseline"] == {"host": None, "kind": "historical", "release": had} and judged["promote"]
    metrics = {metric["name"]: metric for metric in judged["metrics"]}
    # The one gate bench recorded with the release, every trial paired with it; no A/A trials.
    score = metrics["score"]
    assert score["baseline"]["count"] == judged["trials"] and score["baseline"]["min"] == score["baseline"]["max"]
    assert judged["trials_before"] == 0
    assert f"against {canary.name} (historical, {had})" in judged["msg"]
    assert current_release(canary)["id"] == "sub606"
    assert not any(result for host in others for result in run.results(host.name, JUDGE_TASK))


def test_too_few_trials_are_inconclusive_and_stop_before_the_next_batch_unless_accepted(lab, fleet, tmp_path):
    canary, others = lab.hosts[0], lab.hosts[1:]
    # One trial, up to two, and none before the change: a pair or two has no spread to judge by. The
    # canary's engine gets a seed of its own, a change that restarts it (else nothing is judged).
    few = {"serving_canary_trials": 1, "serving_canary_max_trials": 2, "serving_canary_trials_before": 0,
           **per_host({canary.name: {"BIV100_STANDIN_SEED": "7"}})}
    before = {key: value for key, value in host_state(lab).items() if not key.startswith(f"{canary.name}:")}
    had = current_release(canary)["id"]

    run = deploy(lab, tmp_path, "sub604", **few)

    assert run.rc != 0 and run.hosts_with("failures") == {canary.name}
    judged = analysis(run, canary)
    assert judged["verdict"] == "inconclusive" and judged["trials"] == 2
    assert any("too few trials to tell (2 trials)" in reason for reason in judged["reasons"])
    (message,) = [text for text in run.failure_messages(canary.name) if "rolled back to" in text]
    assert "(inconclusive after 2 trials: the rollout stops before the next batch; measure again, or let it go on " \
           "with -e serving_canary_accept=inconclusive)" in message
    assert current_release(canary)["id"] == had
    assert {key: value for key, value in host_state(lab).items() if not key.startswith(f"{canary.name}:")} == before
    assert all("sub604" not in releases_of(host) for host in others)

    (tmp_path / "accepted").mkdir()
    accepted = deploy(lab, tmp_path / "accepted", "sub605", serving_canary_accept="inconclusive", **few)

    assert accepted.rc == 0, accepted.stats
    judged = analysis(accepted, canary)
    assert judged["verdict"] == "inconclusive" and judged["accepted"] and judged["promote"]
    assert all(current_release(host)["id"] == "sub605" for host in lab.hosts)


def test_what_tune_yml_proposes_goes_through_the_fleets_canary_to_every_host(lab, fleet, tmp_path):
    canary, baseline = lab.hosts[0], lab.hosts[1]
    # The objective: the weighted score at the bench's load, with a limit on the time per token.
    gates = {**GATES, "throughput": {**GATES["throughput"], "latency": {"tpot_p99_ms": 5}}}
    space = tmp_path / "space.yml"
    space.write_text("name: seqs\nengine_args:\n  max_num_seqs: [2, 4]\nbudget: {max_candidates: 3, max_minutes: 20}\n")

    tuned = run_playbook("tune.yml", lab.inventory_path, tmp_path / "tune", limit=canary.name,
                         extravars={"serving_gates": gates, "tune_space": str(space)})

    assert tuned.rc == 0, said(tuned)[-3000:]
    (planned,) = [event["event_data"]["res"] for event in tuned.events if event.get("event") == "runner_on_ok"
                  and event["event_data"].get("task") == "Begin the tuning run, or go on with the one named"]
    proposal = yaml.safe_load((Path(planned["run_dir"]) / "proposal.yml").read_text())
    assert proposal["engine_args"]["max_num_seqs"] == 4, said(tuned)[-3000:]
    assert "on the weighted score at the bench's offered load, TPOT p99 <= 5 ms, tune proposes" in said(tuned)

    run = deploy(lab, tmp_path / "deploy", "sub620", serving_gates=gates, **proposal)

    assert run.rc == 0, said(run)[-3000:]
    text = said(run)
    assert (f"canary analysis of {canary.name} against {baseline.name} (same window, sub605); their own gap "
            "measured by 3 trials before the canary changes, 3 to 6 trials, on the weighted score at the "
            "bench's offered load, TPOT p99 <= 5 ms") in text, text[-3000:]
    judged = analysis(run, canary)
    assert judged["verdict"] == "pass" and judged["promote"]
    assert judged["latency_judged"] == ("the release changes max_num_seqs 2 -> 4: TTFT and TPOT judged against "
                                        "TPOT p99 <= 5 ms")
    score = {metric["name"]: metric for metric in judged["metrics"]}["score"]
    # More of what the objective counts: a shift the judge passes (only a fall is harmful).
    assert score["classification"] == "Pass" and score["shift_pct"] > 10
    for host in lab.hosts:
        record = current_release(host)
        assert (record["id"], record["status"]) == ("sub620", "good")
        assert recorded(record, "engine")["args"]["max_num_seqs"] == 4
        # The proposal's mapping: the change is recorded as coming from the tuning run.
        assert {"source": f"tune.yml run {Path(planned['run_dir']).name}", "change": "tuned launch parameter",
                "what": "max_num_seqs 2 -> 4"}.items() <= next(
            row for row in record["changes"] if row["kind"] == "setting").items(), record["changes"]
