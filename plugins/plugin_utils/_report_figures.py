# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's plots of every release's figures, and the drawing the other plots share.
Controller side only.

series(rows) is what each plot shows, one point per release and host that has the figure;
figures(series) the three matplotlib figures: weighted score with the gate line, TTFT and TPOT
p50/p90/p99, quality deviation with the ±bound band. A figure measured on the lab's engine
stand-in (`simulated: true`) is drawn hollow and named "simulated" in the plot's title and
legend.

matplotlib is a controller requirement (requirements.txt), not one of ansible-core's: it is
imported only when figures are drawn (matplotlib_classes), so that the ledger callback and
ansible-doc load without it. The rendering is fixed (RC, DPI, PNG_METADATA), so that the same
ledger gives the same bytes on every run.
"""

from __future__ import annotations

import io
import re
from contextlib import contextmanager
from dataclasses import dataclass

from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import number
from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import ReportError, Row


SCORE_PLOT = "score.png"
LATENCY_PLOT = "latency.png"
QUALITY_PLOT = "quality.png"
PLOTS = (SCORE_PLOT, LATENCY_PLOT, QUALITY_PLOT)

PERCENTILES = ("p50", "p90", "p99")
LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))

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
                add_once(gates, gate)
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
            add_once(bounds, bound)
        if quality and number(quality.get("deviation")) is not None:
            deviation.append(Point(row.release, row.host, number(quality["deviation"]),
                                   bool(quality.get("simulated"))))
            baseline = quality.get("baseline") if isinstance(quality.get("baseline"), dict) else {}
            if baseline.get("release"):
                add_once(baselines, str(baseline["release"]))
    return {"score": score, "latency": latency, "deviation": deviation, "gates": gates,
            "bounds": bounds, "baselines": baselines,
            "weights": weights, "releases": list(dict.fromkeys(row.release for row in table))}


def add_once(values: list, value) -> None:
    if value not in values:
        values.append(value)


def matplotlib_classes():
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
    matplotlib = matplotlib_classes()[0]
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


def simulated_title(title: str, points: list) -> str:
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
    matplotlib, Figure, FigureCanvasAgg, Line2D, Patch = matplotlib_classes()
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


def legend(axes, handles: list) -> None:
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                frameon=False)


def _one_plot(Figure, FigureCanvasAgg, plotted, points, title: str, what: str):
    """(figure, axes, releases, where) of a figure of one plot of `points` per release and host:
    `where` is ({release: position}, {host: offset}), None when there is no point (the plot then
    says it has no `what`)."""
    releases = _categories(plotted, points)
    figure = _new_figure(Figure, FigureCanvasAgg, releases, 4.8)
    axes = figure.add_subplot()
    axes.set_title(simulated_title(title, points), fontsize="medium")
    if not points:
        _nothing(axes, what)
        return figure, axes, releases, None
    index = {release: position for position, release in enumerate(releases)}
    return figure, axes, releases, (index, _offsets(list(_by_host(points))))


def _score_figure(Figure, FigureCanvasAgg, plotted, colours, markers, hollow):
    points = plotted["score"]
    title = "Weighted score per release and host" + (f" ({_formula(plotted['weights'])})" if plotted["weights"] else "")
    figure, axes, releases, where = _one_plot(Figure, FigureCanvasAgg, plotted, points, title, "a benchmark score")
    if where is None:
        return figure
    index, offsets = where
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
    legend(axes, handles)
    return figure


def _latency_figure(Figure, FigureCanvasAgg, plotted, markers, hollow, Line2D):
    every = [point for key, _name in LATENCIES for percentile in PERCENTILES
             for point in plotted["latency"][key][percentile]]
    releases = _categories(plotted, every)
    figure = _new_figure(Figure, FigureCanvasAgg, releases, 4.8, columns=2)
    figure.suptitle(simulated_title("TTFT and TPOT percentiles per release and host", every),
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
        legend(figure.axes[-1], handles)
    return figure


def _quality_figure(Figure, FigureCanvasAgg, plotted, colours, markers, hollow, Patch):
    points = plotted["deviation"]
    baselines = plotted["baselines"]
    title = "Quality deviation from the baseline release" + (f" {', '.join(baselines)}" if baselines else "")
    figure, axes, releases, where = _one_plot(Figure, FigureCanvasAgg, plotted, points, title, "a quality deviation")
    if where is None:
        return figure
    index, offsets = where
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
    legend(axes, handles)
    return figure


def _formula(weights: dict) -> str:
    return f"{weights.get('output')} × output tok/s + {weights.get('input')} × input tok/s"


def png(figure) -> bytes:
    """The figure as PNG bytes, the same for the same figure on every run."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata=PNG_METADATA, bbox_inches="tight", pad_inches=0.2)
    return buffer.getvalue()


PLOT_SUFFIX = ".png"


def plot_name(prefix: str, what: str, fallback: str, taken: set) -> str:
    """<prefix><what>.png, what reduced to characters safe in a file name (fallback when none is
    left), -2, -3 and so on appended to a name already taken."""
    stem = prefix + (re.sub(r"[^A-Za-z0-9._-]+", "_", what).strip(".") or fallback)
    name, count = stem + PLOT_SUFFIX, 1
    while name in taken:
        count += 1
        name = f"{stem}-{count}{PLOT_SUFFIX}"
    taken.add(name)
    return name
