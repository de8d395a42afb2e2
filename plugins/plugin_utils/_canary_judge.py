# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The canary analysis judge: a canary's trials against its baseline's, metric by metric, scored
as Kayenta's NetflixACAJudge scores them. Controller side only.

The unit is the trial. A trial benches the canary and its baseline at once with the same seeded
requests, so its two figures are a pair, and what a trial says about the release is their ratio:
the requests of one trial are not independent draws (every trial replays the same prompts, and
they share the trial's load), so they are never pooled as if they were.

Per metric, from the pairs of the trials after the change and, when the two hosts were benched
together before the canary changed (an A/A pair, both on the same release), the pairs of those:

- the difference in differences: the mean log ratio canary / baseline after the change, less the
  mean log ratio before it. The hosts' own gap (one is slower by nature, or busier) is in both
  and cancels; what is left is the release's effect. Without the pairs before, the mean log
  ratio after is the estimate, and the hosts' gap is taken for the release's;
- its Student-t confidence interval (default 98 %), from the pooled spread of the log ratios of
  both phases (the noise of a pair does not depend on the release it runs), with
  (trials after - 1) + (trials before - 1) degrees of freedom;
- both in percent, exp(estimate) - 1;
- a classification as Kayenta's judge makes it, an effect both large and significant: `Low` when
  the estimate lies below -margin and the whole interval below 0, for a metric whose higher
  values are better; `High` likewise above +margin and 0 for one whose lower values are better;
  `NoData` when no trial has both figures; else `Pass`. A change in the harmless direction is a
  Pass. A Pass whose estimate lies past the margin (large but not yet significant) is not
  conclusive: more trials tell. With a single degree of freedom or none, an interval decides
  nothing, and the metric is a Pass that is not conclusive.
- A metric marked exact (a figure that does not vary between measurements, such as a quality
  score on a fixed set) is compared as it is: the canary's median against the baseline's.

The score is Kayenta's weighted sum: each group's share of Pass among its metrics with data,
weighted by the group's weight, out of 100; a critical metric classified High or Low makes it
0. The verdict: `fail` below the marginal threshold, `marginal` below the pass threshold, else
`pass`; `inconclusive` instead of `pass` or `marginal` when a metric with data is not
conclusive, a critical metric has no data, or no metric has any.

How often these verdicts are wrong, for the noise and the host gaps a fleet has, is measured by
tests/shared/verdict_errors.py (docs/benchmarks.md has its table).
"""

from __future__ import annotations

import functools
import importlib
import math
import statistics
from dataclasses import dataclass

# scipy.special, imported when a judgement needs it: the ledger callback and the filters that share
# this module's package load on every run, and scipy takes a while to import.
special = None

CLASSES = ("Pass", "High", "Low", "NoData")
# Below this many degrees of freedom an interval decides nothing: t's quantiles for one are some
# 30 times the spread at 98 %.
LEAST_DEGREES = 2
VERDICTS = ("pass", "marginal", "fail", "inconclusive")


@dataclass(frozen=True)
class Metric:
    """One metric the judge compares: which way is better, how much worse is allowed."""

    name: str
    better: str  # "higher" or "lower"
    margin: float  # the harm allowed, as a fraction of the baseline's (0.05 = 5 %; 1.0 = twice as long)
    group: str
    critical: bool = False
    # A figure that does not vary between measurements of one engine (a quality score on a fixed
    # set, the share of probes that passed): compared as it is, one value a side enough.
    exact: bool = False

    def __post_init__(self):
        if self.better not in ("higher", "lower"):
            raise ValueError(f"metric {self.name}: better must be higher or lower, not {self.better!r}")
        # A figure that should not drop can drop by less than all of it; one that should not rise
        # may be allowed to double (a latency limit of 2x the baseline's is a margin of 1).
        if not (0 <= self.margin < 1 if self.better == "higher" else 0 <= self.margin < math.inf):
            raise ValueError(f"metric {self.name}: margin must be a fraction"
                             f"{' in [0, 1)' if self.better == 'higher' else ' of at least 0'}, not {self.margin!r}")


def require_scipy() -> None:
    """Import scipy.special once; a controller without it (requirements.txt) is told so."""
    global special  # pylint: disable=global-statement
    if special is not None:
        return
    try:
        special = importlib.import_module("scipy.special")
    except ImportError as error:
        raise RuntimeError(f"the canary analysis needs scipy on the controller (requirements.txt): {error}") from None


@functools.lru_cache(maxsize=None)
def t_quantile(confidence: float, degrees: int) -> float:
    """The two-sided Student-t quantile for `confidence` with `degrees` degrees of freedom."""
    require_scipy()
    return float(special.stdtrit(degrees, 0.5 + confidence / 2.0))


def log_ratios(pairs) -> list[float]:
    """ln(canary / baseline) of each pair whose figures are both positive numbers."""
    return [math.log(canary / baseline) for canary, baseline in pairs
            if _positive(canary) and _positive(baseline)]


def difference_in_differences(after, before, confidence: float) -> dict:
    """The estimate of the release's effect (mean log ratio after, less before), its interval at
    `confidence`, its p-value and degrees of freedom. The interval is None below LEAST_DEGREES."""
    after, before = list(after), list(before)
    mean_after = statistics.fmean(after)
    mean_before = statistics.fmean(before) if before else 0.0
    estimate = mean_after - mean_before
    degrees = len(after) - 1 + (len(before) - 1 if before else 0)
    if degrees < LEAST_DEGREES:
        return {"estimate": estimate, "interval": None, "p_value": None, "degrees": degrees}
    squares = sum((value - mean_after) ** 2 for value in after) + sum((value - mean_before) ** 2 for value in before)
    error = math.sqrt(squares / degrees) * math.sqrt(1.0 / len(after) + (1.0 / len(before) if before else 0.0))
    if error == 0.0:
        return {"estimate": estimate, "interval": (estimate, estimate), "p_value": 1.0 if estimate == 0 else 0.0,
                "degrees": degrees}
    half = t_quantile(confidence, degrees) * error
    return {"estimate": estimate, "interval": (estimate - half, estimate + half),
            "p_value": float(2.0 * special.stdtr(degrees, -abs(estimate) / error)), "degrees": degrees}


def percent(log_ratio: float) -> float:
    """A log ratio as a change in percent."""
    return 100.0 * math.expm1(log_ratio)


def relative(value: float, reference: float) -> float:
    """value as a percentage of the reference; a nonzero change of a zero reference is infinite."""
    if reference == 0:
        return 0.0 if value == 0 else math.copysign(math.inf, value)
    return 100.0 * value / abs(reference)


def compare(metric: Metric, pairs, before=(), confidence: float = 0.98) -> dict:
    """One metric's comparison. `pairs` are (canary, baseline) figures, one pair per trial after
    the change (per instance, for an exact metric); `before`, the pairs of the A/A trials."""
    pairs = [(canary, baseline) for canary, baseline in pairs if _number(canary) and _number(baseline)]
    before = [(canary, baseline) for canary, baseline in before if _number(canary) and _number(baseline)]
    result = {
        "name": metric.name,
        "group": metric.group,
        "better": metric.better,
        "margin_pct": 100.0 * metric.margin,
        "critical": metric.critical,
        "canary": summary([canary for canary, _baseline in pairs]),
        "baseline": summary([baseline for _canary, baseline in pairs]),
        "trials": len(pairs),
        "trials_before": len(before),
    }
    harm = -100.0 * metric.margin if metric.better == "higher" else 100.0 * metric.margin
    if metric.exact:
        if not pairs:
            return dict(result, classification="NoData", conclusive=False)
        reference = statistics.median(baseline for _canary, baseline in pairs)
        shift = relative(statistics.median(canary for canary, _baseline in pairs) - reference, reference)
        worse = shift < harm if metric.better == "higher" else shift > harm
        return dict(result, shift_pct=shift, interval_pct=[shift, shift], confidence=1.0, p_value=None,
                    classification=("Low" if metric.better == "higher" else "High") if worse else "Pass",
                    conclusive=True)
    after, earlier = log_ratios(pairs), log_ratios(before)
    if not after:
        return dict(result, classification="NoData", conclusive=False)
    found = difference_in_differences(after, earlier, confidence)
    shift = percent(found["estimate"])
    interval = [percent(end) for end in found["interval"]] if found["interval"] else None
    beyond = shift < harm if metric.better == "higher" else shift > harm
    if interval is None:
        significant = False
    else:
        significant = interval[1] < 0 if metric.better == "higher" else interval[0] > 0
    harmed = beyond and significant
    classification = ("Low" if metric.better == "higher" else "High") if harmed else "Pass"
    return dict(result, shift_pct=shift, interval_pct=interval, confidence=confidence, p_value=found["p_value"],
                degrees=found["degrees"], classification=classification,
                conclusive=harmed or (interval is not None and not beyond))


def summary(values) -> dict:
    """What the record keeps of one side's figures: their count and quartiles."""
    values = sorted(float(value) for value in values)
    if not values:
        return {"count": 0}
    low, median, high = _quartiles(values)
    return {"count": len(values), "min": values[0], "p25": low, "median": median, "p75": high, "max": values[-1],
            "mean": statistics.fmean(values)}


def judge(metrics, pairs: dict, *, before: dict | None = None, weights: dict, pass_score: float = 95,
          marginal_score: float = 75, confidence: float = 0.98) -> dict:
    """The analysis of the canary against its baseline: `pairs` and `before` are
    {metric name: [(canary, baseline)]}, the trials after the change and the A/A trials."""
    if not 0 <= marginal_score <= pass_score <= 100:
        raise ValueError(f"thresholds: need 0 <= marginal ({marginal_score}) <= pass ({pass_score}) <= 100")
    unknown = sorted({metric.group for metric in metrics} - set(weights))
    if unknown:
        raise ValueError(f"no weight for the metric group(s) {', '.join(unknown)}")
    before = before or {}
    results = [compare(metric, pairs.get(metric.name, ()), before.get(metric.name, ()), confidence)
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
    """`output_tps -6.8 % [-8.1, -5.2] < -5 %`: the metric, its shift, interval and the bound."""
    bound = f"< -{result['margin_pct']:g} %" if result["better"] == "higher" else f"> +{result['margin_pct']:g} %"
    return f"{shown(result)} {bound}"


def shown(result: dict) -> str:
    """`score -6.8 % [-8.1, -5.2]`: the metric, its shift and interval (an exact one's shift alone)."""
    interval = result.get("interval_pct")
    if not interval or interval[0] == interval[1] == result["shift_pct"]:
        return f"{result['name']} {result['shift_pct']:+.1f} %"
    return f"{result['name']} {result['shift_pct']:+.1f} % [{interval[0]:+.1f}, {interval[1]:+.1f}]"


def unsure(result: dict) -> str:
    """Why a Pass is not conclusive: too few trials, or a shift past the margin within the noise."""
    side = f"-{result['margin_pct']:g}" if result["better"] == "higher" else f"+{result['margin_pct']:g}"
    counts = (f"({result['trials']} trial{'s' if result['trials'] != 1 else ''}"
              + (f", {result['trials_before']} before the change" if result["trials_before"] else "") + ")")
    if result.get("interval_pct") is None:
        return f"{result['name']} {result['shift_pct']:+.1f} %: too few trials to tell {counts}"
    return f"{shown(result)}: past {side} % but within the noise {counts}"


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    """The 25th, 50th and 75th percentiles, interpolated linearly (numpy's default)."""
    def at(fraction):
        position = fraction * (len(values) - 1)
        low = math.floor(position)
        high = min(low + 1, len(values) - 1)
        return values[low] + (values[high] - values[low]) * (position - low)
    return at(0.25), at(0.5), at(0.75)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value) -> bool:
    return _number(value) and value > 0
