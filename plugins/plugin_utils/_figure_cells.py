# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gates' headline figures as a table cell shows them, for LEDGER.md, the report's page and
the submission's README alike: blank when absent, marked (sim) when the lab's stand-in
produced them.

Controller side only: standard library.
"""

from __future__ import annotations

SIM = "(sim)"


def number(value) -> float | None:
    """value as a float when it is a number (a bool is not one), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def figures_of(value) -> dict | None:
    """A bench or quality record that has its score, else None (an absent or broken one)."""
    return value if isinstance(value, dict) and number(value.get("score")) is not None else None


def marked(text: str, simulated) -> str:
    return f"{text} {SIM}" if simulated else text


def figure_cells(bench, quality) -> tuple[str, str, str, str]:
    """score, output tok/s, TTFT p99 and quality as a table shows them: blank when absent,
    marked (sim) when simulated. LEDGER.md and the report's page share them."""
    score = output = ttft = shown_quality = ""
    bench = figures_of(bench)
    if bench:
        simulated = bench.get("simulated")
        score = marked(f"{number(bench['score']):.0f}", simulated)
        if number(bench.get("output_tps")) is not None:
            output = marked(f"{number(bench['output_tps']):.1f}", simulated)
        p99 = number((bench.get("ttft_ms") or {}).get("p99")) if isinstance(bench.get("ttft_ms"), dict) else None
        if p99 is not None:
            ttft = marked(f"{p99:.1f} ms", simulated)
    quality = figures_of(quality)
    if quality:
        text = f"{number(quality['score']):.3f}"
        deviation = number(quality.get("deviation"))
        if deviation is not None:
            text += f", {100 * deviation:+.1f} %"
        shown_quality = marked(text, quality.get("simulated"))
    return score, output, ttft, shown_quality
