# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The canary analysis judge: a canary's samples against a baseline's, metric by metric, as
Kayenta's NetflixACAJudge judges them. Controller side only.

Per metric, from the two samples (per-request figures, or one figure per trial):

- a Mann-Whitney U test (scipy.stats.mannwhitneyu, two-sided) of whether they differ;
- the Hodges-Lehmann estimate of the shift, canary minus baseline (the median of every pairwise
  difference), and its distribution-free confidence interval (default 98 %): the order
  statistics of the pairwise differences that the U statistic's normal approximation, with its
  correction for ties, puts at the interval's ends (Hollander & Wolfe);
- both relative to the baseline's median, in percent;
- a classification: `Low` when the whole interval lies below -margin for a metric whose higher
  values are better, `High` when it lies above +margin for one whose lower values are better,
  `NoData` when a side has no sample, else `Pass`. A change in the harmless direction is a
  Pass. A Pass whose interval reaches past the margin on the harmful side is not conclusive:
  more samples would tell. Samples too few for the confidence asked give the range of every
  difference, at the confidence the exact test reaches with them (90 % for three against three);
  below 50 % (one against one, one against three) an interval decides nothing, and the metric is
  a Pass that is not conclusive. A metric marked exact (a figure that does not vary between
  measurements, such as a quality score on a fixed set) is compared as it is.

The score is Kayenta's weighted sum: each group's share of Pass among its metrics with data,
weighted by the group's weight, out of 100; a critical metric classified High or Low makes it
0. The verdict: `fail` below the marginal threshold, `marginal` below the pass threshold, else
`pass`; `inconclusive` instead of `pass` or `marginal` when a metric with data is not
conclusive, a critical metric has no data, or no metric has any.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

# numpy and scipy.stats, imported when a judgement needs them: the ledger callback and the filters
# that share this module's package load on every run, and scipy.stats takes a second to import.
numpy = stats = None

CLASSES = ("Pass", "High", "Low", "NoData")
# Below this confidence an interval decides nothing: one sample a side, or one against three.
LEAST_CONFIDENCE = 0.5
VERDICTS = ("pass", "marginal", "fail", "inconclusive")


@dataclass(frozen=True)
class Metric:
    """One metric the judge compares: which way is better, how much worse is allowed."""

    name: str
    better: str  # "higher" or "lower"
    margin: float  # the harm allowed, as a fraction of the baseline's median (0.02 = 2 %)
    group: str
    critical: bool = False
    # A figure that does not vary between measurements of one engine (a quality score on a fixed
    # set, the share of probes that passed): compared as it is, one value a side enough.
    exact: bool = False

    def __post_init__(self):
        if self.better not in ("higher", "lower"):
            raise ValueError(f"metric {self.name}: better must be higher or lower, not {self.better!r}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"metric {self.name}: margin must be a fraction in [0, 1), not {self.margin!r}")


def require_scipy() -> None:
    """Import numpy and scipy.stats once; a controller without them (requirements.txt) is told so."""
    global numpy, stats  # pylint: disable=global-statement
    if stats is not None:
        return
    try:
        numpy, stats = importlib.import_module("numpy"), importlib.import_module("scipy.stats")
    except ImportError as error:
        raise RuntimeError(f"the canary analysis needs scipy on the controller (requirements.txt): {error}") from None


def shift_interval(canary, baseline, confidence: float) -> tuple[float, float, float]:
    """(estimate, low, high) of the shift canary - baseline, Hodges-Lehmann with its
    distribution-free interval at `confidence`."""
    require_scipy()
    differences = numpy.sort(numpy.subtract.outer(canary, baseline).ravel())
    n, m, count = len(canary), len(baseline), differences.size
    pooled = numpy.concatenate([canary, baseline])
    _values, ties = numpy.unique(pooled, return_counts=True)
    total = n + m
    tie_term = float((ties ** 3 - ties).sum()) / (total * (total - 1)) if total > 1 else 0.0
    spread = math.sqrt(max(n * m / 12.0 * ((total + 1) - tie_term), 0.0))
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    # How many differences lie outside the interval at each end; none when the samples are too
    # few for the confidence asked: the interval is then every difference's range.
    outside = max(int(math.floor(count / 2.0 - z * spread)), 0)
    outside = min(outside, (count - 1) // 2)
    return float(numpy.median(differences)), float(differences[outside]), float(differences[count - 1 - outside])


def relative(value: float, reference: float) -> float:
    """value as a percentage of the reference; a nonzero change of a zero reference is infinite."""
    if reference == 0:
        return 0.0 if value == 0 else math.copysign(math.inf, value)
    return 100.0 * value / abs(reference)


def compare(metric: Metric, canary, baseline, confidence: float = 0.98) -> dict:
    """One metric's comparison: test, shift, interval, classification."""
    require_scipy()
    canary = numpy.asarray([value for value in canary if value is not None], dtype=float)
    baseline = numpy.asarray([value for value in baseline if value is not None], dtype=float)
    result = {
        "name": metric.name,
        "group": metric.group,
        "better": metric.better,
        "margin_pct": 100.0 * metric.margin,
        "critical": metric.critical,
        "canary": summary(canary),
        "baseline": summary(baseline),
    }
    if canary.size == 0 or baseline.size == 0:
        return dict(result, classification="NoData", conclusive=False)
    if numpy.all(canary == canary[0]) and numpy.all(baseline == canary[0]):
        # Identical constant samples: no shift at all (the U test's variance is zero).
        u_statistic, p_value = canary.size * baseline.size / 2.0, 1.0
    else:
        test = stats.mannwhitneyu(canary, baseline, alternative="two-sided")
        u_statistic, p_value = float(test.statistic), float(test.pvalue)
    estimate, low, high = shift_interval(canary, baseline, confidence)
    # Too few samples for the confidence asked give every difference's range, whose confidence
    # is that of the exact test's most extreme arrangement (2 of C(n + m, n)).
    reached = confidence if metric.exact else min(
        confidence, 1.0 - 2.0 / math.comb(canary.size + baseline.size, canary.size))
    reference = float(numpy.median(baseline))
    shift = {name: relative(value, reference) for name, value in (("estimate", estimate), ("low", low), ("high", high))}
    harm_limit = -100.0 * metric.margin if metric.better == "higher" else 100.0 * metric.margin
    if metric.better == "higher":
        classification = "Low" if shift["high"] < harm_limit else "Pass"
        conclusive = classification == "Low" or shift["low"] >= harm_limit
    else:
        classification = "High" if shift["low"] > harm_limit else "Pass"
        conclusive = classification == "High" or shift["high"] <= harm_limit
    if reached < LEAST_CONFIDENCE:
        # An interval no surer than a coin says nothing either way.
        classification, conclusive = "Pass", False
    return dict(
        result,
        u=u_statistic,
        p_value=p_value,
        shift=estimate,
        interval=[low, high],
        shift_pct=shift["estimate"],
        interval_pct=[shift["low"], shift["high"]],
        confidence=reached,
        asked_confidence=confidence,
        classification=classification,
        conclusive=conclusive,
    )


def summary(sample) -> dict:
    """What the record keeps of a sample: its size and quartiles (a distribution, not a mean)."""
    if sample.size == 0:
        return {"count": 0}
    low, median, high = numpy.percentile(sample, [25, 50, 75])
    return {"count": int(sample.size), "min": float(sample.min()), "p25": float(low), "median": float(median),
            "p75": float(high), "max": float(sample.max()), "mean": float(sample.mean())}


def judge(metrics, canary: dict, baseline: dict, *, weights: dict, pass_score: float = 75,
          marginal_score: float = 50, confidence: float = 0.98) -> dict:
    """The analysis of canary against baseline ({metric name: samples} each)."""
    require_scipy()
    if not 0 <= marginal_score <= pass_score <= 100:
        raise ValueError(f"thresholds: need 0 <= marginal ({marginal_score}) <= pass ({pass_score}) <= 100")
    unknown = sorted({metric.group for metric in metrics} - set(weights))
    if unknown:
        raise ValueError(f"no weight for the metric group(s) {', '.join(unknown)}")
    results = [compare(metric, canary.get(metric.name, ()), baseline.get(metric.name, ()), confidence)
               for metric in metrics]
    harmed = [result for result in results if result["classification"] in ("High", "Low")]
    score = weighted_score(results, weights)
    critical_harm = [result for result in harmed if result["critical"]]
    if critical_harm:
        score = 0.0
    if score is not None and score < marginal_score:
        verdict = "fail"
    elif score is None or any(not result["conclusive"] for result in results if result["classification"] == "Pass") \
            or any(result["critical"] and result["classification"] == "NoData" for result in results):
        verdict = "inconclusive"
    else:
        verdict = "marginal" if score < pass_score else "pass"
    return {
        "verdict": verdict,
        "score": score,
        "thresholds": {"pass": pass_score, "marginal": marginal_score},
        "metrics": results,
        "reasons": [reason(result) for result in (critical_harm or harmed)]
        or [unsure(result) for result in results if result["classification"] == "Pass" and not result["conclusive"]],
    }


def weighted_score(results, weights: dict) -> float | None:
    """Kayenta's WeightedSumScorer: per group the share of Pass among metrics with data, weighted."""
    groups: dict[str, list[bool]] = {}
    for result in results:
        if result["classification"] != "NoData":
            groups.setdefault(result["group"], []).append(result["classification"] == "Pass")
    total = sum(weights[group] for group in groups)
    if not groups or total <= 0:
        return None
    return 100.0 * sum(weights[group] * sum(passed) / len(passed) for group, passed in groups.items()) / total


def reason(result: dict) -> str:
    """`output_tps -6.8 % [-8.1, -5.2] < -2 %`: the metric, its shift, interval and the bound."""
    low, high = result["interval_pct"]
    if result["better"] == "higher":
        bound = f"< -{result['margin_pct']:g} %"
    else:
        bound = f"> +{result['margin_pct']:g} %"
    return f"{result['name']} {result['shift_pct']:+.1f} % [{low:+.1f}, {high:+.1f}]{reached(result)} {bound}"


def reached(result: dict) -> str:
    """` (90 % interval)` when the samples were too few for the confidence asked, else nothing."""
    asked = result.get("asked_confidence", result["confidence"])
    return f" ({100 * result['confidence']:.0f} % interval)" if result["confidence"] < asked else ""


def unsure(result: dict) -> str:
    """Why a Pass is not conclusive: its interval reaches past the margin."""
    low, high = result["interval_pct"]
    side = f"-{result['margin_pct']:g}" if result["better"] == "higher" else f"+{result['margin_pct']:g}"
    counts = f"({result['canary']['count']} canary, {result['baseline']['count']} baseline)"
    shown = f"{result['name']} {result['shift_pct']:+.1f} % [{low:+.1f}, {high:+.1f}]{reached(result)}"
    if result["confidence"] < LEAST_CONFIDENCE:
        return f"{shown}: too few samples to tell {counts}"
    return f"{shown} reaches past {side} %: too few samples for the noise {counts}"
