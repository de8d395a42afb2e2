# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The iterations of a fleet's ledger: per release, what it changed from its source to its place in
the vendor's base, the verdicts it got here and on the platform, and the checks that prove each fix.

A release's ledger lines carry `changes` (what serving_release recorded against the last good
release, one row per change with its mapping), `failure_points` (the manifest's fixed failure
points with their checks), `failed_probes` and `guard` (what the deploy proved), `canary`, and,
from record_verdict.yml, `platform`. iterations(lines) gathers them per release, newest first;
iteration_section renders one for LEDGER.md, its changes as the table the product brief draws
(source, place in the base, kind of change; brief_rows) with what changed and the checks, each
marked by what the release's last run proved. The submission bundle's README draws the same
table; verdicts(ledgers) gives the report each release's verdicts in several fleets and on the
platform.

Controller side only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import measured_release

GUARD = "guard"
COLUMNS = ("source", "place in the base", "kind of change", "what changed", "proven by")
# How a check shows: passed in the release's last run, failed, or not run there.
PASSED, FAILED, NOT_RUN = "✓", "✗", "·"
NO_SOURCE = "(no mapping declared)"


@dataclass
class Iteration:
    """One release as the fleet's ledger last saw it."""

    release: str
    states: dict = field(default_factory=dict)  # host -> state
    canary: str | None = None
    platform: dict | None = None
    changes: list = field(default_factory=list)  # each row with `hosts` when not every host's
    failure_points: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # check name -> True, False or None (not run)


def iterations(lines: list[dict]) -> list[Iteration]:
    """One Iteration per release that recorded changes, failure points or a platform verdict,
    newest first (by the ledger line that first names it)."""
    return [item for item in reversed(gathered(lines)) if release_shown(item)]


def gathered(lines: list[dict]) -> list[Iteration]:
    """One Iteration per release the ledger names, oldest first."""
    found: dict[str, Iteration] = {}
    rows_by_host: dict[str, dict[str, list]] = {}
    proofs: dict[str, dict[str, dict]] = {}  # release -> host -> what its last run there proved
    for line in lines:
        release, host = measured_release(line), str(line.get("host") or "")
        if release is None:
            continue
        item = found.setdefault(release, Iteration(release))
        went_back = line.get("release") != release
        item.states[host] = (f"rolled back to {line['rollback'].get('to') or 'base'}" if went_back
                             else str(line.get("state") or "pending"))
        if isinstance(line.get("changes"), list):
            rows_by_host.setdefault(release, {})[host] = line["changes"]
        if line.get("failure_points"):
            item.failure_points = list(line["failure_points"])
        if isinstance(line.get("canary"), dict):
            item.canary = str(line["canary"].get("verdict"))
        if isinstance(line.get("platform"), dict):
            item.platform = line["platform"]
        # After a rollback the probes ran on the release the host went back to; the guard's
        # finding is still of the release that was staged.
        if line.get("probes") or line.get("guard"):
            proofs.setdefault(release, {})[host] = {
                "probed": bool(line.get("probes")) and not went_back,
                "failed": {str(name) for name in line.get("failed_probes") or ()},
                "guard": str(line["guard"]) if line.get("guard") else None}
    for release, item in found.items():
        item.changes = union_by_host(rows_by_host.get(release, {}))
        item.checks = _checks(item, list(proofs.get(release, {}).values()))
    return list(found.values())


def release_shown(item: Iteration) -> bool:
    return bool(item.changes or item.platform or item.failure_points)


def _checks(item: Iteration, proofs: list[dict]) -> dict:
    """Each check the release names: passed when every host's last run of it passed (a probe
    ran and was not among the failed; the guard found nothing), failed when one did not, None
    when none ran it."""
    named = {name for point in item.failure_points for name in point.get("proven_by") or ()}
    named |= {name for row in item.changes for name in row.get("proven_by") or ()}
    checks = {}
    for name in sorted(named):
        if name == GUARD:
            found = [not proof["guard"].startswith("FAILED") for proof in proofs if proof["guard"]]
        else:
            found = [name not in proof["failed"] for proof in proofs if proof["probed"]]
        checks[name] = all(found) if found else None
    return checks


def union_by_host(by_host: dict[str, list]) -> list[dict]:
    """The rows of every host, once each in first-seen order; a row not every host recorded names
    the hosts that did (a host new to the fleet changed more than the others)."""
    seen: dict[tuple, dict] = {}
    for host, rows in by_host.items():
        for row in rows:
            if not isinstance(row, dict):
                continue
            key = tuple(str(row.get(name) or "") for name in ("source", "place", "change", "what"))
            seen.setdefault(key, dict(row, hosts=[]))["hosts"].append(host)
    every = set(by_host)
    return [dict(row, hosts=row["hosts"] if set(row["hosts"]) != every else []) for row in seen.values()]


def check_marks(names, checks: dict) -> str:
    """`n-two ✓, guard ·`: each check with what the release's last run proved of it."""
    marks = {True: PASSED, False: FAILED, None: NOT_RUN}
    return ", ".join(f"{name} {marks[checks.get(name)]}" for name in names or ())


def brief_rows(changes: list[dict], checks: dict | None = None) -> list[list[str]]:
    """The cells of the brief's table, one row per change."""
    rows = []
    for change in changes:
        what = str(change.get("what") or "")
        if change.get("hosts"):
            what += f" (on {', '.join(change['hosts'])})"
        rows.append([str(change.get("source") or NO_SOURCE), str(change.get("place") or ""),
                     str(change.get("change") or ""), what,
                     check_marks(change.get("proven_by"), checks or {}) if checks is not None
                     else ", ".join(change.get("proven_by") or ())])
    return rows


def verdicts_line(item: Iteration) -> str:
    """`lab-h1 good, lab-h2 good; canary pass; platform failed: n=3 cascaded into OOM`."""
    parts = [", ".join(f"{host} {state}" for host, state in item.states.items())]
    if item.canary:
        parts.append(f"canary {item.canary}")
    if item.platform:
        said = item.platform
        reason = f": {said['reason']}" if said.get("reason") else ""
        figures = ", ".join(f"{key} {value}" for key, value in sorted((said.get("figures") or {}).items()))
        parts.append(f"platform {said.get('verdict')}{reason}" + (f" ({figures})" if figures else ""))
    else:
        parts.append("platform: no verdict recorded")
    return "; ".join(part for part in parts if part)


def markdown_table(columns, rows) -> list[str]:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    return (["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
            + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows])


def iteration_section(item: Iteration) -> list[str]:
    """A release's part of LEDGER.md: its verdicts, the brief's table, the failure points."""
    rows = [f"### {item.release}", "", verdicts_line(item), ""]
    if item.changes:
        rows += markdown_table(COLUMNS, brief_rows(item.changes, item.checks)) + [""]
    else:
        rows += ["No change against the last good release.", ""]
    if item.failure_points:
        rows += ["Fixed failure points:", ""]
        rows += [f"- {point.get('failure')}: {check_marks(point.get('proven_by'), item.checks)}"
                 for point in item.failure_points] + [""]
    return rows


# --- the report's verdicts ------------------------------------------------------------------------


@dataclass
class Verdicts:
    """One release's verdicts: per fleet (its ledger), the hosts' states; the platform's last."""

    release: str
    fleets: dict  # fleet name -> "good ×4, rolled back to sub510 ×1" or ""
    platform: str
    disagree: bool


def verdicts(ledgers: dict[str, list[dict]]) -> list[Verdicts]:
    """Per release of any of the fleets' ledgers (fleet name -> its lines), newest first by the
    first ledger's order then the others': each fleet's verdict and the platform's last. A release
    disagrees when the platform failed it and a fleet found it good, or passed it and a fleet did
    not keep it."""
    found: dict[str, dict[str, Iteration]] = {}
    for name, lines in ledgers.items():
        for item in gathered(lines):
            found.setdefault(item.release, {})[name] = item
    shown = []
    for release, by_fleet in found.items():
        platform = next((item.platform for item in by_fleet.values() if item.platform), None)
        states = {name: list(item.states.values()) for name, item in by_fleet.items()}
        good = any("good" in values for values in states.values())
        not_kept = any(values and "good" not in values for values in states.values())
        verdict = (platform or {}).get("verdict")
        said = "" if not platform else f"{verdict}" + (f": {platform['reason']}" if platform.get("reason") else "")
        shown.append(Verdicts(release, {name: _counted(states.get(name, [])) for name in ledgers}, said,
                              (verdict == "failed" and good) or (verdict == "passed" and not_kept)))
    return list(reversed(shown))


def _counted(states: list[str]) -> str:
    counts = {state: states.count(state) for state in states}
    return ", ".join(f"{state} ×{count}" for state, count in counts.items())
