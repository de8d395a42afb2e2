"""The table of how often the canary analysis and the tuner are wrong (docs/benchmarks.md, "How
often the canary and the tuner are wrong"): tests/shared/verdict_errors.py's simulation at the analysis' default
settings, or at settings given on the command line to compare them (the tuner's row keeps its
own).

    python benchmarks/verdict_errors.py [--runs 1000] [--seed 0] [--set trials_before=2 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "collections"), str(REPO / "tests" / "lab"), str(REPO / "tests" / "shared")]

import verdict_errors  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="simulated analyses per case and noise level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                        help="an analysis setting in place of its default (trials, trials_before, max_trials, "
                             "margin, request_margin, thresholds)")
    args = parser.parse_args()
    settings = {}
    for item in args.set:
        name, _sep, value = item.partition("=")
        settings[name] = json.loads(value)
    started = time.monotonic()
    found = verdict_errors.table(settings, args.runs, args.seed)
    noises = verdict_errors.NOISES
    print(f"{args.runs} simulated analyses a cell, seed {args.seed}, settings "
          f"{json.dumps({**verdict_errors.SETTINGS, **settings}, sort_keys=True)}")
    print("| case | " + " | ".join(f"noise {100 * noise:g} %" for noise in noises) + " |")
    print("| --- |" + " --- |" * len(noises))
    for case, cells in found.items():
        print(f"| {case} | " + " | ".join(f"{100 * cells[noise]['stops']:.1f} % ({cells[noise]['trials']:.1f} trials)"
                                          for noise in noises) + " |")
    print("| tuner proposes a setting more than 2 % below the best | "
          + " | ".join(f"{100 * verdict_errors.tuner_error_rate(noise, args.runs, args.seed):.1f} %" for noise in noises)
          + " |")
    print("(a release N % slower moves the score by "
          + ", ".join(f"{verdict_errors.score_shift(1 - slower):+.1f} %" for slower in verdict_errors.SLOWER)
          + f"; {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
