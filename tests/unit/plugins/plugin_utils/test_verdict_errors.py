"""The canary analysis' defaults meet the error rates they are chosen for, as the seeded simulation
(tests/shared/verdict_errors.py) measures them, and docs/benchmarks.md shows those figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import verdict_errors

DOCS = Path(__file__).resolve().parents[4] / "docs" / "benchmarks.md"
# At run-to-run noise of 2 %, with the defaults: (case, the most or the least it may be).
GOALS = {
    "same release stops": ("at most", 0.02),
    "slower 10 % caught": ("at least", 0.95),
    "host 3 % slower stops": ("at most", 0.02),
}
NOISE = 0.02


@pytest.fixture(scope="module")
def measured():
    cases = {case.name: case for case in verdict_errors.cases()}
    return {name: verdict_errors.stop_rate(cases[name], NOISE) for name in GOALS}


@pytest.mark.parametrize("name", GOALS)
def test_the_defaults_meet_the_goal(measured, name):
    bound, goal = GOALS[name]
    rate = measured[name]["stops"]
    assert rate <= goal if bound == "at most" else rate >= goal, f"{name}: {rate:.3f} against {bound} {goal}"


def test_the_docs_table_shows_the_rates_as_measured(measured):
    table = DOCS.read_text(encoding="utf-8")
    for name, found in measured.items():
        row = re.search(rf"^\| {re.escape(name)} \|(.*)$", table, re.MULTILINE)
        assert row, f"docs/benchmarks.md has no row for {name!r}"
        cells = [cell.strip() for cell in row.group(1).split("|")]
        shown = cells[verdict_errors.NOISES.index(NOISE)]
        assert shown == f"{100 * found['stops']:.1f} % ({found['trials']:.1f} trials)"


def test_without_the_trials_before_the_change_a_slower_host_stops_more_rollouts():
    cases = {case.name: case for case in verdict_errors.cases()}
    with_pairs = verdict_errors.stop_rate(cases["host 3 % slower stops"], 0.03, runs=400)
    without = verdict_errors.stop_rate(cases["host 3 % slower stops, no A/A trials"], 0.03, runs=400)
    assert without["stops"] > with_pairs["stops"]


def test_a_side_at_a_slower_pace_scores_lower_in_every_figure():
    fast, slow = verdict_errors.engine_figures(1.0), verdict_errors.engine_figures(0.9)
    assert slow["score"] < fast["score"] and slow["output_tps"] < fast["output_tps"]
    assert all(slow[name] > fast[name] for name in verdict_errors.LATENCIES)
    # Everything 10 % slower: the prefill, the decode and the steps' cost.
    assert verdict_errors.score_shift(0.9) == pytest.approx(-10.0, abs=0.05)


def test_the_tuner_proposes_the_best_within_two_percent_as_the_docs_say():
    rate = verdict_errors.tuner_error_rate(NOISE)
    assert rate <= 0.05
    row = re.search(r"^\| tuner proposes a setting more than 2 % below the best \|(.*)$", DOCS.read_text(encoding="utf-8"),
                    re.MULTILINE)
    assert row and [cell.strip() for cell in row.group(1).split("|")][verdict_errors.NOISES.index(NOISE)] == \
        f"{100 * rate:.1f} %"


def test_the_tuners_simulation_starts_only_what_the_tuner_would_and_its_best_is_inside_the_space():
    scores = verdict_errors.true_scores()
    assert verdict_errors.INCUMBENT in scores and all(setting[0] >= verdict_errors.PROBE_CHOICES for setting in scores)
    # Eight sequences break the TPOT limit; 8192 batched tokens start only with expandable segments.
    assert all(setting[0] < 8 for setting in scores) and (4, 8192, False) not in scores
    best = max(scores, key=scores.get)
    assert best == (4, 8192, True)
    assert scores[best] > 1.1 * max(score for setting, score in scores.items() if setting != best)
