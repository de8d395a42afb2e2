"""The canary analysis around the judge: the plan that picks a baseline before any host changes,
the settings it checks, the samples each side is made of, and the verdict that steers the
rollout."""

from __future__ import annotations

import random

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import (
    HISTORICAL,
    SAME_WINDOW,
    SETTINGS,
    analyse,
    candidate,
    canary_plan,
    canary_record,
    correctness_pairs,
    engine_program,
    first_batch_size,
    historical_side,
    paired,
    verdict_line,
)

MARGINS = {"margin": 0.05, "request_margin": 0.10, "quality_margin": 0.04, "pass_score": 95,
           "marginal_score": 75, "confidence": 0.98}


STANDIN = "/usr/local/corex/python3/bin/python3 -m engine_standin"


def host(release="sub510", status="good", gpus=4, instances=("vllm",), takes_part=True, gates=None, serving=None,
         engines=(STANDIN,)):
    return {"takes_part": takes_part, "release": {"id": release, "status": status}, "concurrency_changes": [],
            "gpus": gpus,
            "instances": list(instances), "gates": gates, "serving": list(instances if serving is None else serving),
            "engines": list(engines)}


def fleet(**overrides):
    hosts = {name: host() for name in ("h1", "h2", "h3", "h4")}
    hosts.update(overrides)
    return hosts


def test_a_candidate_is_what_the_plan_reads_of_a_host_from_its_own_plan_gpus_and_instances():
    current = {"id": "sub510", "record": {"status": "good", "gates": {"instances": {}}}}
    gpus = {"count": 4, "engines": [{"name": "vllm", "pid": 12}]}
    instances = [{"name": "vllm", "command": STANDIN.split() + ["--port", "8000"]}]
    made = candidate(current, takes_part=True, gpus=gpus, instances=instances)
    assert made == host(gates={"instances": {}})
    # On the vendor's files, with no GPU facts read (the engine phase skipped) and no instance.
    assert candidate(None, takes_part=False, gpus=None, instances=None) == {
        "takes_part": False, "release": {"id": None, "status": None}, "concurrency_changes": [], "gpus": None,
        "serving": [], "instances": [], "engines": [], "gates": None}


def test_a_candidate_names_the_concurrency_settings_its_new_release_changes():
    recorded = {"instances": {"vllm": {"args": {"max_num_seqs": 2, "max_num_batched_tokens": 4096, "dtype": "half"}}}}
    current = {"id": "sub510", "record": {"status": "good", "engine": recorded}}
    instances = [{"name": "vllm", "command": STANDIN.split(),
                  "record": {"args": {"max_num_seqs": 8, "max_num_batched_tokens": 4096, "dtype": "float16"}}}]
    assert candidate(current, takes_part=True, gpus=None, instances=instances)["concurrency_changes"] == [
        "max_num_seqs 2 -> 8"]
    plan = canary_plan(["h1", "h2"], fleet(h1={**host(), "concurrency_changes": ["max_num_seqs 2 -> 8"]}),
                       latency={"tpot_p99_ms": "2x"})
    assert plan["concurrency_changes"] == ["max_num_seqs 2 -> 8"]
    assert plan["objective"] == "the weighted score at the bench's offered load, TPOT p99 <= 2x the incumbent's"


def test_a_release_that_changes_concurrency_has_its_latencies_held_to_the_objectives_limit():
    # TPOT 1.8 times the baseline's, TTFT 3 times: "must not increase" would fail both.
    pairs = {**pairs_of(1.3), "tpot_ms": [(1.8, 1.0)] * 3, "ttft_ms": [(3.0, 1.0)] * 3}
    held = analyse(pairs, latency={"tpot_p99_ms": "2x", "ttft_p99_ms": 500}, concurrency_changes=["max_num_seqs 2 -> 8"],
                   **MARGINS)
    assert (held["verdict"], held["promote"]) == ("pass", True)
    # TTFT's absolute limit is the gate's to hold; TPOT is held to twice the baseline's.
    judged = {metric["name"]: metric["margin_pct"] for metric in held["metrics"]}
    assert "ttft_ms" not in judged and judged["tpot_ms"] == 100.0
    assert held["latency_judged"] == ("the release changes max_num_seqs 2 -> 8: TTFT and TPOT judged against "
                                      "TTFT p99 <= 500 ms, TPOT p99 <= 2x the incumbent's")
    over = analyse({**pairs, "tpot_ms": [(2.4, 1.0), (2.5, 1.0), (2.45, 1.0)]}, latency={"tpot_p99_ms": "2x"},
                   concurrency_changes=["max_num_seqs 2 -> 8"], **MARGINS)
    assert not over["promote"] and over["reasons"][0].startswith("tpot_ms +14")
    # Without a limit, the objective is the score: the canary does not judge TTFT and TPOT then.
    free = analyse(pairs, concurrency_changes=["max_num_seqs 2 -> 8"], **MARGINS)
    assert free["promote"] and {"ttft_ms", "tpot_ms"}.isdisjoint(metric["name"] for metric in free["metrics"])
    # The same release with no concurrency change must not slow its requests.
    assert not analyse(pairs, latency={"tpot_p99_ms": "2x"}, **MARGINS)["promote"]


def test_the_plan_filter_refuses_a_host_without_a_candidate():
    from ansible_collections.biv100.serving.plugins.filter.canary_plan import canary_plan_filter

    with pytest.raises(ValueError, match="no canary_candidate for h2"):
        canary_plan_filter(["h1", "h2"], {"h1": host(), "h2": None})
    assert canary_plan_filter(["h1", "h2"], fleet())["baseline"] == "h2"


def test_the_baseline_is_the_next_host_on_the_canarys_release_with_its_gpus_and_instances():
    hosts = fleet(h2=host(gpus=8), h3=host(release="sub509"))
    plan = canary_plan(["h1", "h2", "h3", "h4"], hosts)
    assert plan["analyse"] and (plan["baseline"], plan["kind"], plan["release"]) == ("h4", SAME_WINDOW, "sub510")
    stopped = canary_plan(["h1", "h2"], fleet(h2=host(serving=())), baseline="h2")
    assert stopped["error"].endswith("cannot be h1's baseline: its engine vllm does not run")
    assert plan["settings"] == SETTINGS and "error" not in plan
    assert plan["why"] == ("against h4 (same window, sub510); their own gap measured by 3 trials before the "
                           "canary changes")
    assert plan["before"]


def test_the_trials_before_the_change_need_a_canary_serving_every_instance_it_is_to_run():
    idle = canary_plan(["h1", "h2"], fleet(h1=host(instances=("vllm-1", "vllm-2"), serving=("vllm-1",)),
                                           h2=host(instances=("vllm-1", "vllm-2"))))
    assert idle["analyse"] and not idle["before"]
    assert idle["why"].endswith("no trial before the change: the canary does not serve vllm-2 now, so the hosts' "
                                "own gap counts as the release's")
    none = canary_plan(["h1", "h2"], fleet(), settings={"trials_before": 0})
    assert not none["before"] and "serving_canary_trials_before is 0" in none["why"]
    recorded = {"instances": {"vllm": {"bench": {"score": 10000.0}}}}
    historical = canary_plan(["h1", "h2"], fleet(h1=host(gates=recorded), h2=host(release="sub511")))
    assert historical["kind"] == HISTORICAL and not historical["before"]


def test_a_host_of_another_engine_is_never_the_baseline():
    real = "/usr/local/corex/lab/bin/in-engine-root /usr/local/corex/python3/bin/python3 -m vllm.entrypoints.openai.api_server"
    hosts = fleet(h2=host(engines=(real,)))
    assert canary_plan(["h1", "h2", "h3"], hosts)["baseline"] == "h3"
    assert canary_plan(["h1", "h2", "h3"], hosts, baseline="h2")["error"] == (
        f"serving_canary_baseline=h2 cannot be h1's baseline: its engine is {real}, the canary's {STANDIN}")
    command = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "2"]
    assert engine_program(command) == "/usr/bin/python3 -m vllm.entrypoints.openai.api_server"
    assert engine_program(command[:3]) == "/usr/bin/python3 -m vllm.entrypoints.openai.api_server"


def test_a_named_baseline_must_qualify_and_is_refused_naming_why():
    hosts = fleet(h3=host(gpus=8))
    assert canary_plan(["h1", "h2", "h3"], hosts, baseline="h2")["baseline"] == "h2"
    refused = canary_plan(["h1", "h2", "h3"], hosts, baseline="h3")
    assert refused["error"] == "serving_canary_baseline=h3 cannot be h1's baseline: it has 8 GPUs, the canary 4"
    assert "not in this rollout" in canary_plan(["h1", "h2"], hosts, baseline="elsewhere")["error"]
    assert "it is the canary" in canary_plan(["h1", "h2"], hosts, baseline="h1")["error"]


def test_hosts_serving_the_vendor_files_compare_with_each_other_and_a_fleet_never_deployed_is_not_judged():
    hosts = fleet(h1=host(release=None, status=None), h2=host(release=None, status=None))
    plan = canary_plan(["h1", "h2", "h3"], hosts)
    assert (plan["baseline"], plan["release"]) == ("h2", None) and "vendor files" in plan["why"]
    idle = {name: host(release=None, status=None, serving=()) for name in ("h1", "h2")}
    first = canary_plan(["h1", "h2"], idle)
    assert not first["analyse"] and first["why"].startswith("no host serves the vendor files on 4 GPUs")


def test_without_a_host_to_compare_the_canarys_own_record_is_the_weaker_historical_baseline():
    recorded = {"instances": {"vllm": {"bench": {"score": 10000.0}}}}
    hosts = fleet(h1=host(gates=recorded), h2=host(release="sub511"), h3=host(instances=("vllm-1", "vllm-2")))
    plan = canary_plan(["h1", "h2", "h3"], hosts)
    assert (plan["analyse"], plan["baseline"], plan["kind"]) == (True, None, HISTORICAL)
    assert plan["why"] == "against h1's own figures (historical, sub510)"
    unrecorded = canary_plan(["h1", "h2"], fleet(h2=host(release="sub511")))
    assert not unrecorded["analyse"] and "recorded no bench" in unrecorded["why"]


@pytest.mark.parametrize(("arguments", "why"), [
    ({"enabled": False}, "serving_canary_analysis is false"),
    ({"measured": False}, "the throughput gate is not measured"),
    ({"first_batch": 4}, "the rollout's first batch holds 4 hosts"),
])
def test_the_analysis_is_skipped_saying_why(arguments, why):
    plan = canary_plan(["h1", "h2"], fleet(), **arguments)
    assert not plan["analyse"] and plan["why"].startswith(why)


def test_a_fleet_of_one_and_a_canary_with_nothing_to_change_skip_it():
    assert canary_plan(["h1"], fleet())["why"] == "the fleet is the canary alone: no host waits on its verdict"
    assert canary_plan(["h1", "h2"], fleet(h1=host(takes_part=False)))["why"] == "the canary has nothing to change"
    failed = canary_plan(["h1", "h2"], fleet(h1=host(status="failed")))
    assert not failed["analyse"] and "failed, not good" in failed["why"]


def test_wrong_settings_are_refused_each_naming_its_variable():
    plan = canary_plan(["h1", "h2"], fleet(), settings={
        "trials": 0, "trials_before": -1, "margin": 1.5, "thresholds": {"pass": 40, "marginal": 60},
        "accept": "fail,marginal"})
    error = plan["error"]
    assert "serving_canary_trials must be a whole number of trials, at least 1, not 0" in error
    assert "serving_canary_trials_before must be a whole number of trials, at least 0, not -1" in error
    assert "serving_canary_margin must be a fraction in [0, 1)" in error
    assert "serving_canary_thresholds must be {pass: <score>, marginal: <score>}" in error
    assert "serving_canary_accept: fail cannot be accepted" in error
    assert "serving_canary_max_trials (2) must be at least serving_canary_trials (3)" in canary_plan(
        ["h1", "h2"], fleet(), settings={"max_trials": "2"})["error"]
    # Switched off, its settings do not matter.
    assert "error" not in canary_plan(["h1", "h2"], fleet(), enabled=False, settings={"trials": 0})


def test_settings_given_as_text_are_read_as_the_command_line_gives_them():
    given = {"trials": "4", "trials_before": "2", "max_trials": None, "margin": "0.03",
             "accept": "marginal, inconclusive"}
    plan = canary_plan(["h1", "h2"], fleet(), settings=given)
    assert plan["settings"]["trials"] == 4 and plan["settings"]["max_trials"] == 6
    assert plan["settings"]["trials_before"] == 2 and "measured by 2 trials" in plan["why"]
    assert plan["settings"]["margin"] == 0.03 and plan["settings"]["accept"] == ["marginal", "inconclusive"]


@pytest.mark.parametrize(("serial", "count", "size"), [
    ([1, "100%"], 4, 1), (["100%"], 4, 4), ("25%", 4, 1), ("50%", 4, 2), ("10%", 4, 1), (2, 4, 2), ("1", 1, 1),
])
def test_the_first_batch_is_counted_as_ansible_counts_serial(serial, count, size):
    assert first_batch_size(serial, count) == size


def bench(score, output_tps, requests, label="h1"):
    return {"label": label, "score": score, "output_tps": output_tps, "simulated": True,
            "samples": {"output_tps": [r[0] for r in requests], "ttft_ms": [r[1] for r in requests],
                        "tpot_ms": [r[2] for r in requests], "e2e_ms": [r[3] for r in requests]}}


def test_a_trials_figures_are_its_benchs_and_the_medians_of_its_requests_paired_by_instance_and_trial():
    canary = [bench(10000, 2500, [(3000, 25, 0.2, 60), (2800, 27, 0.3, 70)], "h1/vllm-1"), None,
              bench(9000, 2400, [(2900, 27, None, 65)], "h1/vllm-2"),
              bench(9900, 2450, [(2900, 26, 0.2, 66)], "h1/vllm-1")]
    baseline = [bench(10100, 2520, [(3000, 24, 0.2, 61)], "h2/vllm-2"),
                bench(10200, 2550, [(3000, 25, 0.2, 62)], "h2/vllm-1")]
    pairs = paired(canary, baseline)
    # vllm-1's second trial has no baseline trial to pair with: it is left out.
    assert pairs["score"] == [(10000.0, 10200.0), (9000.0, 10100.0)]
    assert pairs["ttft_ms"] == [(26.0, 25.0), (27.0, 24.0)]
    assert pairs["tpot_ms"] == [(0.25, 0.2)]  # a request too short for a TPOT has none
    historical = paired(canary, [bench(9800, 2400, [(2900, 26, 0.2, 61)], "recorded/vllm-1")], reuse=True)
    assert historical["score"] == [(10000.0, 9800.0), (9900.0, 9800.0)]


def test_the_correctness_pairs_are_each_instances_quality_and_share_of_passed_probes():
    pairs = correctness_pairs({"qualities": [1.0, None, 0.9], "probes": [[{"passed": True}, {"passed": False}], []]},
                              {"qualities": [0.97], "probe_shares": [1.0]})
    assert pairs == {"quality": [(1.0, 0.97), (0.9, 0.97)], "probes": [(0.5, 1.0)]}


def test_a_historical_side_is_what_the_release_recorded_labelled_by_instance_with_every_probe_passed():
    gates = {"instances": {"vllm-1": {"bench": bench(10000, 2500, [(3000, 25, 0.2, 60)]), "quality": {"score": 0.97}},
                           "vllm-2": {"bench": bench(9800, 2400, [(2900, 26, 0.2, 61)])}}}
    side = historical_side(gates, ["vllm-1", "vllm-2"])
    assert [entry["label"] for entry in side["benches"]] == ["recorded/vllm-1", "recorded/vllm-2"]
    assert side["qualities"] == [0.97, None] and side["probes"] == [[{"passed": True}], [{"passed": True}]]
    assert historical_side({"instances": {"vllm": {"bench": {"score": 1.0}}}}, ["vllm"])["benches"][0]["label"] == \
        "recorded"


def trials(rate, label, count=3, jitter=0.01, seed=1):
    """Benches whose figures scale with `rate`, each trial drawn with a little noise."""
    rng = random.Random(seed)
    benches = []
    for _trial in range(count):
        draw = 1 + rng.uniform(-jitter, jitter)
        benches.append(bench(10000 * rate * draw, 2500 * rate * draw,
                             [(3000 * rate * draw, 25 / rate / draw, 0.2 / rate / draw, 60 / rate / draw)], label))
    return benches


def pairs_of(canary_rate, baseline_rate=1.0, quality=1.0, count=3, jitter=0.01):
    return {**paired(trials(canary_rate, "h1", count, jitter, seed=1), trials(baseline_rate, "h2", count, jitter, seed=2)),
            **correctness_pairs({"qualities": [quality], "probes": [[{"passed": True}] * 75]},
                                {"qualities": [1.0], "probes": [[{"passed": True}] * 75]})}


def test_the_same_release_on_both_sides_passes_and_the_rollout_goes_on():
    analysis = analyse(pairs_of(1.0), **MARGINS)
    assert (analysis["verdict"], analysis["score"], analysis["promote"]) == ("pass", 100.0, True)


def test_a_canary_ten_percent_slower_fails_naming_the_score_its_shift_and_interval():
    analysis = analyse(pairs_of(0.9), **MARGINS)
    assert (analysis["verdict"], analysis["score"], analysis["promote"]) == ("fail", 0.0, False)
    assert any(reason.startswith("score -10.") and reason.endswith("< -5 %") for reason in analysis["reasons"])


def test_a_host_slower_by_nature_passes_once_the_trials_before_the_change_measured_its_gap():
    slow_host = {**paired(trials(0.94, "h1", seed=3), trials(1.0, "h2", seed=4))}
    alone = analyse(pairs_of(0.94), **MARGINS)
    judged = analyse(pairs_of(0.94), before=slow_host, **MARGINS)
    assert not alone["promote"] and alone["reasons"][0].startswith("score -6.")
    assert (judged["verdict"], judged["promote"]) == ("pass", True)


def test_a_quality_drop_beyond_its_bound_fails_the_canary_however_fast_it_is():
    analysis = analyse(pairs_of(1.0, quality=0.9), **MARGINS)
    assert analysis["verdict"] == "fail" and analysis["reasons"] == ["quality -10.0 % < -4 %"]


def test_too_few_trials_are_inconclusive_unless_accepted():
    pairs = pairs_of(1.0, count=1, jitter=0.5)
    analysis = analyse(pairs, **MARGINS)
    assert analysis["verdict"] == "inconclusive" and not analysis["promote"]
    assert any("too few trials to tell (1 trial)" in reason for reason in analysis["reasons"])
    accepted = analyse(pairs, accept=["inconclusive"], **MARGINS)
    assert accepted["promote"] and accepted["accepted"]
    with pytest.raises(ValueError, match="fail cannot be accepted"):
        analyse(pairs, accept=["fail"], **MARGINS)


def test_the_record_keeps_the_verdict_and_each_metrics_quartiles_not_the_trials():
    analysis = analyse(pairs_of(0.9), **MARGINS)
    analysis.update(trials=3, trials_before=3, baseline={"host": "h2", "kind": SAME_WINDOW, "release": "sub510"},
                    simulated=True)
    record = canary_record(analysis)
    assert record["verdict"] == "fail" and record["baseline"]["host"] == "h2"
    assert (record["trials"], record["trials_before"]) == (3, 3)
    score = next(metric for metric in record["metrics"] if metric["name"] == "score")
    assert score["classification"] == "Low" and score["canary"]["count"] == 3 and score["trials"] == 3
    assert set(score["canary"]) == {"count", "min", "p25", "median", "p75", "max", "mean"}
    assert canary_record(None) is None and canary_record({"skipped": True}) is None


def test_the_verdict_line_names_the_baseline_the_trials_and_the_reasons():
    analysis = analyse(pairs_of(0.9), **MARGINS)
    line = verdict_line(analysis, "h1", {"host": "h2", "kind": SAME_WINDOW, "release": "sub510"}, 3, 3)
    assert line.startswith("h1: canary analysis fail, score 0 after 3 trials (3 before the change) against h2 "
                           "(same window, sub510): score -")
    historical = verdict_line(analysis, "h1", {"host": None, "kind": HISTORICAL, "release": "sub510"}, 1)
    assert "after 1 trial against h1 (historical, sub510)" in historical
