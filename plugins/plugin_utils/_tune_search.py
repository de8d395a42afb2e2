# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The plan of a tuning search, decided from a space (_tune_space.py) and the records of what ran
(_tune_results.py). Controller side only; nothing here starts an engine.

Memory first, as vLLM's auto_tune does: the candidate that needs the most memory at start-up
(the largest max_num_seqs, max_num_batched_tokens and max_model_len the space holds) is started
at gpu_memory_utilization stepping down from the highest value until one starts
(memory_steps); the search then uses the highest value that started (memory_choice, passed to
_tune_space.candidates). These starts are not benched and spend nothing of max_candidates.

Then the rounds (search_rounds), over the valid candidates only (an invalid one is never
started), the incumbent first:

- the whole grid in one round, each candidate on the full workload, when the candidates fit in
  budget.max_candidates;
- else successive halving: every candidate on a short bench, the better half (by score, among
  those that cleared every gate) on a longer one, and so on until the last round, which holds
  the incumbent and the best other. A round's factor is its bench length as a fraction of the
  workload (its requests, or its duration): round r of R runs max(min_factor, 2^(r - R)), the
  last one the full workload. The benches of all rounds add up to at most max_candidates full
  ones; when that is too little for every candidate even on the shortest benches, the first
  round holds as many as fit: the incumbent and a sample of the others in the order of their
  ids (which are digests: a spread over the grid that is the same in every run).

A round is {"round": n, "factor": f, "size": most candidates it runs, "keep": the next round's
size (0 after the last), "ids": the candidates (round 1; next_round picks the others'),
"incumbent": its id}. The incumbent is in every round, first, unless it failed to start; a
candidate that failed to start or missed a gate never goes on to the next round.

Last the final trials (final_schedule): each finalist and the incumbent benched `trials` times
on the whole workload, trial n of every one of them in block n, in an order drawn for the block
from the run's name. Trial n of a finalist and trial n of the incumbent then share their window
(a host's drift over the trials is in both sides of a pair alike), and no side is always the
first after an engine start or the last of a block. The order is the same when the run is
resumed, and a trial whose results file is written is not run again.

The wall-clock budget (budget.max_minutes) is the playbook's to keep: the plan bounds the bench
time, and an engine start on a real host may take longer than the bench.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction

from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import FAILED_TO_START, INVALID, MEASURED, STARTED
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import (
    DEFAULT_MIN_FACTOR,
    MEMORY_KEY,
    TuneSpaceError,
    largest_candidate,
)

# The last round of successive halving: the incumbent and the best other.
FINAL_SIZE = 2


def memory_steps(space: dict, incumbent: dict) -> list[dict]:
    """The starts of the memory step-down, highest gpu_memory_utilization first: the largest
    candidate at each value from memory.start (default the space's highest
    gpu_memory_utilization, else the incumbent's) down by memory.step to memory.floor. [] for a
    space without memory."""
    memory = space.get("memory")
    if not memory:
        return []
    start = memory.get("start")
    if start is None:
        listed = [value for value in space["engine_args"].get(MEMORY_KEY, []) if _is_number(value)]
        start = max(listed) if listed else (incumbent.get("engine_args") or {}).get(MEMORY_KEY)
    if not _is_number(start):
        raise TuneSpaceError(f"{space['file']}: memory: no gpu_memory_utilization to step down from: give "
                             "memory.start, or values of engine_args.gpu_memory_utilization")
    if start < memory["floor"]:
        raise TuneSpaceError(f"{space['file']}: memory.floor: {memory['floor']} is above the highest "
                             f"gpu_memory_utilization, {start}")
    value, step, floor = Decimal(str(start)), Decimal(str(memory["step"])), Decimal(str(memory["floor"]))
    steps = []
    while value >= floor:
        steps.append(largest_candidate(space, incumbent, float(value)))
        value -= step
    return steps


def memory_choice(steps: list[dict], started) -> float | None:
    """The highest gpu_memory_utilization of the steps that started; None when none did.

    started is {id: record} (memory.jsonl read with read_candidates: those of status `started`)
    or the ids that started.
    """
    if isinstance(started, dict):
        ids = {key for key, record in started.items() if (record or {}).get("status") == STARTED}
    else:
        ids = set(started)
    values = [step["engine_args"][MEMORY_KEY] for step in steps if step["id"] in ids]
    return max(values) if values else None


def search_rounds(candidates: list[dict], budget: dict) -> list[dict]:
    """The rounds of the search over the valid candidates (the incumbent first): the grid when
    they fit in budget.max_candidates, else successive halving (halving_rounds)."""
    ids = _ids(candidates)
    if len(ids) <= budget["max_candidates"]:
        return [{"round": 1, "factor": 1.0, "size": len(ids), "keep": 0, "ids": ids,
                 "incumbent": _incumbent(candidates)}]
    return halving_rounds(candidates, budget)


def halving_rounds(candidates: list[dict], budget: dict) -> list[dict]:
    """Successive halving over as many of the candidates as the budget lets the first round hold
    (all of them when it can): each round holds half of the one before, at least FINAL_SIZE; the
    last runs the full workload and each before it half as much, none less than min_factor."""
    ids = _ids(candidates)
    incumbent = _incumbent(candidates)
    sizes, factors = _affordable(len(ids), budget)
    chosen = set(_sample(ids, incumbent, sizes[0] if sizes else 0))
    return [{"round": number, "factor": float(factor), "size": size,
             "keep": sizes[number] if number < len(sizes) else 0,
             "ids": [key for key in ids if key in chosen] if number == 1 else None,
             "incumbent": incumbent}
            for number, (size, factor) in enumerate(zip(sizes, factors), 1)]


def _affordable(count: int, budget: dict) -> tuple[list[int], list[Fraction]]:
    """The sizes and factors of the rounds of the most candidates, up to count, whose benches add
    up to no more than budget.max_candidates full ones."""
    minimum = Fraction(str(budget.get("min_factor", DEFAULT_MIN_FACTOR)))
    for first in range(count, 0, -1):
        sizes = _halving_sizes(first)
        factors = [max(minimum, Fraction(1, 2 ** (len(sizes) - number))) for number in range(1, len(sizes) + 1)]
        if sum(size * factor for size, factor in zip(sizes, factors)) <= budget["max_candidates"]:
            return sizes, factors
    return [], []


def _halving_sizes(first: int) -> list[int]:
    sizes = [first]
    while sizes[-1] > FINAL_SIZE:
        sizes.append(max(FINAL_SIZE, math.ceil(sizes[-1] / 2)))
    return sizes


def _sample(ids: list[str], incumbent: str | None, count: int) -> list[str]:
    others = sorted(key for key in ids if key != incumbent)
    return ([incumbent] if incumbent is not None else []) + others[:count - (incumbent is not None)]


def _ids(candidates: list[dict]) -> list[str]:
    """The candidates' ids in their order, the incumbent's first."""
    ids = [candidate["id"] for candidate in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("the candidates hold an id twice: give each setting once (_tune_space.candidates)")
    incumbent = _incumbent(candidates)
    return ids if incumbent is None else [incumbent] + [key for key in ids if key != incumbent]


def _incumbent(candidates: list[dict]) -> str | None:
    return next((candidate["id"] for candidate in candidates if candidate.get("incumbent")), None)


def next_round(results, round_: dict) -> list[str]:
    """The ids of the round after round_, picked from its records: the incumbent first (unless
    it failed to start), then the eligible others - measured in this round and cleared every
    gate - best score first, as many as the next round holds. [] after the last round, or when
    no other is eligible: nothing is left to compare with the incumbent.

    results are the records of the run (read_records; or read_candidates' mapping, where a
    record of a later round hides this round's).
    """
    if not round_["keep"]:
        return []
    number, incumbent = round_["round"], round_.get("incumbent")
    members = set(round_["ids"] or ())
    latest = {record["id"]: record for record in _records(results)
              if record.get("round") == number and record["id"] in members}
    seats = round_["keep"] - (incumbent is not None)
    challengers = [record["id"] for record in ranked(latest.values()) if record["id"] != incumbent][:seats]
    if not challengers:
        return []
    incumbent_record = latest.get(incumbent) or {}
    keep_incumbent = incumbent is not None and incumbent_record.get("status") not in (FAILED_TO_START, INVALID)
    return ([incumbent] if keep_incumbent else []) + challengers


def pending(round_: dict, results) -> list[str]:
    """The ids of the round that have no record of it yet: what a resumed run still runs."""
    done = {record["id"] for record in _records(results) if record.get("round") == round_["round"]}
    return [key for key in round_["ids"] or () if key not in done]


def ranked(records) -> list[dict]:
    """The eligible records (measured: every gate cleared, a score), best score first, ties by id."""
    eligible = [record for record in _records(records) if _eligible(record)]
    return sorted(eligible, key=lambda record: (-record["figures"]["score"], record["id"]))


def pareto_front(records) -> list[dict]:
    """The eligible records no other eligible one beats on both score (higher) and TTFT p99
    (lower), by TTFT p99; give one record per candidate (read_candidates' values)."""
    points = [record for record in _records(records)
              if _eligible(record) and _is_number(record["figures"].get("ttft_p99_ms"))]

    def beaten(record):
        score, ttft = record["figures"]["score"], record["figures"]["ttft_p99_ms"]
        return any(other["figures"]["score"] >= score and other["figures"]["ttft_p99_ms"] <= ttft
                   and (other["figures"]["score"] > score or other["figures"]["ttft_p99_ms"] < ttft)
                   for other in points)

    return sorted((record for record in points if not beaten(record)),
                  key=lambda record: (record["figures"]["ttft_p99_ms"], -record["figures"]["score"], record["id"]))


def _eligible(record: dict) -> bool:
    return record.get("status") == MEASURED and _is_number((record.get("figures") or {}).get("score"))


def _records(results) -> list[dict]:
    return list(results.values()) if isinstance(results, dict) else list(results)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def final_schedule(measure: list[dict], trials: int, run: str, done=frozenset()) -> list[dict]:
    """[{"candidate": one of `measure`, "trial": n}] of the final trials still to run: trials
    1 to `trials` of each, block by block, each block in an order drawn from `run` and n (the
    same in every resumption); `done` holds the (id, n) whose results are written."""
    schedule = []
    for trial in range(1, trials + 1):
        block = list(measure)
        random.Random(f"{run}/{trial}").shuffle(block)
        schedule += [{"candidate": candidate, "trial": trial} for candidate in block
                     if (candidate["id"], trial) not in done]
    return schedule
