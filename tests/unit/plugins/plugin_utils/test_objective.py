"""The objective's latency limits: written as milliseconds or a factor of the incumbent's, checked
before any host changes, resolved against the incumbent's figures, and held or breached."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.filter.gate_verdicts import gate_problems, gate_verdicts
from ansible_collections.biv100.serving.plugins.plugin_utils._objective import (
    describe,
    held,
    latency_problems,
    parse_limit,
    resolved_limits,
)


@pytest.mark.parametrize(("given", "parsed"), [
    (250, ("ms", 250.0)), ("250", ("ms", 250.0)), (12.5, ("ms", 12.5)), ("1.5x", ("factor", 1.5)),
    (" 2X ", ("factor", 2.0)), (0, None), ("-1x", None), ("fast", None), (True, None), ("x", None),
    (float("inf"), None),
])
def test_a_limit_is_milliseconds_or_a_factor(given, parsed):
    assert parse_limit(given) == parsed


def test_wrong_limits_are_named_by_their_variable():
    assert latency_problems(None) == [] and latency_problems({"ttft_p99_ms": 300, "tpot_p99_ms": "1.5x"}) == []
    problems = latency_problems({"ttft_p99_ms": "soon", "e2e_p99_ms": 900})
    assert problems == [
        "serving_gates.throughput.latency.e2e_p99_ms is not a figure a limit may name (one of ttft_p99_ms, tpot_p99_ms)",
        "serving_gates.throughput.latency.ttft_p99_ms must be milliseconds (such as 250) or a factor of the "
        "incumbent's (such as 1.5x), not 'soon'"]
    assert latency_problems([300])[0].startswith("serving_gates.throughput.latency must be a map")


def test_a_factor_scales_the_incumbents_figure_and_without_one_is_not_applied():
    limits = resolved_limits({"ttft_p99_ms": 300, "tpot_p99_ms": "1.5x"}, {"tpot_p99_ms": 0.4}, "sub600")
    assert [(limit["figure"], limit["limit_ms"]) for limit in limits] == [
        ("ttft_p99_ms", 300.0), ("tpot_p99_ms", pytest.approx(0.6))]
    kept = held({"ttft_p99_ms": 250.0, "tpot_p99_ms": 0.5}, limits)
    assert kept["passed"] and not kept["breaches"] and [check["passed"] for check in kept["checks"]] == [True, True]
    over = held({"ttft_p99_ms": 250.0, "tpot_p99_ms": 0.8}, limits)
    assert not over["passed"] and over["breaches"] == ["TPOT p99 0.8 ms > 0.6 ms (1.5x sub600's 0.4 ms)"]
    unmeasured = held({}, limits)
    assert unmeasured["breaches"][0] == "TTFT p99 not measured > 300.0 ms"
    alone = held({"tpot_p99_ms": 9.0}, resolved_limits({"tpot_p99_ms": "1.5x"}))
    assert alone["passed"] and alone["unapplied"] == [
        "TPOT p99 limit 1.5x not applied: 1.5x the incumbent's, which recorded none"]


def test_the_objective_is_said_in_words():
    assert describe(None, 8) == "the weighted score at 8 requests in flight, no latency limit"
    assert describe({"ttft_p99_ms": 300, "tpot_p99_ms": "1.5x"}) == (
        "the weighted score at the bench's offered load, TTFT p99 <= 300 ms, TPOT p99 <= 1.5x the incumbent's")


def test_the_gates_settings_are_checked_whole_and_gate_verdicts_refuses_what_they_name():
    assert gate_problems({"functional": {"min_probes": 50}, "throughput": {"score": 8000}}) == []
    problems = gate_problems({"speed": {}, "functional": {}, "throughput": {"latency": {"tpot_p99_ms": "lots"}}})
    assert [problem.split(":", maxsplit=1)[0].split(" must", maxsplit=1)[0] for problem in problems] == [
        "serving_gates names no such gate", "serving_gates.functional.min_probes is missing",
        "serving_gates.throughput.latency.tpot_p99_ms"]
    assert gate_problems("all")[0].startswith("serving_gates must be a map")
    # A host's group may leave a bound out: held to the competition's, as the gates role holds it.
    competition = {"functional": {"min_probes": 50}, "throughput": {"score": 8000}}
    assert gate_problems({"functional": {}}, competition) == []
    assert gate_problems({"functional": {}, "speed": {}}, competition)[0].startswith("serving_gates names no such gate")
    assert gate_problems({"throughput": {"latency": {"tpot_p99_ms": "lots"}}}, competition)[0].startswith(
        "serving_gates.throughput.latency.tpot_p99_ms")
    with pytest.raises(ValueError, match="no such gate: speed"):
        gate_verdicts({"speed": {}})
