# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The objective every verdict is about, the same for the gates, the canary and the tuner: the
competition's weighted token score at the offered load the bench file fixes, under a latency
limit. Controller side only.

- The offered load is the bench workload's `concurrency` (files/bench): as many requests in
  flight on every side, whatever the release's max_num_seqs, so that no release chooses the load
  it is measured at.
- The latency limit is the throughput gate's `latency` bound (serving_gates.throughput.latency),
  per figure of vLLM's serving benchmark: `ttft_p99_ms` and `tpot_p99_ms`, each a number of
  milliseconds or a factor of the incumbent's figure written `1.5x`. The incumbent is the last
  good release's recorded bench on the same engine instance, which the gates already compare with
  (and which a tuning run's candidates are measured against: the host's current release). A
  factor with no incumbent figure to scale is not applied, and the verdict says so.
- The competition has no latency limit (it scores throughput alone): left out, the score alone
  is the objective, and every line that states the objective says so.

The throughput gate holds a release to all of it (engine_bench's verdict); the tuner ranks only
candidates that cleared it; the canary judges the score, and a release's latencies against its
baseline's.
"""

from __future__ import annotations

import math

# The figures a limit may name, as vLLM's serving benchmark reports them, and how a line names them.
LIMITED = {"ttft_p99_ms": "TTFT p99", "tpot_p99_ms": "TPOT p99"}
FACTOR_SUFFIX = "x"


def latency_problems(latency) -> list[str]:
    """What is wrong with a throughput gate's `latency` bound, one sentence each naming it."""
    if latency is None:
        return []
    if not isinstance(latency, dict):
        return [f"serving_gates.throughput.latency must be a map of {' and '.join(LIMITED)} to a limit, "
                f"not {latency!r}"]
    problems = [f"serving_gates.throughput.latency.{name} is not a figure a limit may name (one of "
                f"{', '.join(LIMITED)})" for name in latency if name not in LIMITED]
    for name, given in latency.items():
        if name in LIMITED and given is not None and parse_limit(given) is None:
            problems.append(f"serving_gates.throughput.latency.{name} must be milliseconds (such as 250) or a "
                            f"factor of the incumbent's (such as 1.5x), not {given!r}")
    return problems


def parse_limit(given) -> tuple[str, float] | None:
    """("ms", 250.0) or ("factor", 1.5) from a limit as written; None when it is neither."""
    if isinstance(given, bool):
        return None
    if isinstance(given, (int, float)):
        return ("ms", float(given)) if math.isfinite(given) and given > 0 else None
    text = str(given).strip().lower()
    kind = "factor" if text.endswith(FACTOR_SUFFIX) else "ms"
    try:
        value = float(text[:-1] if kind == "factor" else text)
    except ValueError:
        return None
    return (kind, value) if math.isfinite(value) and value > 0 else None


def resolved_limits(latency, incumbent: dict | None = None, release: str | None = None) -> list[dict]:
    """Each limit with its milliseconds: {figure, limit_ms (None when a factor has nothing to
    scale), given, basis (where a factor's milliseconds come from)}."""
    limits = []
    for name, given in (latency or {}).items():
        parsed = parse_limit(given) if name in LIMITED else None
        if parsed is None:
            continue
        kind, value = parsed
        if kind == "ms":
            limits.append({"figure": name, "limit_ms": value, "given": given, "basis": None})
            continue
        reference = (incumbent or {}).get(name)
        usable = isinstance(reference, (int, float)) and not isinstance(reference, bool) and reference > 0
        limits.append({"figure": name, "limit_ms": value * reference if usable else None, "given": given,
                       "basis": (f"{value:g}x {release or 'the incumbent'}'s {reference:.1f} ms" if usable
                                 else f"{value:g}x the incumbent's, which recorded none")})
    return limits


def held(figures: dict, limits: list[dict]) -> dict:
    """Whether `figures` keep every limit: {passed, checks: [{figure, value, limit_ms, passed}],
    breaches: [line], unapplied: [line]}."""
    checks, breaches, unapplied = [], [], []
    for limit in limits:
        name, label = limit["figure"], LIMITED[limit["figure"]]
        if limit["limit_ms"] is None:
            unapplied.append(f"{label} limit {limit['given']} not applied: {limit['basis']}")
            continue
        value = figures.get(name)
        kept = isinstance(value, (int, float)) and value <= limit["limit_ms"]
        checks.append({"figure": name, "value": value, "limit_ms": limit["limit_ms"], "passed": kept})
        if not kept:
            shown = f"{value:.1f} ms" if isinstance(value, (int, float)) else "not measured"
            basis = f" ({limit['basis']})" if limit["basis"] else ""
            breaches.append(f"{label} {shown} > {limit['limit_ms']:.1f} ms{basis}")
    return {"passed": not breaches, "checks": checks, "breaches": breaches, "unapplied": unapplied}


def describe(latency=None, concurrency=None) -> str:
    """`the weighted score at 8 requests in flight, TTFT p99 <= 1.5x the incumbent's`: the
    objective in words, for the lines that state what was judged."""
    load = f" at {concurrency} requests in flight" if concurrency else " at the bench's offered load"
    return f"the weighted score{load}, {limits_text(latency)}"


def limits_text(latency=None) -> str:
    """`TTFT p99 <= 300 ms, TPOT p99 <= 1.5x the incumbent's`, or `no latency limit`."""
    limits = []
    for name, label in LIMITED.items():
        given = (latency or {}).get(name)
        parsed = parse_limit(given) if given is not None else None
        if parsed:
            kind, value = parsed
            limits.append(f"{label} <= {value:g} ms" if kind == "ms" else f"{label} <= {value:g}x the incumbent's")
    return ", ".join(limits) if limits else "no latency limit"
