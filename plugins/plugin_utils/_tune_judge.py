# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The tuner's final judgement: which finalist, if any, is proposed over the incumbent. Controller
side only; it reads nothing and writes nothing (the tune_search action and the error-rate
simulation, tests/shared/verdict_errors.py, both call it).

Each finalist's trials are judged against the incumbent's by the canary analysis' judge, trial n
against trial n (measured in the same block of the interleaved trials, so a pair shares its
window; the spread of their log ratios holds both sides' noise all the same). A finalist beats
the incumbent when the judge passes it and the whole interval of its score's shift lies at least
`min_gain` above the incumbent's: a gain worth a deploy. Of the finalists that beat it, the best
by median score is judged against the runner-up (at TIE_CONFIDENCE); when the judge cannot tell
them apart, the one that changes fewer settings is kept.
The latencies are not judged here: they are the objective's limit's, which the gates held.
"""

from __future__ import annotations

import math
import statistics

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import (
    SETTINGS as CANARY_SETTINGS,
    analyse,
    canary_record,
    correctness_pairs,
    paired,
)

# The confidence of the judge's intervals, as the canary analysis' (Kayenta's 98 %).
CONFIDENCE = 0.98
# The two best are told apart at a lower confidence: both beat the incumbent already (at
# CONFIDENCE), so a wrong call between them costs at most the extra changes of one that is no
# better, while a tie called on a real gap gives up the gap. With three trials a side (two
# degrees of freedom) a 98 % interval is +-11 % at 2 % noise, and the tuner's simulated search
# kept a setting 12 % below the best in 16 % of runs; at 90 %, in 1.7 % (docs/benchmarks.md).
TIE_CONFIDENCE = 0.90
DEFAULT_MIN_GAIN = 0.02


def judge_finalists(trials: dict, figures: dict, incumbent: str, changes: dict, *, incumbent_measured: bool = True,
                    incumbent_standing: str = "", min_gain: float = DEFAULT_MIN_GAIN,
                    quality_margin: float = 0.0) -> dict:
    """The judgement of the finalists. `trials` are {id: [bench figures, trial order]} (the
    incumbent's among them), `figures` {id: the candidate's recorded figures (its quality score,
    the share of probes passed)}, `changes` {id: how many settings it changes}. Without a measured
    incumbent (it missed a gate or did not start), a finalist that cleared every gate beats it.

    {judged: [{id, median_score, trials, beats, why, analysis}], winners: [entries, the proposal
    first], between: a line on how the two best were told apart, or None}."""
    judged = []
    for key, benches in trials.items():
        if key == incumbent:
            continue
        entry = {"id": key, "median_score": median_score(benches), "trials": len(benches)}
        if not incumbent_measured:
            entry.update(beats=bool(benches), why=f"the incumbent {incumbent_standing}")
        else:
            analysis = _analysis(benches, figures.get(key), trials.get(incumbent), figures.get(incumbent),
                                 quality_margin)
            entry.update(beats_by(analysis, min_gain), analysis=canary_record(analysis))
        judged.append(entry)
    winners = sorted((entry for entry in judged if entry["beats"]), key=lambda entry: (-entry["median_score"], entry["id"]))
    winners, between = _between(winners, trials, figures, changes, quality_margin)
    return {"judged": judged, "winners": winners, "between": between}


def beats_by(analysis: dict, min_gain: float) -> dict:
    """Whether a finalist beats the incumbent by a gain worth deploying: the judge passes it (nothing
    worse beyond its margin) and the whole interval of its score's shift lies at least min_gain above."""
    score = next((metric for metric in analysis["metrics"] if metric["name"] == "score"), {})
    low, high = score.get("interval_pct") or [None, None]
    if analysis["verdict"] != "pass":
        why = f"not better: judged {analysis['verdict']} ({'; '.join(analysis['reasons']) or 'score ' + str(analysis['score'])})"
        return {"beats": False, "why": why}
    shown = f"score shift {_pct(score.get('shift_pct'))} [{_pct(low)}, {_pct(high)}]"
    if not _is_number(low) or low < 100 * min_gain:
        return {"beats": False, "why": f"not better by a gain worth deploying: {shown} does not lie above "
                                       f"+{100 * min_gain:g} % (tune_min_gain)"}
    return {"beats": True, "why": f"{shown}, judged pass"}


def median_score(benches) -> float | None:
    scores = [bench["score"] for bench in benches or () if _is_number(bench.get("score"))]
    return statistics.median(scores) if scores else None


def _between(winners: list, trials: dict, figures: dict, changes: dict, quality_margin: float) -> tuple[list, str | None]:
    """The two best winners judged against each other: the better one first, or, when the judge
    cannot tell them apart, the one that changes fewer settings (the other's extra changes buy
    nothing measurable)."""
    if len(winners) < 2:
        return winners, None
    first, second = winners[:2]
    analysis = _analysis(trials[first["id"]], figures.get(first["id"]), trials[second["id"]],
                         figures.get(second["id"]), quality_margin, confidence=TIE_CONFIDENCE)
    score = next(metric for metric in analysis["metrics"] if metric["name"] == "score")
    low, high = score.get("interval_pct") or (None, None)
    shown = f"score shift {_pct(score.get('shift_pct'))} [{_pct(low)}, {_pct(high)}]"
    if _is_number(low) and low > 0:
        return winners, f"{first['id']} beats {second['id']}: {shown}"
    kept = min((first, second), key=lambda entry: (changes.get(entry["id"], 0), -entry["median_score"], entry["id"]))
    other = second if kept is first else first
    fewer = changes.get(kept["id"], 0) < changes.get(other["id"], 0)
    return ([kept, other] + winners[2:],
            f"{first['id']} and {second['id']} tie ({shown}): {kept['id']} is kept, with "
            f"{'fewer changes' if fewer else 'the higher median'}")


def _analysis(benches, figures, other_benches, other_figures, quality_margin: float,
              confidence: float = CONFIDENCE) -> dict:
    """The judge's analysis of one candidate's trials against another's."""
    settings = CANARY_SETTINGS
    return analyse(_pairs(benches, figures, other_benches, other_figures), margin=settings["margin"],
                   request_margin=settings["request_margin"], quality_margin=quality_margin,
                   pass_score=settings["thresholds"]["pass"], marginal_score=settings["thresholds"]["marginal"],
                   confidence=confidence)


def _pairs(benches, figures, other_benches, other_figures) -> dict:
    """Trial n of each side paired; each side's quality score and share of probes passed. Not the
    requests' latencies (the module docstring says why)."""
    def runs(trials):
        return [{key: value for key, value in bench.items() if key not in ("samples", "label")} for bench in trials or ()]

    def correctness(recorded):
        recorded = recorded or {}
        return {"qualities": [recorded["quality"]] if _is_number(recorded.get("quality")) else [],
                "probe_shares": [recorded["probes_passed"]] if _is_number(recorded.get("probes_passed")) else []}

    pairs = paired(runs(benches), runs(other_benches))
    pairs.update(correctness_pairs(correctness(figures), correctness(other_figures)))
    return pairs


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pct(value) -> str:
    return f"{value:+.1f} %" if _is_number(value) else "-"
