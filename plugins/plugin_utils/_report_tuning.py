# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's tuning runs. Controller side only.

load_tuning_runs(folder) is every tuning run tune.yml wrote (<run>/candidates.jsonl, records of
_tune_results.py, and proposal.yml); tune_figure(run, gates) draws the weighted score against
TTFT p99 of each candidate at its last round, the Pareto front of _tune_search.py, the
throughput gate the records kept (else the ledger's), the missed gates marked and the
candidates without figures listed with why. A simulated candidate's point is hollow and its
figures in the tuning table are marked "(sim)".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import marked, number
from ansible_collections.biv100.serving.plugins.plugin_utils._report_figures import (
    DPI,
    SIMULATED_NOTE,
    add_once,
    drawing,
    legend,
    matplotlib_classes,
    plot_name,
    simulated_title,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import ReportError
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
        found.append(TuneRun(name, tuple(records), plot_name(TUNE_PLOT_PREFIX, name, "run", taken),
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
            add_once(gates, gate)
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
    _matplotlib_module, Figure, FigureCanvasAgg, Line2D, _patch = matplotlib_classes()
    with drawing():
        return _tune_figure(Figure, FigureCanvasAgg, Line2D, run, ledger_gates)


def _tune_figure(Figure, FigureCanvasAgg, Line2D, run: TuneRun, ledger_gates: list):
    figure = Figure(figsize=(10.0, 6.0), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    candidates = run.candidates
    placed = [record for record in candidates if record.get("status") in (MEASURED, MISSED_GATE) and _placed(record)]
    flags = [_Simulated(bool(_tune_figures(record).get("simulated"))) for record in placed]
    axes.set_title(simulated_title(f"Tuning run {run.name}: weighted score against TTFT p99, "
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
        legend(axes, handles)
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
    """What simulated_title counts of a point."""

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
            "score": marked(f"{score:.0f}", simulated) if score is not None else "",
            "ttft": marked(f"{ttft:.1f} ms", simulated) if ttft is not None else "",
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
