"""The competition's gates on the lab: every deploy scores its release; a release too slow, one
whose quality is off by more than the bound and one failing a strict probe are each rolled back
naming the gate; bench.yml scores the current release again and changes nothing; and the
throughput the benchmark reports is the stand-in's known rate. Every figure here is the lab's
stand-in's, and says so."""

from __future__ import annotations

import json

import pytest
import yaml
from lab_files import ALL_PROBES_PASSED, REPO, STATE, current_release, engine_pids, host_state, recorded
from playbook_runs import ONE_BATCH, run_playbook

from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS, SUB168
from engine_standin import speed_model

from ansible_collections.biv100.serving.plugins.plugin_utils._allocator_conf import allocator_conf

pytestmark = pytest.mark.lab

DEPLOY = "deploy.yml"
BENCH = "bench.yml"
GATES_TASK = "Hold the release to every gate"
# The competition's gates, as the gates role applies them by default (the other test modules'
# runs apply only the functional one).
COMPETITION = yaml.safe_load((REPO / "roles" / "serving" / "defaults" / "main.yml").read_text())["serving_competition"]
# The stand-in's environment as the lab's inventory sets it, its speed included.
STANDIN_ENV = yaml.safe_load((REPO / "inventory" / "lab" / "group_vars" / "biv100.yml").read_text())["engine_env"]


def on_one_host(host, **variables) -> dict:
    """Extra variables that give only `host`'s stand-in these environment variables."""
    return {"standin_env": STANDIN_ENV, "engine_env": (
        "{{ standin_env | combine(%s if inventory_hostname == '%s' else {}) }}"
        % (json.dumps(variables), host.name))}


def quality_baseline(host) -> str:
    """What the host's quality is held to: the vendor's base, scored on its first deploy, where the
    base serves the model; its first good release where the base's registry lacks it."""
    return "sub510" if host.variant == "vendor-unregistered" else "base"


def figures(release: str, host) -> dict:
    return json.loads((REPO / "build" / "bench" / release / f"{host.name}.json").read_text())


@pytest.fixture(scope="module")
def first(lab, tmp_path_factory):
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path_factory.mktemp("first"),
                       extravars={"serving_release": "sub510", "serving_gates": COMPETITION, **ONE_BATCH})
    assert run.rc == 0, run.stats
    return run


def test_a_deploy_scores_every_host_and_keeps_the_figures_with_the_release(lab, first):
    for host in lab.hosts:
        record = current_release(host)
        bench, quality = recorded(record, "gates")["bench"], recorded(record, "gates")["quality"]
        assert record["status"] == "good" and bench["gate"] == {"score": 8000, "passed": True}
        assert bench["simulated"] and quality["simulated"] and quality["score"] == 1.0
        assert bench["requests"] == {"ok": 24, "failed": 0}
        assert bench["score"] == pytest.approx(0.83 * bench["output_tps"] + 0.17 * bench["input_tps"])
        # The vendor's base, scored once before the payload went in, is the baseline every
        # release is held to; where the base cannot serve the model, the first good release.
        if quality_baseline(host) == "base":
            baseline = json.loads(host.path(f"{STATE}/baseline/quality-base.json").read_text())
            assert {key: baseline[key] for key in ("release", "score", "simulated")} == {
                "release": "base", "score": 1.0, "simulated": True}
            assert quality["baseline"]["release"] == "base" and quality["deviation"] == 0.0
            assert not host.path(f"{STATE}/baseline/quality.json").exists()
        else:
            assert not host.path(f"{STATE}/baseline/quality-base.json").exists()
            baseline = json.loads(host.path(f"{STATE}/baseline/quality.json").read_text())
            assert baseline == {"release": "sub510", "score": 1.0} and quality.get("baseline") is None
        saved = figures("sub510", host)
        assert saved["score"] == bench["score"] and saved["quality"]["score"] == 1.0 and saved["simulated"]
        for latency in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(saved[latency]) >= {"p50", "p90", "p99"}
    releases = first.stdout().split("RELEASES")[-1]
    for host in lab.hosts:
        line = next(text for text in releases.splitlines() if text.startswith(f"{host.name}: "))
        assert f"sub510 good; {ALL_PROBES_PASSED}" in line and " >= 8000 " in line
        assert "quality 1.000" in line and line.count("[simulated]") == 2


def test_bench_yml_scores_the_current_release_again_and_changes_nothing(lab, first, tmp_path):
    before, pids = host_state(lab), engine_pids(lab)

    run = run_playbook(BENCH, lab.inventory_path, tmp_path, extravars={"serving_gates": COMPETITION})

    assert run.rc == 0 and not run.hosts_with("changed"), run.stats
    assert host_state(lab) == before and engine_pids(lab) == pids
    for host in lab.hosts:
        (verdict,) = run.results(host.name, GATES_TASK)
        functional, quality, throughput = verdict["msg"].split("; ")
        assert functional.startswith(ALL_PROBES_PASSED) and quality.startswith(f"quality 1.000 vs 1.000 of {quality_baseline(host)}")
        assert throughput.startswith("score ") and "[simulated]" in throughput
    (line,) = [json.loads(text) for text in (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()
               if json.loads(text)["host"] == lab.hosts[0].name]
    assert line["playbook"] == "bench.yml" and line["bench"]["simulated"] and line["quality"]["score"] == 1.0


def test_the_reported_output_rate_is_the_stand_ins_known_rate_never_above_it(lab, first, tmp_path):
    # Long answers, so that an HTTP round trip is small beside a request's simulated time.
    workload = tmp_path / "known-rate.yml"
    workload.write_text(yaml.safe_dump({
        "name": "known-rate", "description": "fixed lengths", "warmup": 2, "requests": 8, "seed": 3,
        "stream": True, "mix": [{"name": "chat", "prompt_tokens": {"fixed": 1000}, "output_tokens": {"fixed": 1000}}]}))
    host = lab.hosts[0]

    run = run_playbook(BENCH, lab.inventory_path, tmp_path, limit=host.name, extravars={
        "serving_bench_workload": str(workload), "serving_gates": {"throughput": {"score": 8000}}})

    assert run.rc == 0, run.stats
    (measured,) = run.results(host.name, "Measure the engine's throughput")
    ok = measured["requests"]["ok"]
    # The engine's own token counts (usage), the chat template's tokens included; Sub168 runs two
    # of the bench's two in flight at once.
    output_tps = speed_model.predicted_score(
        SUB168, round(measured["input_tokens"] / ok), round(measured["output_tokens"] / ok),
        {**STANDIN_ENV, "PYTORCH_CUDA_ALLOC_CONF": allocator_conf(DEFAULT_ALLOCATOR_OPTIONS)}, concurrency=2, requests=ok).output_tps
    assert measured["output_tokens"] == 8 * 1000 and measured["simulated"]
    # No token leaves before the model has it due, so the rate never beats the model's; a loaded
    # machine (the unit tests run beside) only makes it slower, hence the loose floor, which
    # still tells two sequences at once (the model) from one at a time (0.6 of it).
    assert 0.85 * output_tps < measured["output_tps"] <= 1.01 * output_tps


def gate_failure(run, host) -> str:
    (message,) = [text for text in run.failure_messages(host.name) if "rolled back to" in text]
    return message


def test_a_release_too_slow_misses_the_throughput_gate_and_is_rolled_back(lab, first, tmp_path):
    slow = lab.hosts[1]

    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={
        "serving_release": "sub511", "serving_gates": COMPETITION,
        # The gate is the subject here; test_canary_analysis.py tests the canary's analysis.
        "serving_canary_analysis": False,
        **on_one_host(slow, BIV100_STANDIN_DECODE_TPS="2000")})

    assert run.rc != 0 and run.hosts_with("failures") == {slow.name}
    message = gate_failure(run, slow)
    assert message.startswith(f"{slow.name}: the gates phase failed at '{GATES_TASK}': throughput gate: score ")
    assert " < 8000: output " in message and "rolled back to sub510, engine healthy" in message
    assert current_release(slow)["id"] == "sub510"
    failed = json.loads(slow.path(f"{STATE}/releases/sub511/release.json").read_text())
    assert failed["status"] == "failed" and recorded(failed, "gates")["bench"]["gate"]["passed"] is False
    for host in lab.hosts:
        if host is not slow:
            assert current_release(host)["id"] == "sub511"


def test_a_release_whose_quality_is_off_by_more_than_the_bound_is_rolled_back(lab, first, tmp_path):
    wrong = lab.hosts[2]

    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=wrong.name, extravars={
        "serving_release": "sub512", "serving_gates": COMPETITION,
        **on_one_host(wrong, BIV100_STANDIN_WRONG_SHARE="0.25")})

    assert run.rc != 0
    message = gate_failure(run, wrong)
    assert f"'{GATES_TASK}': quality gate: quality 0." in message and f" vs 1.000 of {quality_baseline(wrong)}: -" in message
    assert "beyond ±4 %" in message and current_release(wrong)["id"] != "sub512"


def test_a_release_failing_a_strict_probe_is_rolled_back(lab, first, tmp_path):
    broken = lab.hosts[3]

    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=broken.name, extravars={
        "serving_release": "sub513", "serving_gates": COMPETITION,
        **on_one_host(broken, BIV100_STANDIN_BREAK="json_object")})

    assert run.rc != 0
    message = gate_failure(run, broken)
    assert message.startswith(f"{broken.name}: the probes phase failed")
    assert "response-format-json-object" in message and current_release(broken)["id"] != "sub513"
