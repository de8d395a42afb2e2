# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What is kept of an engine_bench result, in one table for every place that keeps it: the
results file, the release record (the gates role records the action's `record`), the ledger and
a tuning run's candidates."""

from __future__ import annotations

# The figures the module measures, as its result gives them.
MEASURED = ("requests", "input_tokens", "output_tokens", "duration_s", "request_tps", "input_tps", "output_tps",
            "total_tps", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "samples", "weights", "score")
# What a record keeps: the figures, the gate they were judged against, whether they are the lab's
# simulated ones, and the workload's summary.
KEPT = (*MEASURED, "gate", "simulated", "workload")
# The per-request samples: a release record keeps them (a later canary without a host to compare
# with is judged against them); a ledger line, one per host per run, does not.
PER_REQUEST = ("samples",)
# The headline figures, each with where it is in a kept record: deltas against another release
# compare them, a tuning candidate's record keeps them.
HEADLINE = (
    ("score", ("score",)),
    ("output_tps", ("output_tps",)),
    ("input_tps", ("input_tps",)),
    ("ttft_p99_ms", ("ttft_ms", "p99")),
    ("tpot_p99_ms", ("tpot_ms", "p99")),
)


def kept(result: dict, per_request: bool = True) -> dict:
    """The kept keys of a bench result (or results file) that it has."""
    return {key: result[key] for key in KEPT if key in result and (per_request or key not in PER_REQUEST)}


def figure(figures: dict, path: tuple) -> float | None:
    """The number at `path` in a record's figures, or None where there is none."""
    value = figures
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
