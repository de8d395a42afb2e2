# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A host's probe verdicts as one line, for the probe_summary filter and the ledger's lines.

Controller side only: standard library.
"""

from __future__ import annotations


def probe_summary(result: dict | None) -> str:
    """The probe task's result (None when the host was not probed) as one line: how many
    passed, the median and the slowest latency, and the failed probes."""
    if not result or "probes" not in result:
        return "not probed"
    probes = result["probes"]
    latencies = sorted(p["latency_ms"] for p in probes if p.get("latency_ms") is not None)
    timing = ""
    if latencies:
        slowest = max(probes, key=lambda p: p.get("latency_ms") or 0)
        timing = (f", median {latencies[len(latencies) // 2]:.0f} ms, slowest {slowest['name']}"
                  f" {slowest['latency_ms']:.0f} ms")
    failed = [p["name"] for p in probes if not p["passed"]]
    return result["summary"] + timing + (f"; failed: {', '.join(failed)}" if failed else "")
