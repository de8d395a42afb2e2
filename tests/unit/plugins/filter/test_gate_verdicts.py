import pytest

from ansible_collections.biv100.serving.plugins.filter.gate_verdicts import (
    FilterModule,
    gate_failures,
    gate_verdicts,
)

GATES = {"functional": {"min_probes": 3}, "quality": {"bound": 0.04}, "throughput": {"score": 8000}}


def probes(passed: int, failed: int = 0) -> dict:
    verdicts = [{"name": f"p{i}", "passed": True} for i in range(passed)]
    verdicts += [{"name": f"f{i}", "passed": False} for i in range(failed)]
    return {"probes": verdicts, "summary": f"{passed}/{passed + failed} probes passed"}


BENCH_OK = {"gate": {"score": 8000, "passed": True}, "msg": "score 8437 >= 8000 [simulated]"}
BENCH_SLOW = {"gate": {"score": 8000, "passed": False},
              "msg": "score 6120 < 8000: output 5400 tok/s, input 12400 tok/s [simulated]"}
QUALITY_OK = {"passed": True, "msg": "quality 0.969 vs 0.969 of sub168: +0.0 % within ±4 %"}
QUALITY_OFF = {"passed": False, "msg": "quality 0.906 vs 0.969 of sub168: -6.5 % beyond ±4 %"}


def test_a_release_clearing_every_gate_has_no_failure():
    verdicts = gate_verdicts(GATES, probes(3), BENCH_OK, QUALITY_OK)
    assert [(v["gate"], v["passed"]) for v in verdicts] == [
        ("functional", True), ("quality", True), ("throughput", True)]
    assert verdicts[0]["summary"] == "3/3 probes passed (at least 3)"
    assert gate_failures(verdicts) == []


def test_each_missed_gate_is_named_with_its_figures():
    failures = gate_failures(gate_verdicts(GATES, probes(3), BENCH_SLOW, QUALITY_OFF))
    assert failures == ["quality gate: quality 0.906 vs 0.969 of sub168: -6.5 % beyond ±4 %",
                        "throughput gate: score 6120 < 8000: output 5400 tok/s, input 12400 tok/s [simulated]"]


@pytest.mark.parametrize("result, summary", [
    (probes(2), "2 probes passed, fewer than the 3 the gate needs"),
    (probes(3, failed=1), "3/4 probes passed"),
], ids=["too-few", "one-failed"])
def test_the_functional_gate_needs_every_probe_and_enough_of_them(result, summary):
    (verdict,) = gate_verdicts({"functional": {"min_probes": 3}}, result)
    assert (verdict["passed"], verdict["summary"]) == (False, summary)


def test_a_skipped_gate_is_not_measured_and_fails_nothing():
    skipped = {"skipped": True, "changed": False}
    verdicts = gate_verdicts(GATES, probes(3), skipped, None)
    assert [(v["gate"], v["passed"], v["summary"]) for v in verdicts[1:]] == [
        ("quality", None, "not measured"), ("throughput", None, "not measured")]
    assert gate_failures(verdicts) == []


def test_a_gate_left_out_does_not_apply_and_an_unknown_one_is_refused():
    assert [v["gate"] for v in gate_verdicts({"throughput": {}}, probes(1), BENCH_SLOW)] == ["throughput"]
    with pytest.raises(ValueError, match="serving_gates names no such gate: speed"):
        gate_verdicts({"speed": {}})


def test_the_verdicts_follow_the_order_the_gates_are_named_in():
    verdicts = gate_verdicts({"throughput": {}, "functional": {"min_probes": 3}}, probes(3), BENCH_OK)
    assert [v["gate"] for v in verdicts] == ["throughput", "functional"]


def test_the_functional_gate_has_no_minimum_of_its_own():
    # The competition's is the gates role's to pass (serving_competition, the serving role's).
    with pytest.raises(ValueError, match="serving_gates.functional.min_probes is missing"):
        gate_verdicts({"functional": {}}, probes(60))


def test_a_failed_measurement_fails_its_gate_with_its_message():
    (verdict,) = gate_verdicts({"throughput": {}}, None, {"failed": True, "msg": "engine unreachable"})
    assert (verdict["passed"], verdict["summary"]) == (False, "engine unreachable")


def test_the_filters_are_exported_under_their_names():
    assert set(FilterModule().filters()) == {"gate_verdicts", "gate_failures", "gate_problems"}
