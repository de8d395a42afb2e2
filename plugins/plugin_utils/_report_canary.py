# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's canary analyses. Controller side only.

analyses(lines) is every canary analysis the ledger recorded (`canary` on the canary host's
line, canary_record() of _canary_analysis.py); canary_figure(analysis) draws, per metric, the
baseline's and the canary's recorded quartiles as box plots side by side. The record keeps
quartiles, not samples, so a box is drawn from them (matplotlib's bxp) and its whiskers span
the minimum to the maximum. A simulated analysis' boxes are hollow, and its verdict is marked
"(sim)".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import marked, number
from ansible_collections.biv100.serving.plugins.plugin_utils._report_figures import DPI, SIMULATED_NOTE, drawing, matplotlib_classes, plot_name
from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import measured_release


CANARY_PLOT_PREFIX = "canary-"
# What a canary plot's y axis measures, by the analysis' metric name; a metric not named here is
# drawn without a unit. (request_output_tps is an older record's: the judge pooled requests then.)
CANARY_UNITS = {
    "score": "weighted score",
    "output_tps": "output tok/s (per trial)",
    "request_output_tps": "output tok/s (per request)",
    "ttft_ms": "milliseconds (a trial's median)",
    "tpot_ms": "milliseconds (a trial's median)",
    "e2e_ms": "milliseconds (a trial's median)",
    "quality": "quality score",
    "probes": "share of probes passed",
}
SIDE_COLOURS = {"baseline": "tab:blue", "canary": "tab:orange"}
# A box measured on a BI-V100 engine is filled with its side's lighter shade; a simulated one is
# hollow, as the other plots' points are.
SIDE_FILLS = {"baseline": "#aec7e8", "canary": "#ffbb78"}
CLASSIFICATION_COLOURS = {"Pass": "#1a7f37", "High": "#c62828", "Low": "#c62828", "NoData": "#777777"}
INCONCLUSIVE_COLOUR = "#b26a00"
CANARY_PANELS_PER_ROW = 4
QUARTILES = ("min", "p25", "median", "p75", "max")


@dataclass(frozen=True)
class Analysis:
    """One canary analysis the ledger recorded: the release it judged, on which host, the record
    (canary_record() of plugin_utils/_canary_analysis.py), and the file of its plot."""

    release: str
    host: str
    time: str | None
    record: dict
    plot: str

    @property
    def simulated(self) -> bool:
        return bool(self.record.get("simulated"))

    @property
    def baseline(self) -> dict:
        return self.record["baseline"] if isinstance(self.record.get("baseline"), dict) else {}

    @property
    def metrics(self) -> list[dict]:
        return [metric for metric in self.record.get("metrics") or ()
                if isinstance(metric, dict) and metric.get("name")]


def analyses(lines: list[dict]) -> list[Analysis]:
    """Every canary analysis of the ledger, in the ledger's order, each drawn once.

    The analysis is the canary host's: on a host of several engine instances each line
    (<host>/<instance>) carries the same one, which counts once per run. The analysis of a later
    run of the same release (one that accepts a marginal verdict, say) is another, with a plot of
    its own."""
    found, seen, names = [], set(), set()
    for line in lines:
        record = line.get("canary")
        release, host = measured_release(line), line.get("host")
        if not isinstance(record, dict) or not record.get("verdict") or release is None or not host:
            continue
        host = str(host).partition("/")[0]
        key = (line.get("time"), release, host, json.dumps(record, sort_keys=True, default=str))
        if key in seen:
            continue
        seen.add(key)
        time = str(line["time"]) if line.get("time") else None
        found.append(Analysis(release, host, time, record, _canary_plot_name(release, names)))
    return found


def _canary_plot_name(release: str, taken: set) -> str:
    """canary-<release>.png, the release reduced to characters safe in a file name; a second
    analysis of the same release gets -2, and so on. The ledger only grows, so a name once given
    stays its analysis'."""
    return plot_name(CANARY_PLOT_PREFIX, release, "release", taken)


def box_stats(side) -> dict | None:
    """A side's recorded quartiles as matplotlib's bxp() takes them: whiskers from the minimum to
    the maximum (no sample is drawn as an outlier, since the record keeps no samples); None when
    the side has no sample or its record is incomplete."""
    if not isinstance(side, dict) or not side.get("count"):
        return None
    values = [number(side.get(key)) for key in QUARTILES]
    if any(value is None for value in values):
        return None
    low, q1, median, q3, high = values
    stats = {"whislo": low, "q1": q1, "med": median, "q3": q3, "whishi": high, "fliers": []}
    if number(side.get("mean")) is not None:
        stats["mean"] = number(side["mean"])
    return stats


def _signed(value) -> str:
    return f"{value:+.1f}" if number(value) is not None else "?"


def metric_title(metric: dict) -> str:
    """`score Low -9.2 % [-9.5, -9.0]`, then the interval's confidence, the direction, the margin,
    and whether the metric is critical or its Pass not conclusive."""
    name, classification = str(metric.get("name")), str(metric.get("classification") or "NoData")
    interval = metric.get("interval_pct")
    if classification == "NoData" or number(metric.get("shift_pct")) is None:
        head = f"{name} {classification}"
    else:
        low, high = interval if isinstance(interval, (list, tuple)) and len(interval) == 2 else (None, None)
        head = f"{name} {classification} {_signed(metric['shift_pct'])} % [{_signed(low)}, {_signed(high)}]"
    details = []
    confidence = number(metric.get("confidence"))
    if confidence is not None and classification != "NoData":
        # No interval: too few trials. (A record older than the trial-level judge kept the
        # confidence its samples reached instead, below a half when they were too few.)
        too_few = not isinstance(interval, (list, tuple)) or confidence < 0.5
        details.append("too few trials for an interval" if too_few else f"{100 * confidence:.0f} % interval")
    if metric.get("better") in ("higher", "lower"):
        margin = number(metric.get("margin_pct"))
        details.append(f"{metric['better']} is better" + (f", margin {margin:g} %" if margin is not None else ""))
    if metric.get("critical"):
        details.append("critical")
    if classification == "Pass" and metric.get("conclusive") is False:
        details.append("not conclusive")
    return head + ("\n" + "; ".join(details) if details else "")


def _title_colour(metric: dict) -> str:
    classification = metric.get("classification")
    if classification == "Pass" and metric.get("conclusive") is False:
        return INCONCLUSIVE_COLOUR
    return CLASSIFICATION_COLOURS.get(classification, CLASSIFICATION_COLOURS["NoData"])


def _allowed(metric: dict, baseline: dict | None) -> float | None:
    """The level the margin allows the canary to reach: the baseline's median less (or, for a
    metric whose lower values are better, plus) the margin, a share of that median's size, as
    the judge holds the shift's interval to it."""
    margin = number(metric.get("margin_pct"))
    if baseline is None or margin is None or metric.get("better") not in ("higher", "lower"):
        return None
    sign = -1 if metric["better"] == "higher" else 1
    return baseline["med"] + sign * abs(baseline["med"]) * margin / 100


def verdict_text(record: dict) -> str:
    """`fail, score 0` or `marginal (accepted), score 60`."""
    score = number(record.get("score"))
    return (f"{record.get('verdict')}{' (accepted)' if record.get('accepted') else ''}, "
            + (f"score {score:.0f}" if score is not None else "no score"))


def baseline_text(analysis: Analysis) -> str:
    """What the canary was measured against, naming the kind of baseline."""
    baseline = analysis.baseline
    release = baseline.get("release") or "vendor files"
    if baseline.get("kind") == "historical":
        return (f"baseline: {analysis.host}'s own figures recorded with {release} "
                "(historical: not measured in the same window)")
    return f"baseline: {baseline.get('host') or '?'} on {release} ({baseline.get('kind') or 'kind not recorded'})"


def canary_figure(analysis: Analysis):
    """One analysis: per metric a panel of two box plots drawn from the recorded quartiles, the
    baseline's beside the canary's, titled with the metric's classification, shift and interval,
    with the level its margin allows; the verdict, score and baseline in the figure's title."""
    _matplotlib_module, Figure, FigureCanvasAgg, Line2D, Patch = matplotlib_classes()
    with drawing():
        return _canary_figure(Figure, FigureCanvasAgg, Line2D, Patch, analysis)


def _canary_figure(Figure, FigureCanvasAgg, Line2D, Patch, analysis: Analysis):
    metrics = analysis.metrics
    columns = min(CANARY_PANELS_PER_ROW, max(len(metrics), 1))
    rows_needed = max(1, -(-len(metrics) // columns))
    figure = Figure(figsize=(3.4 * columns + 0.6, 3.3 * rows_needed + 1.4), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    record = analysis.record
    trials = record.get("trials")
    thresholds = record.get("thresholds") if isinstance(record.get("thresholds"), dict) else {}
    title = f"Canary analysis of {analysis.release} on {analysis.host}: {verdict_text(record)}"
    if number(thresholds.get("pass")) is not None and number(thresholds.get("marginal")) is not None:
        title += f" (pass ≥ {number(thresholds['pass']):g}, marginal ≥ {number(thresholds['marginal']):g})"
    title += f"\n{baseline_text(analysis)}"
    if trials is not None:
        title += f"; {trials} trial{'' if trials == 1 else 's'}"
    if analysis.simulated:
        title += f"\nhollow boxes: {SIMULATED_NOTE}"
    figure.suptitle(title, fontsize="medium")
    if not metrics:
        axes = figure.add_subplot()
        axes.set_axis_off()
        axes.text(0.5, 0.5, "the analysis recorded no metric", ha="center", va="center", transform=axes.transAxes)
        return figure
    for index, metric in enumerate(metrics, start=1):
        _canary_panel(figure.add_subplot(rows_needed, columns, index), metric, analysis.simulated)
    handles = [Patch(facecolor=_fill(side, analysis.simulated), edgecolor=SIDE_COLOURS[side], label=side)
               for side in SIDE_COLOURS]
    handles.append(Line2D([], [], marker="D", linestyle="none", markeredgecolor="black", markerfacecolor="white",
                          label="mean"))
    handles.append(Line2D([], [], color="tab:red", linestyle="--", linewidth=1,
                          label="the margin from the baseline's median: as far as the canary may move the harmful way"))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small", frameon=False,
                  title="boxes from the recorded quartiles: p25 to p75, median line, whiskers min to max",
                  title_fontsize="small")
    return figure


def _canary_panel(axes, metric: dict, simulated: bool) -> None:
    axes.set_title(metric_title(metric), fontsize="small", color=_title_colour(metric))
    name = str(metric["name"])
    sides = {side: box_stats(metric.get(side)) for side in SIDE_COLOURS}
    counts = {side: metric[side].get("count", 0) if isinstance(metric.get(side), dict) else 0 for side in SIDE_COLOURS}
    axes.set_xticks(range(len(SIDE_COLOURS)))
    axes.set_xticklabels([f"{side}\nn={counts[side]}" for side in SIDE_COLOURS])
    axes.set_xlim(-0.6, len(SIDE_COLOURS) - 0.4)
    axes.set_ylabel(CANARY_UNITS.get(name, ""), fontsize="small")
    drawn = [(position, side, stats) for position, (side, stats) in enumerate(sides.items()) if stats]
    for position, side, stats in drawn:
        colour = SIDE_COLOURS[side]
        artists = axes.bxp([stats], positions=[position], widths=0.5, patch_artist=True, showmeans="mean" in stats,
                           manage_ticks=False,
                           boxprops={"facecolor": _fill(side, simulated), "edgecolor": colour, "linewidth": 1.2},
                           medianprops={"color": colour, "linewidth": 2},
                           whiskerprops={"color": colour}, capprops={"color": colour},
                           meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black",
                                      "markersize": 5})
        for part in ("boxes", "medians", "whiskers", "means"):
            for artist in artists[part]:
                artist.set_gid(f"canary:{name}:{side}:{part}")
    for position, side in enumerate(SIDE_COLOURS):
        if not sides[side]:
            axes.text(position, 0.5, "no quartiles recorded" if counts[side] else "no samples", ha="center",
                      va="center", color="#777777", transform=axes.get_xaxis_transform())
    allowed = _allowed(metric, sides["baseline"])
    if allowed is not None and sides["canary"] is not None:
        axes.axhline(allowed, color="tab:red", linestyle="--", linewidth=1, gid=f"canary:{name}:allowed")
    if not drawn:
        axes.set_yticks([])


def _fill(side: str, simulated: bool) -> str:
    return "none" if simulated else SIDE_FILLS[side]


def canary_cells(analysis: Analysis) -> dict:
    """What the page's table of analyses shows of one: release, canary host, the baseline's host,
    kind and release, verdict (marked (sim) when simulated), score, trials, reasons."""
    record, baseline = analysis.record, analysis.baseline
    score = number(record.get("score"))
    verdict = str(record.get("verdict"))
    return {
        "cells": (analysis.release, analysis.host,
                  baseline.get("host") or f"{analysis.host} (own record)",
                  baseline.get("kind") or "", baseline.get("release") or "vendor files"),
        "verdict": marked(verdict + (" (accepted)" if record.get("accepted") else ""), analysis.simulated),
        "verdict_class": {"pass": "passed", "fail": "failed"}.get(verdict, "doubtful"),
        "score": f"{score:.0f}" if score is not None else "",
        "trials": "" if record.get("trials") is None else str(record["trials"]),
        "reasons": [str(reason) for reason in record.get("reasons") or ()],
        "plot": analysis.plot,
        "title": f"{analysis.release} on {analysis.host}" + (f", {analysis.time}" if analysis.time else ""),
        "outcome": verdict_text(record),
    }
