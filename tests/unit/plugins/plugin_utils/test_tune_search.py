"""The tuning search's plan: the memory step-down, the grid or successive halving within the
budget, survivors picked among the eligible only, the incumbent in every round, resumption, and
the Pareto front of score and TTFT p99."""

from __future__ import annotations

import textwrap

import pytest
from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS, SUB168

from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import candidate_record
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_search import (
    halving_rounds,
    memory_choice,
    memory_steps,
    next_round,
    pareto_front,
    pending,
    ranked,
    search_rounds,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import (
    TuneSpaceError,
    candidates,
    load_space,
    make_candidate,
    screen_candidates,
)

INCUMBENT = {"engine_args": dict(SUB168), "engine_allocator": dict(DEFAULT_ALLOCATOR_OPTIONS), "engine_env": {}}


def write_space(tmp_path, text):
    path = tmp_path / "space.yml"
    path.write_text(textwrap.dedent(text))
    return load_space(str(path))


def grid(count: int) -> list[dict]:
    """The incumbent and count - 1 other candidates."""
    return [make_candidate(INCUMBENT, incumbent=True)] + [
        make_candidate({**INCUMBENT, "engine_env": {"N": str(number)}}) for number in range(1, count)]


def measured(candidate_id: str, round_: dict, score: float, status: str = "measured", ttft: float = 100.0):
    candidate = {"id": candidate_id, "incumbent": candidate_id == round_.get("incumbent")}
    figures = {"score": score, "ttft_p99_ms": ttft}
    extra = {"gates": ["score 10 < 8000"]} if status == "missed_gate" else {}
    if status == "failed_to_start":
        extra, figures = {"log_tail": "CUDA out of memory"}, None
    return candidate_record(candidate, status, round_number=round_["round"], factor=round_["factor"],
                            figures=figures, **extra)


def cost(rounds) -> float:
    return sum(len(round_["ids"]) * round_["factor"] for round_ in rounds)


# ---- memory first ---------------------------------------------------------------------------

def test_the_memory_step_down_starts_the_largest_candidate_from_the_top(tmp_path):
    space = load_space("default")
    steps = memory_steps(space, INCUMBENT)
    assert [step["engine_args"]["gpu_memory_utilization"] for step in steps] == [0.95, 0.9, 0.85, 0.8]
    assert all(step["engine_args"] == {**SUB168, "max_num_seqs": 8, "max_num_batched_tokens": 8192,
                                       "gpu_memory_utilization": step["engine_args"]["gpu_memory_utilization"]}
               and step["engine_allocator"] == {**DEFAULT_ALLOCATOR_OPTIONS, "expandable_segments": True}
               for step in steps)
    assert len({step["id"] for step in steps}) == 4
    # Without a start, from the space's highest value; the floor is kept when a step lands on it.
    space = write_space(tmp_path, """
        name: m
        engine_args: {gpu_memory_utilization: {range: [0.85, 0.95], step: 0.05}}
        budget: {max_candidates: 4, max_minutes: 5}
        memory: {step: 0.1, floor: 0.7}
    """)
    assert [step["engine_args"]["gpu_memory_utilization"] for step in memory_steps(space, INCUMBENT)] == [
        0.95, 0.85, 0.75]


def test_without_a_value_in_the_space_the_step_down_starts_from_the_hosts(tmp_path):
    space = write_space(tmp_path, """
        name: m
        engine_args: {max_num_seqs: [2, 4]}
        budget: {max_candidates: 4, max_minutes: 5}
        memory: {step: 0.05, floor: 0.85}
    """)
    incumbent = {**INCUMBENT, "engine_args": {**SUB168, "gpu_memory_utilization": 0.9}}
    assert [step["engine_args"]["gpu_memory_utilization"] for step in memory_steps(space, incumbent)] == [0.9, 0.85]
    bare = {**INCUMBENT, "engine_args": {key: value for key, value in SUB168.items()
                                         if key != "gpu_memory_utilization"}}
    with pytest.raises(TuneSpaceError, match=r"space.yml: memory: no gpu_memory_utilization to step down from"):
        memory_steps(space, bare)
    low = {**INCUMBENT, "engine_args": {**SUB168, "gpu_memory_utilization": 0.8}}
    with pytest.raises(TuneSpaceError, match=r"space.yml: memory.floor: 0.85 is above the highest "
                                             r"gpu_memory_utilization, 0.8"):
        memory_steps(space, low)
    assert memory_steps({**space, "memory": None}, INCUMBENT) == []


def test_the_search_takes_the_highest_value_that_started():
    space = load_space("default")
    steps = memory_steps(space, INCUMBENT)
    assert memory_choice(steps, [steps[1]["id"], steps[2]["id"]]) == 0.9
    records = {steps[0]["id"]: {"status": "failed_to_start"}, steps[1]["id"]: {"status": "started"}}
    assert memory_choice(steps, records) == 0.9
    assert memory_choice(steps, {steps[0]["id"]: {"status": "failed_to_start"}}) is None
    assert memory_choice(steps, []) is None
    listed = candidates(space, INCUMBENT, memory_choice(steps, records))
    assert {candidate["engine_args"]["gpu_memory_utilization"] for candidate in listed[1:]} == {0.9}


# ---- the plan -------------------------------------------------------------------------------

def test_candidates_that_fit_the_budget_are_the_whole_grid_on_the_full_workload():
    listed = grid(24)
    assert search_rounds(listed, {"max_candidates": 24, "min_factor": 0.25}) == [
        {"round": 1, "factor": 1.0, "size": 24, "keep": 0, "ids": [candidate["id"] for candidate in listed],
         "incumbent": listed[0]["id"]}]


def test_more_candidates_than_the_budget_are_halved_round_by_round():
    listed = grid(30)
    rounds = search_rounds(listed, {"max_candidates": 24, "min_factor": 0.25})
    # Every candidate on a quarter of the workload, then halves, the last two on all of it:
    # 30/4 + 15/4 + 8/4 + 4/2 + 2 = 17.25 full benches.
    assert [(round_["size"], round_["factor"], round_["keep"]) for round_ in rounds] == [
        (30, 0.25, 15), (15, 0.25, 8), (8, 0.25, 4), (4, 0.5, 2), (2, 1.0, 0)]
    assert rounds[0]["ids"] == [candidate["id"] for candidate in listed]
    assert [round_["ids"] for round_ in rounds[1:]] == [None] * 4
    assert all(round_["incumbent"] == listed[0]["id"] for round_ in rounds)


@pytest.mark.parametrize("count", [3, 10, 25, 49, 100, 145, 1000])
@pytest.mark.parametrize("budget", [2, 5, 24, 60])
@pytest.mark.parametrize("min_factor", [0.1, 0.25, 1.0])
def test_the_plan_keeps_to_the_budget(count, budget, min_factor):
    listed = grid(count)
    rounds = search_rounds(listed, {"max_candidates": budget, "min_factor": min_factor})
    assert sum(round_["size"] * round_["factor"] for round_ in rounds) <= budget
    assert rounds[-1]["factor"] == 1.0 and rounds[-1]["keep"] == 0
    assert all(min_factor <= round_["factor"] <= 1 for round_ in rounds)
    assert [round_["keep"] for round_ in rounds[:-1]] == [round_["size"] for round_ in rounds[1:]]
    first = rounds[0]["ids"]
    assert first[0] == listed[0]["id"] and len(first) == rounds[0]["size"] and len(set(first)) == len(first)
    if count > budget:
        assert rounds[-1]["size"] == 2
        # The first round holds every candidate unless even the shortest benches would not fit.
        everyone = halving_rounds(listed, {"max_candidates": 10 ** 6, "min_factor": min_factor})
        assert len(everyone[0]["ids"]) == count
        if sum(round_["size"] * round_["factor"] for round_ in everyone) <= budget:
            assert len(first) == count
        else:
            assert len(first) < count


def test_a_space_too_large_for_the_budget_is_sampled_the_same_way_every_run():
    listed = grid(200)
    rounds = search_rounds(listed, {"max_candidates": 24, "min_factor": 0.25})
    first = rounds[0]["ids"]
    assert 2 < len(first) < 200 and first[0] == listed[0]["id"]
    # The sample is the ids' order (digests: spread over the grid), kept in the grid's order.
    others = sorted(candidate["id"] for candidate in listed[1:])[:len(first) - 1]
    assert set(first[1:]) == set(others)
    assert first[1:] == [candidate["id"] for candidate in listed if candidate["id"] in set(others)]
    # The same sample whatever the order the candidates come in, the incumbent first.
    shuffled = search_rounds(list(reversed(listed)), {"max_candidates": 24, "min_factor": 0.25})[0]["ids"]
    assert shuffled[0] == listed[0]["id"] and set(shuffled) == set(first)


def test_an_id_given_twice_is_refused():
    with pytest.raises(ValueError, match="the candidates hold an id twice"):
        search_rounds(grid(3) + grid(2)[1:], {"max_candidates": 24})


# ---- the rounds -----------------------------------------------------------------------------

def test_survivors_are_the_best_eligible_and_the_incumbent():
    round_ = {"round": 1, "factor": 0.25, "size": 6, "keep": 3, "ids": ["inc", "a", "b", "c", "d", "e"],
              "incumbent": "inc"}
    records = [
        measured("inc", round_, 500, "missed_gate"),  # below the gate, yet the comparison
        measured("a", round_, 900),
        measured("b", round_, 950),
        measured("c", round_, 2000, "missed_gate"),  # the best score, but it missed a gate
        measured("d", round_, 0, "failed_to_start"),
        candidate_record({"id": "z"}, "invalid", problems=["never started"]),
        # A later round's record of a does not change what round 1 measured.
        measured("a", {**round_, "round": 2}, 10),
        # Nor does a record of a candidate that is not in the round.
        measured("x", round_, 5000),
    ]
    assert next_round(records, round_) == ["inc", "b", "a"]
    assert next_round(records, {**round_, "keep": 2}) == ["inc", "b"]
    assert next_round(records, {**round_, "keep": 0}) == []
    # Nothing eligible beside the incumbent: nothing to compare, the search ends.
    assert next_round(records[:1] + records[3:5], round_) == []


def test_an_incumbent_that_failed_to_start_gives_up_its_seat():
    round_ = {"round": 1, "factor": 0.25, "size": 3, "keep": 2, "ids": ["inc", "a", "b"], "incumbent": "inc"}
    records = [measured("inc", round_, 0, "failed_to_start"), measured("a", round_, 1), measured("b", round_, 2)]
    assert next_round(records, round_) == ["b"]


def test_a_resumed_round_runs_only_what_it_has_not_measured():
    round_ = {"round": 2, "factor": 0.5, "size": 3, "keep": 2, "ids": ["inc", "a", "b"], "incumbent": "inc"}
    records = [measured("inc", {**round_, "round": 1}, 1), measured("a", {**round_, "round": 1}, 1),
               measured("b", {**round_, "round": 1}, 1), measured("a", round_, 1)]
    assert pending(round_, records) == ["inc", "b"]
    assert pending({**round_, "round": 1}, records) == []


def search(listed, budget, score_of):
    """A whole search as tune.yml runs it, each candidate's figures from score_of(candidate)."""
    by_id = {candidate["id"]: candidate for candidate in listed}
    rounds = search_rounds(listed, budget)
    ran, records, ids = [], [], rounds[0]["ids"]
    for planned in rounds:
        round_ = {**planned, "ids": ids}
        for candidate_id in ids:
            score, status = score_of(by_id[candidate_id])
            records.append(measured(candidate_id, round_, score, status))
        ran.append(round_)
        ids = next_round(records, round_)
        if not ids:
            break
    return ran, records


def test_a_whole_search_spends_its_budget_on_valid_candidates_and_ends_with_the_incumbent_and_the_best(tmp_path):
    space = write_space(tmp_path, """
        name: s
        engine_args:
          max_num_seqs: [1, 2, 4, 8, 16]
          max_num_batched_tokens: [2048, 4096, 8192]
        engine_allocator:
          expandable_segments: [null, true]
        budget: {max_candidates: 12, max_minutes: 30, min_factor: 0.25}
    """)
    listed = candidates(space, INCUMBENT)
    valid, invalid = screen_candidates(listed, torch_version="2.0.1")
    assert len(listed) == 30 and len(valid) == 15 and len(invalid) == 15

    def score_of(candidate):
        args = candidate["engine_args"]
        if args["max_num_seqs"] == 16:
            return 0, "failed_to_start"  # does not fit in memory
        score = 1000 * args["max_num_seqs"] + args["max_num_batched_tokens"] / 100
        if args["max_num_batched_tokens"] == 2048:
            return score + 10000, "missed_gate"  # the fastest, but its answers fail the quality set
        return score, "measured"

    ran, records = search(valid, space["budget"], score_of)
    assert cost(ran) <= space["budget"]["max_candidates"]
    assert len(ran) > 1  # successive halving: 15 full benches would not fit in 12
    incumbent = listed[0]["id"]
    assert all(round_["ids"][0] == incumbent for round_ in ran)
    assert ran[-1]["factor"] == 1.0 and len(ran[-1]["ids"]) == 2
    best = max((candidate for candidate in valid if score_of(candidate)[1] == "measured"),
               key=lambda candidate: score_of(candidate)[0])
    assert ran[-1]["ids"] == [incumbent, best["id"]]
    assert best["engine_args"]["max_num_seqs"] == 8 and best["engine_args"]["max_num_batched_tokens"] == 8192
    # Nothing invalid ran; nothing that failed to start or missed a gate went on.
    ran_ids = {candidate_id for round_ in ran for candidate_id in round_["ids"]}
    assert not ran_ids & {candidate["id"] for candidate in invalid}
    for earlier, later in zip(ran, ran[1:]):
        for candidate_id in later["ids"][1:]:
            assert next(record for record in records if record["id"] == candidate_id
                        and record["round"] == earlier["round"])["status"] == "measured"
    assert ranked(records)[0]["id"] == best["id"]


# ---- the figures ----------------------------------------------------------------------------

def test_the_pareto_front_is_of_eligible_candidates_by_score_and_ttft():
    round_ = {"round": 1, "factor": 1.0}

    def point(name, score, ttft, status="measured"):
        return measured(name, round_, score, status, ttft)

    records = [point("a", 100, 50), point("b", 120, 60), point("c", 90, 70), point("d", 120, 80),
               point("e", 130, 200), point("f", 200, 10, "missed_gate"), point("g", 100, 50)]
    records.append(candidate_record({"id": "h"}, "measured", figures={"score": 500}))  # no TTFT: not drawn
    assert [record["id"] for record in pareto_front(records)] == ["a", "g", "b", "e"]
    assert [record["id"] for record in pareto_front({record["id"]: record for record in records})] == [
        "a", "g", "b", "e"]
    assert [record["id"] for record in ranked(records)] == ["h", "e", "b", "d", "a", "g", "c"]
