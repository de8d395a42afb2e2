"""The canary analysis judge on fixed trials: the difference in differences of paired log ratios,
its Student-t interval cross-checked against scipy, and Kayenta's classification and score."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_judge import (
    Metric,
    compare,
    difference_in_differences,
    judge,
)

OUTPUT_TPS = Metric("output_tps", "higher", 0.05, "throughput")
TTFT = Metric("ttft_ms", "lower", 0.10, "latency")
SCORE = Metric("weighted_score", "higher", 0.05, "throughput", critical=True)
WEIGHTS = {"throughput": 60, "latency": 40}


def pairs(canary, baseline):
    return list(zip(canary, baseline))


def test_the_estimate_is_the_change_of_the_mean_log_ratio_and_its_interval_students_pooled_t():
    after = pairs([95.0, 97.0, 94.0], [100.0, 101.0, 99.0])
    before = pairs([98.0, 97.0, 99.0], [100.0, 100.0, 101.0])

    result = compare(OUTPUT_TPS, after, before, confidence=0.98)

    ratios_after = [math.log(c / b) for c, b in after]
    ratios_before = [math.log(c / b) for c, b in before]
    estimate = statistics.fmean(ratios_after) - statistics.fmean(ratios_before)
    assert result["shift_pct"] == pytest.approx(100 * math.expm1(estimate))
    # scipy's own pooled two-sample t test of the two phases' log ratios is the same test.
    expected = stats.ttest_ind(ratios_after, ratios_before, equal_var=True)
    assert result["p_value"] == pytest.approx(expected.pvalue)
    assert result["degrees"] == 4
    spread = math.sqrt((sum((x - statistics.fmean(ratios_after)) ** 2 for x in ratios_after)
                        + sum((x - statistics.fmean(ratios_before)) ** 2 for x in ratios_before)) / 4)
    half = stats.t.ppf(0.99, 4) * spread * math.sqrt(2 / 3)
    assert result["interval_pct"] == pytest.approx([100 * math.expm1(estimate - half), 100 * math.expm1(estimate + half)])
    assert (result["trials"], result["trials_before"]) == (3, 3)


def test_the_hosts_own_gap_measured_before_the_change_cancels():
    # The canary's host is 3 % slower by nature: alone, its trials look like a 3 % regression.
    before = pairs([97.0, 97.1, 96.9], [100.0, 100.0, 100.0])
    after = pairs([97.0, 96.9, 97.1], [100.0, 100.0, 100.0])

    with_gap = compare(Metric("output_tps", "higher", 0.02, "throughput"), after)
    without_gap = compare(Metric("output_tps", "higher", 0.02, "throughput"), after, before)

    assert with_gap["classification"] == "Low" and with_gap["shift_pct"] == pytest.approx(-3.0, abs=0.01)
    assert without_gap["classification"] == "Pass" and without_gap["conclusive"]
    assert abs(without_gap["shift_pct"]) < 0.1


def test_identical_trials_pass_with_no_shift():
    result = compare(OUTPUT_TPS, pairs([100.0, 101.0, 99.0], [100.0, 101.0, 99.0]))

    assert result["classification"] == "Pass" and result["conclusive"]
    assert result["shift_pct"] == 0 and result["interval_pct"] == [0, 0] and result["p_value"] == 1.0


def test_a_shift_both_large_and_significant_is_harm():
    slower = compare(OUTPUT_TPS, pairs([90.0, 91.0, 89.5], [100.0, 100.5, 99.0]))

    assert slower["classification"] == "Low" and slower["conclusive"]
    assert slower["interval_pct"][1] < 0 and slower["shift_pct"] < -5


def test_a_large_shift_within_the_noise_is_not_conclusive_and_a_small_one_passes():
    # -8 % on average, but one trial in three says +2 %: more trials would tell.
    noisy = compare(OUTPUT_TPS, pairs([88.0, 102.0, 86.0], [100.0, 100.0, 100.0]))
    # -2 % whatever the noise: within the 5 % margin, a Pass.
    small = compare(OUTPUT_TPS, pairs([90.0, 106.0, 98.0], [100.0, 100.0, 100.0]))

    assert noisy["classification"] == "Pass" and not noisy["conclusive"] and noisy["interval_pct"][1] > 0
    assert small["classification"] == "Pass" and small["conclusive"]


def test_only_the_harmful_direction_fails():
    faster = compare(OUTPUT_TPS, pairs([110.0, 111.0, 109.0], [100.0, 100.0, 100.0]))
    slower_first_token = compare(TTFT, pairs([140.0, 141.0, 139.0], [100.0, 100.0, 100.0]))
    sooner_first_token = compare(TTFT, pairs([60.0, 61.0, 59.0], [100.0, 100.0, 100.0]))

    assert faster["classification"] == "Pass" and faster["shift_pct"] > 8
    assert slower_first_token["classification"] == "High" and slower_first_token["interval_pct"][0] > 0
    assert sooner_first_token["classification"] == "Pass"


def test_a_trial_without_both_figures_is_left_out_and_none_left_is_nodata():
    result = compare(TTFT, [(None, 120.0), (130.0, None)])

    assert result["classification"] == "NoData" and not result["conclusive"]
    assert result["canary"] == {"count": 0} and result["trials"] == 0


def test_fewer_than_two_degrees_of_freedom_decide_nothing():
    one = compare(SCORE, pairs([7000.0], [8400.0]))
    two = compare(SCORE, pairs([7000.0, 7100.0], [8400.0, 8300.0]))

    for result in (one, two):
        assert result["interval_pct"] is None and (result["classification"], result["conclusive"]) == ("Pass", False)
    # Two trials after and two before: two degrees, enough.
    assert compare(SCORE, pairs([7000.0, 7100.0], [8400.0, 8300.0]),
                   pairs([8400.0, 8300.0], [8400.0, 8310.0]))["classification"] == "Low"
    analysis = judge([SCORE], {"weighted_score": one_pair()}, weights=WEIGHTS)
    assert analysis["verdict"] == "inconclusive"
    assert analysis["reasons"] == ["weighted_score -16.7 %: too few trials to tell (1 trial)"]


def one_pair():
    return [(7000.0, 8400.0)]


def test_an_exact_metric_compares_the_medians_as_they_are():
    quality = Metric("quality", "higher", 0.04, "correctness", critical=True, exact=True)

    lower = compare(quality, [(0.90, 1.0)])
    within = compare(quality, [(0.97, 1.0)])
    zero = compare(Metric("errors", "lower", 0.0, "errors", exact=True), [(1.0, 0.0)])

    assert (lower["classification"], lower["conclusive"], lower["shift_pct"]) == ("Low", True, pytest.approx(-10.0))
    assert within["classification"] == "Pass"
    assert zero["classification"] == "High" and math.isinf(zero["shift_pct"])


def test_a_canary_ten_percent_slower_fails_naming_the_metric_its_shift_and_interval():
    analysis = judge([OUTPUT_TPS, TTFT],
                     {"output_tps": pairs([90.0, 91.0, 89.0], [100.0, 100.0, 100.0]),
                      "ttft_ms": pairs([100.0, 101.0, 99.0], [100.0, 100.0, 100.0])},
                     weights=WEIGHTS)

    assert analysis["score"] == pytest.approx(40.0)  # throughput's group fails, latency's passes
    assert analysis["verdict"] == "fail"
    (reason,) = analysis["reasons"]
    assert reason.startswith("output_tps -10.0 % [") and reason.endswith("] < -5 %")


def test_a_critical_metric_that_regresses_makes_the_score_zero():
    analysis = judge([OUTPUT_TPS, SCORE],
                     {"output_tps": pairs([100.0] * 3, [100.0] * 3),
                      "weighted_score": pairs([7900.0, 7910.0, 7890.0], [8400.0] * 3)},
                     weights=WEIGHTS)

    assert analysis["score"] == 0 and analysis["verdict"] == "fail"
    assert analysis["reasons"][0].startswith("weighted_score -6.0 % [")


def test_noise_that_hides_a_large_shift_is_inconclusive_with_the_trials_counted():
    analysis = judge([OUTPUT_TPS], {"output_tps": pairs([88.0, 102.0, 86.0], [100.0] * 3)},
                     before={"output_tps": pairs([100.0, 99.0], [100.0, 100.0])}, weights=WEIGHTS)

    assert analysis["verdict"] == "inconclusive" and analysis["score"] == 100
    (reason,) = analysis["reasons"]
    assert "past -5 % but within the noise (3 trials, 2 before the change)" in reason


def test_a_critical_metric_without_data_is_inconclusive_and_no_data_at_all_has_no_score():
    missing = judge([OUTPUT_TPS, SCORE], {"output_tps": pairs([100.0] * 3, [100.0] * 3)}, weights=WEIGHTS)
    nothing = judge([OUTPUT_TPS], {}, weights=WEIGHTS)

    assert (missing["verdict"], missing["score"]) == ("inconclusive", 100)
    assert (nothing["verdict"], nothing["score"]) == ("inconclusive", None)


def test_the_score_weighs_each_groups_share_of_passes_and_kayentas_thresholds_make_one_harm_marginal():
    latencies = [Metric(name, "lower", 0.10, "latency") for name in ("ttft_ms", "tpot_ms", "e2e_ms")]
    same = pairs([100.0, 101.0, 99.0], [100.0, 101.0, 99.0])
    trials = {"output_tps": same, "ttft_ms": pairs([150.0, 151.0, 149.0], [100.0] * 3), "tpot_ms": same,
              "e2e_ms": same}

    analysis = judge([OUTPUT_TPS, *latencies], trials, weights={"throughput": 2, "latency": 1})
    lenient = judge([OUTPUT_TPS, *latencies], trials, weights={"throughput": 2, "latency": 1},
                    pass_score=75, marginal_score=50)

    assert analysis["score"] == pytest.approx(100 * (2 * 1 + 1 * 2 / 3) / 3)
    assert (analysis["verdict"], lenient["verdict"]) == ("marginal", "pass")
    (reason,) = analysis["reasons"]
    assert reason.startswith("ttft_ms +50.0 % [+4") and reason.endswith("] > +10 %")


@pytest.mark.parametrize("scores", [(90, 80), (-1, 50), (50, 101)])
def test_thresholds_out_of_order_are_refused(scores):
    marginal, passing = scores
    with pytest.raises(ValueError, match="thresholds"):
        judge([OUTPUT_TPS], {}, weights=WEIGHTS, pass_score=passing, marginal_score=marginal)


def test_a_metric_without_a_group_weight_or_with_a_bad_margin_is_refused():
    with pytest.raises(ValueError, match=r"no weight for the metric group\(s\) quality"):
        judge([Metric("score", "higher", 0.04, "quality")], {}, weights=WEIGHTS)
    with pytest.raises(ValueError, match="margin"):
        Metric("output_tps", "higher", 2, "throughput")
    with pytest.raises(ValueError, match="better"):
        Metric("output_tps", "up", 0.02, "throughput")


def test_without_trials_before_the_estimate_is_the_mean_log_ratio_after():
    found = difference_in_differences([0.01, -0.01, 0.03], [], 0.98)

    assert found["estimate"] == pytest.approx(0.01) and found["degrees"] == 2
    low, high = found["interval"]
    assert low == pytest.approx(0.01 - stats.t.ppf(0.99, 2) * 0.02 / math.sqrt(3))
    assert high == pytest.approx(0.01 + stats.t.ppf(0.99, 2) * 0.02 / math.sqrt(3))
