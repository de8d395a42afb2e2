# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pictures of every release's figures, drawn from a fleet's deployment ledger. Controller side only.

The ledger holds one JSON line per host per run; a line of a run with the gates carries `bench`
(the engine_bench action's figures: weighted score, token rates, TTFT/TPOT/ITL/E2E percentiles,
the throughput gate) and `quality` (the engine_quality action's score, its baseline and
deviation, the ±bound). From them:

- rows(lines): one row per release and host, releases in the order they first appear in the
  ledger, each figure taken from the last line of that release and host that has it (a verify
  run adds lines without figures; they must not blank the deploy's);
- series(rows): what each plot shows, one point per release and host that has the figure;
- figures(series): the three matplotlib figures (weighted score with the gate line, TTFT and
  TPOT p50/p90/p99, quality deviation with the ±bound band);
- analyses(lines): every canary analysis the ledger recorded (`canary` on the canary host's
  line, canary_record() of _canary_analysis.py), and canary_figure(analysis): per metric the
  baseline's and the canary's recorded quartiles as box plots side by side. The record keeps
  quartiles, not samples, so a box is drawn from them (matplotlib's bxp) and its whiskers span
  the minimum to the maximum;
- load_tuning_runs(folder): every tuning run tune.yml wrote (<run>/candidates.jsonl, records of
  _tune_results.py, and proposal.yml), and tune_figure(run, gates): the weighted score against
  TTFT p99 of each candidate at its last round, the Pareto front of _tune_search.py, the
  throughput gate the records kept (else the ledger's), the missed gates marked and the
  candidates without figures listed with why;
- render(lines, fleet, runs): the bytes of the PNG files and of index.html
  (files/report/index.html.j2), the same bytes for the same ledger and runs, so that a re-render
  changes no file and a committed report shows no spurious diff.

A figure measured on the lab's engine stand-in (`simulated: true`) is drawn hollow and named
"simulated" in the plot's title and legend, and marked "(sim)" in the page's table and in
LEDGER.md (figure_cells, shared with the ledger callback); a simulated canary analysis' boxes are
hollow, and its verdict is marked "(sim)"; so is a simulated candidate's point and its figures in
the tuning table.

matplotlib is a controller requirement (requirements.txt), not one of ansible-core's: it is
imported only when figures are drawn, so that the ledger callback, which formats the table's
cells from here in every run, and ansible-doc load without it.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils import _json_lines as json_lines
from ansible_collections.biv100.serving.plugins.plugin_utils import _templates
from ansible_collections.biv100.serving.plugins.plugin_utils._canary_judge import LEAST_CONFIDENCE
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import (
    FAILED_TO_START,
    INVALID,
    MEASURED,
    MISSED_GATE,
    SECTIONS,
    STARTED,
    TuneRecordError,
    changed_settings,
    read_records,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_search import pareto_front, ranked

SCORE_PLOT = "score.png"
LATENCY_PLOT = "latency.png"
QUALITY_PLOT = "quality.png"
PLOTS = (SCORE_PLOT, LATENCY_PLOT, QUALITY_PLOT)
INDEX = "index.html"
INDEX_TEMPLATE = "report/index.html.j2"

PERCENTILES = ("p50", "p90", "p99")
LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))

SIM = "(sim)"
SIMULATED_NOTE = "simulated (lab engine stand-in)"

# Fixed rendering, so that the same ledger gives the same bytes on every run: a set DPI, the
# font matplotlib ships (not whatever the machine has), a fixed SVG hash salt, and no
# "Software" chunk naming matplotlib's version in the PNG.
DPI = 100
RC = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "svg.hashsalt": "biv100.serving.report",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "axes.grid": True,
    "grid.alpha": 0.3,
}
PNG_METADATA = {"Software": None}
HOST_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
PERCENTILE_COLOURS = {"p50": "tab:blue", "p90": "tab:orange", "p99": "tab:red"}


class ReportError(ValueError):
    """A ledger that cannot be drawn, or a controller that cannot draw; the message says which."""


# --- the ledger ----------------------------------------------------------------------------------


def load_ledger(path: Path, warn=None) -> list[dict]:
    """The lines of a ledger.jsonl (a torn last line left out, named to warn); a line that is not
    a JSON object is named by its number."""
    try:
        numbered = json_lines.read(path, warn)
    except json_lines.JsonLinesError as error:
        raise ReportError(str(error)) from None
    for line_number, line in numbered:
        if not isinstance(line, dict):
            raise ReportError(f"{path}: line {line_number}: not a JSON object")
    return [line for _number, line in numbered]


def number(value) -> float | None:
    """value as a float when it is a number (a bool is not one), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _figures_of(value) -> dict | None:
    """A bench or quality record that has its score, else None (an absent or broken one)."""
    return value if isinstance(value, dict) and number(value.get("score")) is not None else None


def measured_release(line: dict) -> str | None:
    """The release whose figures a ledger line holds.

    A deploy whose gate failed rolls the host back, and its line then names the release the
    host went back to; its figures were measured on the release it rolled back from."""
    rollback = line.get("rollback")
    if isinstance(rollback, dict) and rollback.get("from"):
        return str(rollback["from"])
    release = line.get("release")
    return str(release) if release not in (None, "") else None


@dataclass
class Row:
    """One release on one host, as the ledger last recorded it."""

    release: str
    host: str
    state: str = "pending"
    bench: dict | None = None
    quality: dict | None = None
    probes: str | None = None
    failed_probes: list = field(default_factory=list)


def rows(lines: list[dict]) -> list[Row]:
    """One row per release and host: releases in order of first appearance in the ledger, hosts
    likewise within a release; each figure from the last line of the pair that has it."""
    found: dict[tuple[str, str], Row] = {}
    releases: list[str] = []
    for line in lines:
        release, host = measured_release(line), line.get("host")
        if release is None or not host:
            continue  # a run that ended before it staged anything measured no release
        if release not in releases:
            releases.append(release)
        row = found.setdefault((release, str(host)), Row(release, str(host)))
        went_back = line.get("release") != release
        row.state = (f"rolled back to {line['rollback'].get('to') or 'base'}" if went_back
                     else line.get("state") or "pending")
        if _figures_of(line.get("bench")):
            row.bench = line["bench"]
        if _figures_of(line.get("quality")):
            row.quality = line["quality"]
        # After a rollback the probes ran again on the release the host went back to: they say
        # nothing about the one it left.
        if line.get("probes") and not went_back:
            row.probes = str(line["probes"])
            row.failed_probes = list(line.get("failed_probes") or [])
    order = {release: index for index, release in enumerate(releases)}
    # dicts keep insertion order, so hosts stay in order of first appearance within a release.
    return sorted(found.values(), key=lambda row: order[row.release])


# --- what each plot shows ------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    release: str
    host: str
    value: float
    simulated: bool


def series(table: list[Row]) -> dict:
    """The points of each plot: one per release and host whose row has the figure.

    score: [Point]; latency: {"ttft_ms": {"p50": [Point], ...}, "tpot_ms": {...}};
    deviation: [Point] (the quality score's deviation from its baseline, a fraction); and what
    the lines are drawn from, as the figures recorded them (the gates role's bounds when they
    were measured): the gate score(s), the ±bound(s), the weights (None when no figure set
    holds them), the baselines."""
    score, deviation = [], []
    latency = {key: {percentile: [] for percentile in PERCENTILES} for key, _name in LATENCIES}
    gates, bounds, baselines, weights = [], [], [], None
    for row in table:
        bench, quality = row.bench, row.quality
        if bench:
            simulated = bool(bench.get("simulated"))
            score.append(Point(row.release, row.host, number(bench["score"]), simulated))
            gate = number(bench["gate"].get("score")) if isinstance(bench.get("gate"), dict) else None
            if gate is not None:
                _add_once(gates, gate)
            if isinstance(bench.get("weights"), dict):
                weights = bench["weights"]
            for key, _name in LATENCIES:
                figures = bench.get(key) if isinstance(bench.get(key), dict) else {}
                for percentile in PERCENTILES:
                    value = number(figures.get(percentile))
                    if value is not None:
                        latency[key][percentile].append(Point(row.release, row.host, value, simulated))
        bound = number(quality.get("bound")) if quality else None
        if bound is not None:
            _add_once(bounds, bound)
        if quality and number(quality.get("deviation")) is not None:
            deviation.append(Point(row.release, row.host, number(quality["deviation"]),
                                   bool(quality.get("simulated"))))
            baseline = quality.get("baseline") if isinstance(quality.get("baseline"), dict) else {}
            if baseline.get("release"):
                _add_once(baselines, str(baseline["release"]))
    return {"score": score, "latency": latency, "deviation": deviation, "gates": gates,
            "bounds": bounds, "baselines": baselines,
            "weights": weights, "releases": list(dict.fromkeys(row.release for row in table))}


def _add_once(values: list, value) -> None:
    if value not in values:
        values.append(value)


# --- the figures ---------------------------------------------------------------------------------


def _matplotlib():
    """matplotlib's Figure, its Agg canvas, and what the legends are made of."""
    try:
        import matplotlib
        import matplotlib.style
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as error:
        raise ReportError("the report's plots need the matplotlib Python package on the controller "
                          f"(requirements.txt): {error}") from None
    return matplotlib, Figure, FigureCanvasAgg, Line2D, Patch


@contextmanager
def drawing():
    """matplotlib's own defaults (not the machine's matplotlibrc) and the fixed settings, for
    drawing and saving alike."""
    matplotlib = _matplotlib()[0]
    with matplotlib.style.context("default"), matplotlib.rc_context(RC):
        yield


def _categories(plotted: dict, points: list[Point]) -> list[str]:
    """The releases a plot has points for, in the ledger's order: a release without the
    figure gets no place on the axis."""
    present = {point.release for point in points}
    return [release for release in plotted["releases"] if release in present]


def _offsets(hosts: list[str]) -> dict[str, float]:
    """Each host a little apart on the release's tick, so that equal values stay visible."""
    step = min(0.08, 0.6 / max(len(hosts), 1))
    return {host: (index - (len(hosts) - 1) / 2) * step for index, host in enumerate(hosts)}


def _simulated_title(title: str, points: list) -> str:
    """The title, saying when every point, or which of them (the hollow ones), are simulated;
    a point is anything with a `simulated` flag."""
    marked = [point for point in points if point.simulated]
    if not marked:
        return title
    if len(marked) == len(points):
        return f"{title}\n{SIMULATED_NOTE}"
    return f"{title}\nhollow points {SIMULATED_NOTE}"


def _new_figure(Figure, FigureCanvasAgg, releases: list[str], height: float, columns: int = 1):
    width = min(24.0, max(8.0, 3.0 + 0.6 * len(releases))) * (1.0 if columns == 1 else 1.6)
    figure = Figure(figsize=(width, height), dpi=DPI)
    # The non-interactive Agg canvas, without pyplot: no GUI backend and no global figure state.
    FigureCanvasAgg(figure)
    return figure


def _release_axis(axes, releases: list[str]) -> None:
    axes.set_xticks(range(len(releases)))
    axes.set_xticklabels(releases, rotation=30 if len(releases) > 4 else 0,
                         ha="right" if len(releases) > 4 else "center")
    axes.set_xlim(-0.5, len(releases) - 0.5)
    axes.set_xlabel("release (in the order of the ledger)")


def _nothing(axes, what: str) -> None:
    axes.set_axis_off()
    axes.text(0.5, 0.5, f"no release has {what} in the ledger yet", ha="center", va="center",
              transform=axes.transAxes)


def _scatter(axes, points: list[Point], x_of, y_of, colour, marker, gid: str) -> None:
    """The points, filled when measured on a BI-V100 engine and hollow when simulated, and a
    thin line joining them in release order."""
    xs = [x_of(point) for point in points]
    ys = [y_of(point) for point in points]
    axes.plot(xs, ys, color=colour, linewidth=0.8, alpha=0.5, zorder=2)
    axes.scatter(xs, ys, marker=marker, s=36, zorder=3, gid=gid, edgecolors=colour, linewidths=1.2,
                 facecolors=["none" if point.simulated else colour for point in points])


def _by_host(points: list[Point]) -> dict[str, list[Point]]:
    hosts: dict[str, list[Point]] = {}
    for point in points:
        hosts.setdefault(point.host, []).append(point)
    return hosts


def figures(plotted: dict, hosts: list[str]) -> dict[str, object]:
    """The three figures, by file name. hosts names every host, so that a host has the same
    colour and marker in each plot."""
    matplotlib, Figure, FigureCanvasAgg, Line2D, Patch = _matplotlib()
    colour_map = matplotlib.colormaps["tab10" if len(hosts) <= 10 else "tab20"]
    colours = {host: colour_map(index % colour_map.N) for index, host in enumerate(hosts)}
    markers = {host: HOST_MARKERS[index % len(HOST_MARKERS)] for index, host in enumerate(hosts)}
    hollow = Line2D([], [], marker="o", linestyle="none", markerfacecolor="none", markeredgecolor="black",
                    label=f"hollow: {SIMULATED_NOTE}")
    drawn = {}
    with drawing():
        drawn[SCORE_PLOT] = _score_figure(Figure, FigureCanvasAgg, plotted, colours, markers, hollow)
        drawn[LATENCY_PLOT] = _latency_figure(Figure, FigureCanvasAgg, plotted, markers, hollow, Line2D)
        drawn[QUALITY_PLOT] = _quality_figure(Figure, FigureCanvasAgg, plotted, colours, markers, hollow, Patch)
    return drawn


def _legend(axes, handles: list) -> None:
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                frameon=False)


def _score_figure(Figure, FigureCanvasAgg, plotted, colours, markers, hollow):
    points = plotted["score"]
    releases = _categories(plotted, points)
    figure = _new_figure(Figure, FigureCanvasAgg, releases, 4.8)
    axes = figure.add_subplot()
    title = "Weighted score per release and host" + (f" ({_formula(plotted['weights'])})" if plotted["weights"] else "")
    axes.set_title(_simulated_title(title, points), fontsize="medium")
    if not points:
        _nothing(axes, "a benchmark score")
        return figure
    index = {release: position for position, release in enumerate(releases)}
    offsets = _offsets(list(_by_host(points)))
    handles = []
    for host, own in _by_host(points).items():
        _scatter(axes, own, lambda point: index[point.release] + offsets[point.host], lambda point: point.value,
                 colours[host], markers[host], f"score:{host}")
        handles.append(axes.scatter([], [], marker=markers[host], color=colours[host], label=host))
    for gate in plotted["gates"]:
        handles.append(axes.axhline(gate, color="tab:red", linestyle="--", linewidth=1.2,
                                    label=f"gate: score ≥ {gate:g}"))
    if any(point.simulated for point in points):
        handles.append(hollow)
    _release_axis(axes, releases)
    axes.set_ylabel("weighted score")
    _legend(axes, handles)
    return figure


def _latency_figure(Figure, FigureCanvasAgg, plotted, markers, hollow, Line2D):
    every = [point for key, _name in LATENCIES for percentile in PERCENTILES
             for point in plotted["latency"][key][percentile]]
    releases = _categories(plotted, every)
    figure = _new_figure(Figure, FigureCanvasAgg, releases, 4.8, columns=2)
    figure.suptitle(_simulated_title("TTFT and TPOT percentiles per release and host", every),
                    fontsize="medium")
    hosts = list(_by_host(every))
    offsets = _offsets(hosts)
    index = {release: position for position, release in enumerate(releases)}
    for column, (key, name) in enumerate(LATENCIES, start=1):
        axes = figure.add_subplot(1, 2, column)
        axes.set_title(f"{name} (ms)", fontsize="medium")
        own = [point for percentile in PERCENTILES for point in plotted["latency"][key][percentile]]
        if not own:
            _nothing(axes, f"a {name} figure")
            continue
        for percentile in PERCENTILES:
            for host, points in _by_host(plotted["latency"][key][percentile]).items():
                _scatter(axes, points, lambda point: index[point.release] + offsets[point.host],
                         lambda point: point.value, PERCENTILE_COLOURS[percentile], markers[host],
                         f"{key}:{percentile}:{host}")
        _release_axis(axes, releases)
        axes.set_ylabel("milliseconds")
    if every:
        handles = [Line2D([], [], color=PERCENTILE_COLOURS[percentile], marker="o", linestyle="-",
                          label=percentile) for percentile in PERCENTILES]
        handles += [Line2D([], [], color="dimgray", marker=markers[host], linestyle="none", label=host)
                    for host in hosts]
        if any(point.simulated for point in every):
            handles.append(hollow)
        _legend(figure.axes[-1], handles)
    return figure


def _quality_figure(Figure, FigureCanvasAgg, plotted, colours, markers, hollow, Patch):
    points = plotted["deviation"]
    releases = _categories(plotted, points)
    figure = _new_figure(Figure, FigureCanvasAgg, releases, 4.8)
    axes = figure.add_subplot()
    baselines = plotted["baselines"]
    title = "Quality deviation from the baseline release" + (f" {', '.join(baselines)}" if baselines else "")
    axes.set_title(_simulated_title(title, points), fontsize="medium")
    if not points:
        _nothing(axes, "a quality deviation")
        return figure
    index = {release: position for position, release in enumerate(releases)}
    offsets = _offsets(list(_by_host(points)))
    handles = []
    for bound in plotted["bounds"]:
        axes.axhspan(-100 * bound, 100 * bound, color="tab:green", alpha=0.12, zorder=1)
        handles.append(Patch(color="tab:green", alpha=0.25, label=f"gate: within ±{100 * bound:g} %"))
    axes.axhline(0, color="black", linewidth=0.8, zorder=1)
    for host, own in _by_host(points).items():
        _scatter(axes, own, lambda point: index[point.release] + offsets[point.host],
                 lambda point: 100 * point.value, colours[host], markers[host], f"deviation:{host}")
        handles.append(axes.scatter([], [], marker=markers[host], color=colours[host], label=host))
    if any(point.simulated for point in points):
        handles.append(hollow)
    _release_axis(axes, releases)
    axes.set_ylabel("deviation from the baseline (%)")
    if plotted["bounds"]:
        # The band stays in view when every point is close to zero.
        low, high = axes.get_ylim()
        widest = 100 * max(plotted["bounds"])
        axes.set_ylim(min(low, -1.5 * widest), max(high, 1.5 * widest))
    _legend(axes, handles)
    return figure


def _formula(weights: dict) -> str:
    return f"{weights.get('output')} × output tok/s + {weights.get('input')} × input tok/s"


def png(figure) -> bytes:
    """The figure as PNG bytes, the same for the same figure on every run."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata=PNG_METADATA, bbox_inches="tight", pad_inches=0.2)
    return buffer.getvalue()


# --- the canary analyses -------------------------------------------------------------------------

CANARY_PLOT_PREFIX = "canary-"
PLOT_SUFFIX = ".png"
# What a canary plot's y axis measures, by the analysis' metric name; a metric not named here is
# drawn without a unit.
CANARY_UNITS = {
    "score": "weighted score",
    "output_tps": "output tok/s (per run)",
    "request_output_tps": "output tok/s (per request)",
    "ttft_ms": "milliseconds",
    "tpot_ms": "milliseconds",
    "e2e_ms": "milliseconds",
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
    return _plot_name(CANARY_PLOT_PREFIX, release, "release", taken)


def _plot_name(prefix: str, what: str, fallback: str, taken: set) -> str:
    """<prefix><what>.png, what reduced to characters safe in a file name (fallback when none is
    left), -2, -3 and so on appended to a name already taken."""
    stem = prefix + (re.sub(r"[^A-Za-z0-9._-]+", "_", what).strip(".") or fallback)
    name, count = stem + PLOT_SUFFIX, 1
    while name in taken:
        count += 1
        name = f"{stem}-{count}{PLOT_SUFFIX}"
    taken.add(name)
    return name


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
        details.append(f"{100 * confidence:.0f} % interval" if confidence >= LEAST_CONFIDENCE
                       else "too few samples for an interval")
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
    _matplotlib_module, Figure, FigureCanvasAgg, Line2D, Patch = _matplotlib()
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
        "verdict": _marked(verdict + (" (accepted)" if record.get("accepted") else ""), analysis.simulated),
        "verdict_class": {"pass": "passed", "fail": "failed"}.get(verdict, "doubtful"),
        "score": f"{score:.0f}" if score is not None else "",
        "trials": "" if record.get("trials") is None else str(record["trials"]),
        "reasons": [str(reason) for reason in record.get("reasons") or ()],
        "plot": analysis.plot,
        "title": f"{analysis.release} on {analysis.host}" + (f", {analysis.time}" if analysis.time else ""),
        "outcome": verdict_text(record),
    }


# --- the tuning runs ------------------------------------------------------------------------------

TUNE_PLOT_PREFIX = "tune-"
TUNE_RESULTS = "candidates.jsonl"
TUNE_PROPOSAL = "proposal.yml"
TUNE_STATUS_TEXT = {MEASURED: "measured", MISSED_GATE: "missed a gate", FAILED_TO_START: "failed to start",
                    INVALID: "invalid, never started", STARTED: "started"}
TUNE_ROUND_COLOURS = ("tab:blue", "tab:purple", "tab:cyan", "tab:olive", "tab:brown", "tab:pink")
TUNE_MISSED_COLOUR = "tab:red"
TUNE_FRONT_COLOUR = "tab:green"
# How much of a reason the plot's box of candidates without a point shows, in characters.
TUNE_WHY_CHARS = 110


@dataclass(frozen=True)
class TuneRun:
    """One tuning run: its folder's name, every record of its candidates.jsonl in the order
    written (records of _tune_results.py), the proposal if proposal.yml is there, and the file of
    its plot."""

    name: str
    records: tuple
    plot: str
    proposal: dict | None = None

    @property
    def candidates(self) -> list[dict]:
        """Each candidate's last record (its last round), in the order the candidates first ran."""
        return list(_last_records(self.records).values())

    @property
    def incumbent(self) -> dict | None:
        return next((record for record in self.candidates if record.get("incumbent")), None)

    @property
    def simulated(self) -> bool:
        return any(_tune_figures(record).get("simulated") for record in self.candidates)


def _last_records(records) -> dict[str, dict]:
    """{id: the candidate's last record}, as _tune_results.read_candidates gives them of a file."""
    return {record["id"]: record for record in records}


def load_tuning_runs(folder: Path, warn=None) -> list[TuneRun]:
    """Every tuning run under folder (<folder>/<run>/candidates.jsonl), by the run's name; [] when
    there is none. A torn last line is left out and named to warn(message); a file that cannot be
    read is an error naming it."""
    folder = Path(folder)
    found, taken = [], set()
    for results in sorted(folder.glob(f"*/{TUNE_RESULTS}")):
        if not results.is_file():
            continue
        try:
            records = read_records(results, warn)
        except TuneRecordError as error:
            raise ReportError(str(error)) from None
        name = results.parent.name
        found.append(TuneRun(name, tuple(records), _plot_name(TUNE_PLOT_PREFIX, name, "run", taken),
                             _load_proposal(results.parent / TUNE_PROPOSAL)))
    return found


def _load_proposal(path: Path) -> dict | None:
    """proposal.yml's settings and the lines of its header; None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ReportError(f"{path}: cannot be read: {error}") from None
    try:
        settings = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ReportError(f"{path}: not YAML: {error}") from None
    if not isinstance(settings, dict):
        raise ReportError(f"{path}: not the mapping of engine settings tune.yml writes")
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:].strip())
    return {"settings": {section: settings.get(section) or {} for section in SECTIONS}, "header": header}


def _tune_figures(record: dict) -> dict:
    return record["figures"] if isinstance(record.get("figures"), dict) else {}


def _placed(record: dict) -> bool:
    """Whether a record has the score and the TTFT p99 that place it in the plot."""
    figures = _tune_figures(record)
    return number(figures.get("score")) is not None and number(figures.get("ttft_p99_ms")) is not None


def tune_gates(run: TuneRun, ledger_gates: list) -> tuple[list[float], str]:
    """The throughput gate(s) the run's figures were judged against, as its records keep them,
    else those the ledger's figures recorded; and where they come from."""
    gates = []
    for record in run.candidates:
        gate = number(_tune_figures(record).get("gate_score"))
        if gate is not None:
            _add_once(gates, gate)
    if gates:
        return gates, "as the candidates recorded it"
    return list(ledger_gates), "as the ledger's figures recorded it"


def tune_why(record: dict) -> str:
    """Why a candidate is not eligible, in one line: the first of its problems (invalid), the last
    line of its engine's log (failed to start), the gates it missed; blank for one measured."""
    status = record.get("status")
    if status == INVALID:
        problems = [str(problem) for problem in record.get("problems") or ()]
        return problems[0].strip().splitlines()[0] if problems and problems[0].strip() else "no problem recorded"
    if status == FAILED_TO_START:
        lines = [line.strip() for line in str(record.get("log_tail") or "").splitlines() if line.strip()]
        return lines[-1] if lines else "the engine's log was empty"
    if status == MISSED_GATE:
        return "; ".join(_gate_summary(gate) for gate in record.get("gates") or ()) or "no gate recorded"
    return ""


def _gate_summary(gate) -> str:
    """A gate's summary as the record keeps it: text, or gate_verdicts' {gate, passed, summary}."""
    if isinstance(gate, dict):
        return f"{gate.get('gate', 'gate')}: {gate.get('summary', '')}".strip()
    return " ".join(str(gate).split())


def _round_text(record: dict) -> str:
    if record.get("round") is None:
        return ""
    factor = number(record.get("factor"))
    return f"{record['round']}" + (f" (× {factor:g})" if factor is not None else "")


def _short(text: str, chars: int = TUNE_WHY_CHARS) -> str:
    return text if len(text) <= chars else text[:chars - 3] + "..."


def tune_figure(run: TuneRun, ledger_gates: list):
    """One tuning run: x the TTFT p99, y the weighted score, each candidate at its last round,
    measured ones coloured by that round and hollow when simulated, the incumbent a star, the
    ones that missed a gate an x, the Pareto front a step line, the throughput gate dashed; the
    candidates without a point (invalid, failed to start, no figures) in a box with why."""
    _matplotlib_module, Figure, FigureCanvasAgg, Line2D, _patch = _matplotlib()
    with drawing():
        return _tune_figure(Figure, FigureCanvasAgg, Line2D, run, ledger_gates)


def _tune_figure(Figure, FigureCanvasAgg, Line2D, run: TuneRun, ledger_gates: list):
    figure = Figure(figsize=(10.0, 6.0), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    candidates = run.candidates
    placed = [record for record in candidates if record.get("status") in (MEASURED, MISSED_GATE) and _placed(record)]
    flags = [_Simulated(bool(_tune_figures(record).get("simulated"))) for record in placed]
    axes.set_title(_simulated_title(f"Tuning run {run.name}: weighted score against TTFT p99, "
                                    f"{len(candidates)} candidates", flags), fontsize="medium")
    handles = []
    rounds = sorted({record["round"] for record in placed if isinstance(record.get("round"), int)})
    colours = {round_: TUNE_ROUND_COLOURS[index % len(TUNE_ROUND_COLOURS)] for index, round_ in enumerate(rounds)}
    measured = [record for record in placed if record["status"] == MEASURED]
    for round_ in [*rounds, None]:
        own = [record for record in measured if record.get("round") == round_ and not record.get("incumbent")]
        if not own:
            continue
        colour = colours.get(round_, "dimgray")
        _tune_scatter(axes, own, "o", colour, f"tune:measured:{round_}")
        factor = next((number(record.get("factor")) for record in own if number(record.get("factor")) is not None),
                      None)
        label = "measured" + (f", last in round {round_}" if round_ is not None else "")
        label += f" (bench × {factor:g})" if factor is not None else ""
        handles.append(Line2D([], [], marker="o", linestyle="none", color=colour, label=label))
    missed = [record for record in placed if record["status"] == MISSED_GATE and not record.get("incumbent")]
    if missed:
        axes.scatter([_tune_figures(record)["ttft_p99_ms"] for record in missed],
                     [_tune_figures(record)["score"] for record in missed], marker="x", s=48,
                     color=TUNE_MISSED_COLOUR, linewidths=1.5, zorder=3, gid="tune:missed_gate")
        handles.append(Line2D([], [], marker="x", linestyle="none", color=TUNE_MISSED_COLOUR,
                              label="missed a gate (its measured figures)"))
    front = pareto_front(candidates)
    if front:
        axes.step([_tune_figures(record)["ttft_p99_ms"] for record in front],
                  [_tune_figures(record)["score"] for record in front], where="post", color=TUNE_FRONT_COLOUR,
                  linewidth=1.4, zorder=2, gid="tune:front")
        handles.append(Line2D([], [], color=TUNE_FRONT_COLOUR, linewidth=1.4,
                              label="Pareto front: no other eligible candidate beats them on both"))
    incumbent = run.incumbent
    if incumbent is not None and incumbent in placed:
        figures = _tune_figures(incumbent)
        colour = "black" if incumbent["status"] == MEASURED else TUNE_MISSED_COLOUR
        axes.scatter([figures["ttft_p99_ms"]], [figures["score"]], marker="*", s=180, zorder=4, gid="tune:incumbent",
                     edgecolors=colour, linewidths=1.2, facecolors="none" if figures.get("simulated") else colour)
        handles.append(Line2D([], [], marker="*", markersize=11, linestyle="none", color=colour,
                              label=f"incumbent {incumbent['id']}"
                              + ("" if incumbent["status"] == MEASURED else " (missed a gate)")))
    chosen = proposed_candidate(run)
    if chosen is not None and not chosen.get("incumbent") and chosen in placed:
        figures = _tune_figures(chosen)
        axes.scatter([figures["ttft_p99_ms"]], [figures["score"]], marker="o", s=260, zorder=5, gid="tune:proposed",
                     facecolors="none", edgecolors="black", linewidths=1.6)
        handles.append(Line2D([], [], marker="o", markersize=14, linestyle="none", markerfacecolor="none",
                              markeredgecolor="black", label=f"proposed {chosen['id']} (proposal.yml)"))
    for record in front:
        figures = _tune_figures(record)
        axes.annotate(record["id"], (figures["ttft_p99_ms"], figures["score"]), textcoords="offset points",
                      xytext=(5, 5), fontsize="x-small", color="dimgray")
    gates, source = tune_gates(run, ledger_gates)
    for gate in gates:
        handles.append(axes.axhline(gate, color="tab:red", linestyle="--", linewidth=1.2, gid="tune:gate",
                                    label=f"throughput gate: score ≥ {gate:g}, {source}"))
    if any(flag.simulated for flag in flags):
        handles.append(Line2D([], [], marker="o", linestyle="none", markerfacecolor="none", markeredgecolor="black",
                              label=f"hollow: {SIMULATED_NOTE}"))
    if placed:
        axes.set_xlabel("TTFT p99 (ms), lower is better")
        axes.set_ylabel("weighted score, higher is better")
        _legend(axes, handles)
    else:
        axes.set_axis_off()
        axes.text(0.5, 0.5, "no candidate of this run has a score and a TTFT p99 to place it", ha="center",
                  va="center", transform=axes.transAxes)
    unplaced = [record for record in candidates if record not in placed]
    if unplaced:
        lines = [_short(f"{record['id']}{' (incumbent)' if record.get('incumbent') else ''}: "
                        f"{TUNE_STATUS_TEXT.get(record.get('status'), record.get('status'))}"
                        + (f" - {tune_why(record)}" if tune_why(record) else " - no score or no TTFT p99 recorded"))
                 for record in unplaced]
        axes.text(0.0, -0.12 if placed else 0.3, "Not in the plot:\n" + "\n".join(lines), transform=axes.transAxes,
                  ha="left", va="top", fontsize="small", gid="tune:unplaced",
                  bbox={"boxstyle": "round", "facecolor": "#fdecea", "edgecolor": TUNE_MISSED_COLOUR})
    return figure


@dataclass(frozen=True)
class _Simulated:
    """What _simulated_title counts of a point."""

    simulated: bool


def _tune_scatter(axes, records: list[dict], marker: str, colour, gid: str) -> None:
    figures = [_tune_figures(record) for record in records]
    axes.scatter([item["ttft_p99_ms"] for item in figures], [item["score"] for item in figures], marker=marker,
                 s=40, zorder=3, gid=gid, edgecolors=colour, linewidths=1.2,
                 facecolors=["none" if item.get("simulated") else colour for item in figures])


def tune_cells(run: TuneRun, ledger_gates: list) -> dict:
    """What the page shows of a run: one row per candidate (id, the settings that differ from the
    incumbent's, status, score, TTFT p99, round, why), the best eligible candidate, and the
    proposal when proposal.yml is there."""
    candidates, incumbent = run.candidates, run.incumbent
    front = {record["id"] for record in pareto_front(candidates)}
    best = ranked(candidates)
    rows_ = []
    for record in candidates:
        figures = _tune_figures(record)
        simulated = figures.get("simulated")
        score, ttft = number(figures.get("score")), number(figures.get("ttft_p99_ms"))
        why = tune_why(record)
        if record["status"] == MEASURED:
            notes = (["best score"] if best and best[0]["id"] == record["id"] else []) + (
                ["on the Pareto front"] if record["id"] in front else [])
            why = ", ".join(notes)
        rows_.append({
            "id": record["id"] + (" (incumbent)" if record.get("incumbent") else ""),
            "changes": (["the host's settings"] if record.get("incumbent") else
                        changed_settings(incumbent, record) if incumbent else []),
            "status": TUNE_STATUS_TEXT.get(record["status"], record["status"]),
            "status_class": {MEASURED: "passed", MISSED_GATE: "doubtful"}.get(record["status"], "failed"),
            "score": _marked(f"{score:.0f}", simulated) if score is not None else "",
            "ttft": _marked(f"{ttft:.1f} ms", simulated) if ttft is not None else "",
            "round": _round_text(record),
            "why": why,
        })
    gates, source = tune_gates(run, ledger_gates)
    return {
        "name": run.name, "plot": run.plot, "rows": rows_, "simulated": run.simulated,
        "counts": ", ".join(f"{sum(record['status'] == status for record in candidates)} {text}"
                            for status, text in TUNE_STATUS_TEXT.items()
                            if any(record["status"] == status for record in candidates)),
        "best": best[0]["id"] if best else None,
        "gates": [f"{gate:g}" for gate in gates], "gate_source": source,
        "proposal": _proposal_cells(run),
    }


def proposed_candidate(run: TuneRun) -> dict | None:
    """The candidate whose settings proposal.yml holds (the incumbent when none beat it); None
    without a proposal or when no candidate of the run has its settings."""
    if run.proposal is None:
        return None
    settings = run.proposal["settings"]
    return next((record for record in run.candidates
                 if {section: record["settings"].get(section) or {} for section in SECTIONS} == settings), None)


def _proposal_cells(run: TuneRun) -> dict | None:
    """The candidate proposal.yml deploys (the one whose settings it holds), and its header."""
    if run.proposal is None:
        return None
    matched = proposed_candidate(run)
    if matched is None:
        chosen = "settings that no candidate of the run has"
    elif matched.get("incumbent"):
        chosen = f"the incumbent {matched['id']}: no candidate beat it"
    else:
        chosen = f"candidate {matched['id']}"
    return {"file": f"{run.name}/{TUNE_PROPOSAL}", "chosen": chosen, "header": run.proposal["header"]}


TUNE_TABLE_COLUMNS = ("candidate", "settings unlike the incumbent's", "status", "score", "TTFT p99", "round",
                      "why")


# --- the cells of a table ------------------------------------------------------------------------


def _marked(text: str, simulated) -> str:
    return f"{text} {SIM}" if simulated else text


def figure_cells(bench, quality) -> tuple[str, str, str, str]:
    """score, output tok/s, TTFT p99 and quality as a table shows them: blank when absent,
    marked (sim) when simulated. LEDGER.md and the report's page share them."""
    score = output = ttft = shown_quality = ""
    bench = _figures_of(bench)
    if bench:
        simulated = bench.get("simulated")
        score = _marked(f"{number(bench['score']):.0f}", simulated)
        if number(bench.get("output_tps")) is not None:
            output = _marked(f"{number(bench['output_tps']):.1f}", simulated)
        p99 = number((bench.get("ttft_ms") or {}).get("p99")) if isinstance(bench.get("ttft_ms"), dict) else None
        if p99 is not None:
            ttft = _marked(f"{p99:.1f} ms", simulated)
    quality = _figures_of(quality)
    if quality:
        text = f"{number(quality['score']):.3f}"
        deviation = number(quality.get("deviation"))
        if deviation is not None:
            text += f", {100 * deviation:+.1f} %"
        shown_quality = _marked(text, quality.get("simulated"))
    return score, output, ttft, shown_quality


def gate_cells(row: Row) -> list[tuple[str, bool | None, str]]:
    """(gate, passed, why) for each gate the row's figures tell: functional from the probes'
    verdicts, quality and throughput from the verdict their actions recorded, with the bounds
    they recorded."""
    verdicts = []
    if row.probes:
        verdicts.append(("functional", not row.failed_probes,
                         row.probes if not row.failed_probes else f"failed: {', '.join(map(str, row.failed_probes))}"))
    if row.quality:
        deviation = number(row.quality.get("deviation"))
        bound = number(row.quality.get("bound"))
        why = (f"deviation {100 * deviation:+.1f} %" + (f", gate ±{100 * bound:g} %" if bound is not None else "")
               if deviation is not None else "no baseline to compare with yet")
        verdicts.append(("quality", _passed(row.quality.get("passed")), _marked(why, row.quality.get("simulated"))))
    if row.bench:
        gate = row.bench.get("gate") if isinstance(row.bench.get("gate"), dict) else {}
        minimum = number(gate.get("score"))
        why = f"score {number(row.bench['score']):.0f}" + (f", gate ≥ {minimum:g}" if minimum is not None else "")
        verdicts.append(("throughput", _passed(gate.get("passed")), _marked(why, row.bench.get("simulated"))))
    return verdicts


def _passed(value) -> bool | None:
    return value if isinstance(value, bool) else None


# --- the page ------------------------------------------------------------------------------------

TABLE_COLUMNS = ("release", "host", "state", "score", "output tok/s", "TTFT p99", "quality", "gates")
CANARY_TABLE_COLUMNS = ("release", "canary", "baseline", "baseline kind", "baseline release", "verdict", "score",
                        "trials", "reasons")


def page(fleet: str, lines: list[dict], table: list[Row], plotted: dict, judged: list[Analysis],
         runs: list[TuneRun] = ()) -> str:
    """index.html, files/report/index.html.j2 filled in (autoescaped) with the ledger's rows, its
    canary analyses and the tuning runs."""
    points = plotted["score"] + plotted["deviation"] + [
        point for key, _name in LATENCIES for percentile in PERCENTILES for point in plotted["latency"][key][percentile]]
    times = [str(line["time"]) for line in lines if line.get("time")]
    return _templates.render(
        INDEX_TEMPLATE,
        fleet=fleet, lines=len(lines), last=max(times) if times else None,
        releases=len(plotted["releases"]), hosts=len(dict.fromkeys(row.host for row in table)),
        simulated=(any(point.simulated for point in points) or any(analysis.simulated for analysis in judged)
                   or any(run.simulated for run in runs)),
        sim=SIM,
        plots={"score": SCORE_PLOT, "latency": LATENCY_PLOT, "quality": QUALITY_PLOT},
        weights=plotted["weights"], gates=[f"{gate:g}" for gate in plotted["gates"]],
        bounds=[f"{100 * bound:g}" for bound in plotted["bounds"]],
        columns=TABLE_COLUMNS,
        rows=[{"cells": (row.release, row.host, row.state), "figures": figure_cells(row.bench, row.quality),
               "gates": [{"name": gate, "passed": passed, "why": why} for gate, passed, why in gate_cells(row)]}
              for row in table],
        canary_columns=CANARY_TABLE_COLUMNS,
        analyses=[canary_cells(analysis) for analysis in judged],
        tune_columns=TUNE_TABLE_COLUMNS,
        runs=[tune_cells(run, plotted["gates"]) for run in runs],
    )


def render(lines: list[dict], fleet: str, runs: list[TuneRun] = ()) -> dict[str, bytes]:
    """The report of a ledger's lines and of the tuning runs (load_tuning_runs), file name ->
    bytes: the three PNG plots, a canary plot per canary analysis (none when the ledger has
    none), a tuning plot per run, and index.html."""
    table = rows(lines)
    plotted = series(table)
    hosts = list(dict.fromkeys(row.host for row in table))
    judged = analyses(lines)
    with drawing():
        files = {name: png(figure) for name, figure in figures(plotted, hosts).items()}
        for analysis in judged:
            files[analysis.plot] = png(canary_figure(analysis))
        for run in runs:
            files[run.plot] = png(tune_figure(run, plotted["gates"]))
    files[INDEX] = page(fleet, lines, table, plotted, judged, runs).encode("utf-8")
    return files


def plot_names(files: dict[str, bytes]) -> list[str]:
    """The PNG files of a render, in the order the page shows them."""
    return [name for name in files if name.endswith(PLOT_SUFFIX)]
