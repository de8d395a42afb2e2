"""The canary analysis judge on fixed samples, its figures cross-checked against scipy."""

from __future__ import annotations

import math
import random

import numpy
import pytest
from scipy import stats

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_judge import (
    Metric,
    compare,
    judge,
    shift_interval,
)

OUTPUT_TPS = Metric("output_tps", "higher", 0.02, "throughput")
TTFT = Metric("ttft_ms", "lower", 0.05, "latency")
SCORE = Metric("weighted_score", "higher", 0.02, "throughput", critical=True)
WEIGHTS = {"throughput": 60, "latency": 40}


def noisy(centre, spread, count, seed):
    rng = random.Random(seed)
    return [centre * (1 + rng.uniform(-spread, spread)) for _draw in range(count)]


def test_the_u_test_is_scipys_and_the_shift_the_median_of_every_pairwise_difference():
    baseline = [10.0, 12.0, 12.0, 13.0, 15.0, 15.0, 16.0]  # ties inside and across the samples
    canary = [9.0, 11.0, 12.0, 12.0, 14.0, 15.0]

    result = compare(OUTPUT_TPS, canary, baseline)

    expected = stats.mannwhitneyu(canary, baseline, alternative="two-sided")
    assert result["u"] == pytest.approx(expected.statistic)
    assert result["p_value"] == pytest.approx(expected.pvalue)
    differences = sorted(c - b for c in canary for b in baseline)
    assert result["shift"] == pytest.approx(float(numpy.median(differences)))
    assert result["shift_pct"] == pytest.approx(100 * result["shift"] / 13.0)  # the baseline's median
    low, high = result["interval"]
    assert low in differences and high in differences and low <= result["shift"] <= high


def test_the_interval_takes_the_order_statistics_of_the_normal_approximation():
    # n = m = 10, no ties: 100 differences, sigma = sqrt(100 * 21 / 12), z(0.99) = 2.3263;
    # floor(50 - 2.3263 * 13.229) = 19 differences lie outside at each end.
    baseline = [float(value) for value in range(10)]
    canary = [value + 0.5 + 0.01 * index for index, value in enumerate(range(10, 20))]
    differences = sorted(c - b for c in canary for b in baseline)

    estimate, low, high = shift_interval(numpy.array(canary), numpy.array(baseline), 0.98)

    assert (low, high) == (differences[19], differences[80])
    assert estimate == pytest.approx(float(numpy.median(differences)))
    wider = shift_interval(numpy.array(canary), numpy.array(baseline), 0.999)
    assert wider[1] < low and wider[2] > high


def test_identical_samples_pass_with_no_shift():
    sample = noisy(100, 0.01, 60, seed=1)

    result = compare(OUTPUT_TPS, sample, list(sample))

    assert result["classification"] == "Pass" and result["conclusive"]
    assert result["shift"] == 0 and result["p_value"] == pytest.approx(1.0)


def test_constant_data_is_judged_by_its_shift_alone():
    same = compare(SCORE, [8300.0] * 3, [8300.0] * 3)
    lower = compare(SCORE, [7470.0] * 3, [8300.0] * 3)

    assert (same["classification"], same["conclusive"], same["p_value"]) == ("Pass", True, 1.0)
    assert lower["classification"] == "Low"
    assert lower["shift_pct"] == pytest.approx(-10.0) and lower["interval_pct"] == pytest.approx([-10.0, -10.0])


def test_a_side_without_samples_is_nodata():
    result = compare(TTFT, [], [120.0, 130.0])

    assert result["classification"] == "NoData" and not result["conclusive"]
    assert result["canary"] == {"count": 0}


def test_only_the_harmful_direction_fails():
    faster = compare(OUTPUT_TPS, noisy(110, 0.01, 60, 2), noisy(100, 0.01, 60, 3))
    slower_first_token = compare(TTFT, noisy(140, 0.01, 60, 4), noisy(100, 0.01, 60, 5))
    sooner_first_token = compare(TTFT, noisy(60, 0.01, 60, 6), noisy(100, 0.01, 60, 7))

    assert faster["classification"] == "Pass" and faster["shift_pct"] > 8
    assert slower_first_token["classification"] == "High" and slower_first_token["interval_pct"][0] > 5
    assert sooner_first_token["classification"] == "Pass"


def test_a_canary_ten_percent_slower_fails_naming_the_metric_its_shift_and_interval():
    analysis = judge([OUTPUT_TPS, TTFT], {"output_tps": noisy(90, 0.02, 60, 8), "ttft_ms": noisy(100, 0.02, 60, 9)},
                     {"output_tps": noisy(100, 0.02, 60, 10), "ttft_ms": noisy(100, 0.02, 60, 11)},
                     weights=WEIGHTS)

    assert analysis["score"] == pytest.approx(40.0)  # throughput's group fails, latency's passes
    assert analysis["verdict"] == "fail"
    (reason,) = analysis["reasons"]
    assert reason.startswith("output_tps -1") and reason.endswith("< -2 %")
    low, high = [float(part) for part in reason.split("[", 1)[1].split("]", 1)[0].split(",")]
    assert low <= high < -2


def test_a_critical_metric_that_regresses_makes_the_score_zero():
    analysis = judge([OUTPUT_TPS, SCORE], {"output_tps": noisy(100, 0.01, 60, 12), "weighted_score": [7900.0] * 3},
                     {"output_tps": noisy(100, 0.01, 60, 13), "weighted_score": [8400.0] * 3}, weights=WEIGHTS)

    assert analysis["score"] == 0 and analysis["verdict"] == "fail"
    # Three trials a side cannot give 98 %: the range of every difference is the exact test's 90 %.
    assert analysis["reasons"] == ["weighted_score -6.0 % [-6.0, -6.0] (90 % interval) < -2 %"]


def test_a_slowdown_within_the_margin_passes():
    analysis = judge([OUTPUT_TPS], {"output_tps": noisy(99, 0.005, 80, 14)}, {"output_tps": noisy(100, 0.005, 80, 15)},
                     weights=WEIGHTS)

    assert analysis["verdict"] == "pass" and analysis["score"] == 100
    (metric,) = analysis["metrics"]
    assert -2 < metric["interval_pct"][0] and metric["interval_pct"][1] < 0


def test_noise_too_high_for_the_sample_count_is_inconclusive():
    analysis = judge([OUTPUT_TPS], {"output_tps": noisy(99, 0.3, 6, 16)}, {"output_tps": noisy(100, 0.3, 6, 17)},
                     weights=WEIGHTS)

    assert analysis["verdict"] == "inconclusive" and analysis["score"] == 100
    (reason,) = analysis["reasons"]
    assert "reaches past -2 %" in reason and "(6 canary, 6 baseline)" in reason


def test_a_critical_metric_without_data_is_inconclusive_and_no_data_at_all_has_no_score():
    missing = judge([OUTPUT_TPS, SCORE], {"output_tps": [100.0] * 5}, {"output_tps": [100.0] * 5}, weights=WEIGHTS)
    nothing = judge([OUTPUT_TPS], {}, {}, weights=WEIGHTS)

    assert (missing["verdict"], missing["score"]) == ("inconclusive", 100)
    assert (nothing["verdict"], nothing["score"]) == ("inconclusive", None)


def test_the_score_weighs_each_groups_share_of_passes():
    latencies = [Metric(name, "lower", 0.05, "latency") for name in ("ttft_ms", "tpot_ms", "e2e_ms")]
    canary = {"output_tps": [100.0] * 5, "ttft_ms": [150.0] * 5, "tpot_ms": [10.0] * 5, "e2e_ms": [900.0] * 5}
    baseline = {"output_tps": [100.0] * 5, "ttft_ms": [100.0] * 5, "tpot_ms": [10.0] * 5, "e2e_ms": [900.0] * 5}

    analysis = judge([OUTPUT_TPS, *latencies], canary, baseline, weights={"throughput": 2, "latency": 1})

    assert analysis["score"] == pytest.approx(100 * (2 * 1 + 1 * 2 / 3) / 3)
    assert analysis["verdict"] == "pass"
    assert analysis["reasons"] == ["ttft_ms +50.0 % [+50.0, +50.0] > +5 %"]


@pytest.mark.parametrize("scores", [(90, 80), (-1, 50), (50, 101)])
def test_thresholds_out_of_order_are_refused(scores):
    marginal, passing = scores
    with pytest.raises(ValueError, match="thresholds"):
        judge([OUTPUT_TPS], {}, {}, weights=WEIGHTS, pass_score=passing, marginal_score=marginal)


def test_a_metric_without_a_group_weight_or_with_a_bad_margin_is_refused():
    with pytest.raises(ValueError, match=r"no weight for the metric group\(s\) quality"):
        judge([Metric("score", "higher", 0.04, "quality")], {}, {}, weights=WEIGHTS)
    with pytest.raises(ValueError, match="margin"):
        Metric("output_tps", "higher", 2, "throughput")
    with pytest.raises(ValueError, match="better"):
        Metric("output_tps", "up", 0.02, "throughput")


def test_a_zero_baseline_makes_any_change_infinite():
    result = compare(Metric("errors", "lower", 0.0, "errors"), [1.0, 1.0], [0.0, 0.0])

    assert result["classification"] == "High" and math.isinf(result["shift_pct"])


def test_samples_too_few_for_any_confidence_decide_nothing_unless_the_figure_is_exact():
    one_each = compare(SCORE, [7000.0], [8400.0])
    assert one_each["confidence"] == 0 and (one_each["classification"], one_each["conclusive"]) == ("Pass", False)
    three_against_one = compare(SCORE, [7000.0, 7100.0, 6900.0], [8400.0])
    assert three_against_one["confidence"] == pytest.approx(0.5) and three_against_one["classification"] == "Low"
    quality = Metric("quality", "higher", 0.04, "quality", critical=True, exact=True)
    exact = compare(quality, [0.90], [1.0])
    assert exact["confidence"] == 0.98 and (exact["classification"], exact["conclusive"]) == ("Low", True)
    analysis = judge([SCORE], {"weighted_score": [7000.0]}, {"weighted_score": [8400.0]}, weights=WEIGHTS)
    assert analysis["verdict"] == "inconclusive"
    assert analysis["reasons"] == ["weighted_score -16.7 % [-16.7, -16.7] (0 % interval): too few samples to tell "
                                   "(1 canary, 1 baseline)"]
