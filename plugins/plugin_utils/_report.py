# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pictures of every release's figures, drawn from a fleet's deployment ledger, as one page.
Controller side only.

render(lines, fleet, runs) gives the bytes of the PNG files and of index.html
(files/report/index.html.j2), the same bytes for the same ledger and runs, so that a re-render
changes no file and a committed report shows no spurious diff. What it draws comes from:

- _report_ledger: the ledger's rows, one per release and host, and the table's cells;
- _report_figures: the plots of every release's score, latency and quality;
- _report_canary: the canary analyses the ledger recorded;
- _report_tuning: the tuning runs tune.yml wrote.
"""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils import _templates
from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import SIM, figure_cells
from ansible_collections.biv100.serving.plugins.plugin_utils._iterations import verdicts
from ansible_collections.biv100.serving.plugins.plugin_utils._report_canary import Analysis, analyses, canary_cells, canary_figure
from ansible_collections.biv100.serving.plugins.plugin_utils._report_figures import (
    LATENCIES,
    LATENCY_PLOT,
    PERCENTILES,
    PLOT_SUFFIX,
    QUALITY_PLOT,
    SCORE_PLOT,
    drawing,
    figures,
    png,
    series,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import Row, gate_cells, rows
from ansible_collections.biv100.serving.plugins.plugin_utils._report_tuning import TUNE_TABLE_COLUMNS, TuneRun, tune_cells, tune_figure

INDEX = "index.html"
INDEX_TEMPLATE = "report/index.html.j2"
TABLE_COLUMNS = ("release", "host", "state", "score", "output tok/s", "TTFT p99", "quality", "gates")
CANARY_TABLE_COLUMNS = ("release", "canary", "baseline", "baseline kind", "baseline release", "verdict", "score",
                        "trials", "reasons")


def page(fleet: str, lines: list[dict], table: list[Row], plotted: dict, judged: list[Analysis],
         runs: list[TuneRun] = (), compared: dict | None = None) -> str:
    """index.html, files/report/index.html.j2 filled in (autoescaped) with the ledger's rows, the
    verdicts of each release here, in the compared fleets (name -> their ledger's lines) and on
    the platform, its canary analyses and the tuning runs."""
    ledgers = {fleet: lines, **(compared or {})}
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
        verdict_fleets=list(ledgers), verdicts=_verdicts(ledgers),
        columns=TABLE_COLUMNS,
        rows=[{"cells": (row.release, row.host, row.state), "figures": figure_cells(row.bench, row.quality),
               "gates": [{"name": gate, "passed": passed, "why": why} for gate, passed, why in gate_cells(row)]}
              for row in table],
        canary_columns=CANARY_TABLE_COLUMNS,
        analyses=[canary_cells(analysis) for analysis in judged],
        tune_columns=TUNE_TABLE_COLUMNS,
        runs=[tune_cells(run, plotted["gates"]) for run in runs],
    )


def _verdicts(ledgers: dict) -> list:
    """The verdicts table's rows, when it says more than the releases' table: a platform verdict
    recorded, or another fleet's ledger beside this one."""
    found = verdicts(ledgers)
    return found if len(ledgers) > 1 or any(row.platform for row in found) else []


def render(lines: list[dict], fleet: str, runs: list[TuneRun] = (), compared: dict | None = None) -> dict[str, bytes]:
    """The report of a ledger's lines and of the tuning runs (load_tuning_runs), file name ->
    bytes: the three PNG plots, a canary plot per canary analysis (none when the ledger has
    none), a tuning plot per run, and index.html, whose verdicts table sets the compared fleets'
    ledgers (name -> lines) beside this one's."""
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
    files[INDEX] = page(fleet, lines, table, plotted, judged, runs, compared).encode("utf-8")
    return files


def plot_names(files: dict[str, bytes]) -> list[str]:
    """The PNG files of a render, in the order the page shows them."""
    return [name for name in files if name.endswith(PLOT_SUFFIX)]
