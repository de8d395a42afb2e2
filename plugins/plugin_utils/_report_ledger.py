# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's rows and table cells, from a fleet's deployment ledger. Controller side only.

The ledger holds one JSON line per host per run; a line of a run with the gates carries `bench`
(the engine_bench action's figures: weighted score, token rates, TTFT/TPOT/ITL/E2E percentiles,
the throughput gate) and `quality` (the engine_quality action's score, its baseline and
deviation, the ±bound). rows(lines) makes one row per release and host, releases in the order
they first appear in the ledger, each figure taken from the last line of that release and host
that has it (a verify run adds lines without figures; they must not blank the deploy's).
gate_cells formats a row's verdicts for the report's page (_figure_cells.py its figures, for
LEDGER.md too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ansible_collections.biv100.serving.plugins.plugin_utils import _json_lines as json_lines
from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import figures_of, marked, number


class ReportError(ValueError):
    """A ledger that cannot be drawn, or a controller that cannot draw; the message says which."""


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
        if figures_of(line.get("bench")):
            row.bench = line["bench"]
        if figures_of(line.get("quality")):
            row.quality = line["quality"]
        # After a rollback the probes ran again on the release the host went back to: they say
        # nothing about the one it left.
        if line.get("probes") and not went_back:
            row.probes = str(line["probes"])
            row.failed_probes = list(line.get("failed_probes") or [])
    order = {release: index for index, release in enumerate(releases)}
    # dicts keep insertion order, so hosts stay in order of first appearance within a release.
    return sorted(found.values(), key=lambda row: order[row.release])


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
        verdicts.append(("quality", _passed(row.quality.get("passed")), marked(why, row.quality.get("simulated"))))
    if row.bench:
        gate = row.bench.get("gate") if isinstance(row.bench.get("gate"), dict) else {}
        minimum = number(gate.get("score"))
        why = f"score {number(row.bench['score']):.0f}" + (f", gate ≥ {minimum:g}" if minimum is not None else "")
        verdicts.append(("throughput", _passed(gate.get("passed")), marked(why, row.bench.get("simulated"))))
    return verdicts


def _passed(value) -> bool | None:
    return value if isinstance(value, bool) else None
