# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gate_verdicts: whether a release clears each of the competition's gates, one verdict each.

Which gates apply and their bounds are the caller's: the gates role passes serving_gates over
serving_competition, the one definition of the competition, in the serving role's defaults."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._objective import latency_problems

FUNCTIONAL = "functional"
MEASURED_GATES = ("quality", "throughput")


def gate_problems(gates, competition: dict | None = None) -> list[str]:
    """What is wrong with the gates' settings (serving_gates over the competition's), one sentence
    each naming the variable: checked before any host changes. With `competition`, each gate is
    checked with the competition's bounds under its own, as the gates role will hold it (a group
    may leave a bound out: serving_gates {functional: {}} is held to the competition's min_probes)."""
    if not isinstance(gates, dict):
        return [f"serving_gates must be a map from each gate that applies to its bounds, not {gates!r}"]
    if competition:
        gates = {name: {**(competition.get(name) or {}), **bounds} if isinstance(bounds, dict) else bounds
                 for name, bounds in gates.items()}
    problems = []
    unknown = [name for name in gates if name != FUNCTIONAL and name not in MEASURED_GATES]
    if unknown:
        problems.append(f"serving_gates names no such gate: {', '.join(sorted(unknown))} (serving_competition, in "
                        "the serving role's defaults, names every gate there is)")
    if FUNCTIONAL in gates and "min_probes" not in (gates[FUNCTIONAL] or {}):
        problems.append(f"serving_gates.{FUNCTIONAL}.min_probes is missing: how many probes must pass (the "
                        "serving role's serving_competition has the competition's)")
    throughput = gates.get("throughput") or {}
    if isinstance(throughput, dict):
        problems.extend(latency_problems(throughput.get("latency")))
    return problems


def gate_verdicts(gates: dict, probes: dict | None = None, bench: dict | None = None,
                  quality: dict | None = None) -> list[dict]:
    """One verdict per gate that `gates` names, in its order: {gate, passed, summary}.

    The functional gate is judged here from the probes' verdicts; the others are the verdicts
    their actions reached (the quality set's, the bench's). passed is None when the gate applies
    but was not measured (its task was skipped, as with `--skip-tags bench`): a gate not measured
    neither passes nor fails a release.
    """
    measured = {"quality": quality, "throughput": bench}
    problems = gate_problems(gates)
    if problems:
        raise ValueError("; ".join(problems))
    return [dict(gate=name, **(_functional(name, bounds or {}, probes) if name == FUNCTIONAL
                               else _measured(measured[name])))
            for name, bounds in gates.items()]


def _ran(result: dict | None) -> bool:
    return bool(result) and not result.get("skipped")


def _functional(name: str, bounds: dict, probes: dict | None) -> dict:
    if not _ran(probes) or "probes" not in probes:
        return {"passed": None, "summary": "not probed"}
    verdicts = probes["probes"]
    passed = sum(1 for verdict in verdicts if verdict.get("passed"))
    needed = int(bounds["min_probes"])
    if passed < len(verdicts):
        return {"passed": False, "summary": probes.get("summary", f"{passed}/{len(verdicts)} probes passed")}
    if passed < needed:
        return {"passed": False, "summary": f"{passed} probes passed, fewer than the {needed} the gate needs"}
    return {"passed": True, "summary": f"{passed}/{len(verdicts)} probes passed (at least {needed})"}


def _measured(result: dict | None) -> dict:
    """The verdict the bench and the quality actions reached themselves, against the bounds the
    playbook gave them."""
    if not _ran(result):
        return {"passed": None, "summary": "not measured"}
    if result.get("failed"):
        return {"passed": False, "summary": str(result.get("msg", "failed"))}
    passed = result["gate"]["passed"] if "gate" in result else result.get("passed")
    return {"passed": bool(passed), "summary": str(result.get("msg", ""))}


def gate_failures(verdicts: list[dict]) -> list[str]:
    """`<gate> gate: <summary>` for each gate a release missed."""
    return [f"{verdict['gate']} gate: {verdict['summary']}" for verdict in verdicts if verdict["passed"] is False]


class FilterModule:
    def filters(self):
        return {"gate_verdicts": gate_verdicts, "gate_failures": gate_failures, "gate_problems": gate_problems}
