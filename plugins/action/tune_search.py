# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""biv100.serving.tune_search: the controller's side of tune.yml, one step at a time. The search's
state is on disk, in build/tune/<run>/ (run.json, memory.jsonl, candidates.jsonl, final.json,
proposal.yml): each step reads it and adds to it, so that a run killed at any point is resumed
from what it wrote (-e tune_resume=<run>). No host is contacted; the role starts the engine
and measures, this decides what it starts and keeps what it measured.

- plan: load the space, begin the run (or check that a resumed one is the same host, instance
  and incumbent), and give the starts of the memory step-down still to make.
- round: the candidates of a round still to measure, the invalid ones recorded first (round 1).
- record: append a candidate's (or a memory step's) record and say it in one progress line.
- final: the best eligible candidates, to measure again beside the incumbent.
- propose: judge those repeated trials against the incumbent's (the canary analysis' judge) and
  write proposal.yml.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display

from ansible_collections.biv100.serving.plugins.module_utils._state_store import utc_timestamp
from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.biv100.serving.plugins.plugin_utils._objective import describe
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import SuiteError, load_suites, most_choices
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import inventory_argument, project_root
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_judge import judge_finalists, median_score
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import (
    FAILED_TO_START,
    INVALID,
    MEASURED,
    MISSED_GATE,
    STARTED,
    TuneRecordError,
    append_candidate,
    bench_figures,
    candidate_record,
    changed_settings,
    read_candidates,
    read_records,
    read_trials,
    trials_done,
    write_proposal,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_search import (
    final_schedule,
    memory_choice,
    memory_steps,
    next_round,
    pending,
    ranked,
    search_rounds,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import (
    SECTIONS,
    TuneSpaceError,
    candidates,
    edge_notes,
    incumbent_candidate,
    load_space,
    screen_candidates,
)

display = Display()

STEPS = ("plan", "round", "record", "final", "propose")
RUN_FILE = "run.json"
CANDIDATES_FILE = "candidates.jsonl"
MEMORY_FILE = "memory.jsonl"
FINAL_FILE = "final.json"
PROPOSAL_FILE = "proposal.yml"
# How much of a failed start's log a record keeps.
LOG_TAIL_CHARS = 2000

ARGUMENT_SPEC = {
    "step": {"type": "str", "required": True, "choices": list(STEPS)},
    "run_dir": {"type": "str"},
    # plan
    "run": {"type": "str"},
    "resume": {"type": "str", "default": ""},
    "space": {"type": "str", "default": "default"},
    "host": {"type": "str"},
    "instance": {"type": "str"},
    "release": {"type": "str"},
    "incumbent": {"type": "dict"},
    "facts": {"type": "dict", "default": {}},
    "results_dir": {"type": "path"},
    "probe_suites": {"type": "list", "elements": "str", "default": []},
    # round
    "round": {"type": "int"},
    # record
    "file": {"type": "str", "default": "candidates", "choices": ["candidates", "memory"]},
    "candidate": {"type": "dict"},
    "status": {"type": "str", "choices": [MEASURED, MISSED_GATE, FAILED_TO_START, STARTED]},
    "factor": {"type": "float"},
    "bench": {"type": "dict"},
    "quality": {"type": "dict"},
    "probes": {"type": "dict"},
    "failure": {"type": "str"},
    "log_tail": {"type": "str"},
    # final
    "finalists": {"type": "int", "default": 2},
    "trials": {"type": "int"},
    # propose
    "quality_margin": {"type": "float"},
    "min_gain": {"type": "float", "default": 0.02},
    "latency": {"type": "dict"},
}
# What each step needs besides step (and run_dir, which every step but plan needs).
REQUIRED = {
    "plan": ("run", "host", "instance", "release", "incumbent"),
    "round": ("round",),
    "record": ("candidate", "status"),
    "final": ("trials",),
    "propose": ("trials",),
}


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    # Each step writes the run's records: there is no dry run of a search.
    _supports_check_mode = False

    def act(self, args: dict, task_vars: dict) -> dict:
        result = {}
        step = args["step"]
        missing = [name for name in REQUIRED[step] + (("run_dir",) if step != "plan" else ())
                   if args.get(name) is None]
        if missing:
            raise AnsibleActionFail(f"step {step}: {', '.join(missing)} required")
        self._inventory = inventory_argument((task_vars or {}).get("ansible_inventory_sources"), C.CONFIG_FILE)
        try:
            answer = getattr(self, f"_{step}")(args)
        except (TuneSpaceError, TuneRecordError, ValueError) as error:
            raise AnsibleActionFail(str(error)) from None
        result.update(changed=step in ("record", "propose"), **answer)
        return result

    # --- plan -------------------------------------------------------------------------------

    def _plan(self, args) -> dict:
        for name in ("run", "resume"):
            if args[name] and ("/" in args[name] or args[name].startswith(".")):
                raise AnsibleActionFail(f"{'tune_resume' if name == 'resume' else name} must be a run's "
                                        f"name such as 20261202T120000Z-123456, got {args[name]!r}")
        root = project_root(C.CONFIG_FILE) / (args["results_dir"] or os.path.join("build", "tune"))
        incumbent = incumbent_candidate(args["incumbent"])
        about = {"host": args["host"], "instance": args["instance"], "release": args["release"],
                 "incumbent": incumbent["id"]}
        if args["resume"]:
            run_dir = root / args["resume"]
            state = _read_run(run_dir)
            differs = [f"{key} {state.get(key)} then, {value} now" for key, value in about.items()
                       if state.get(key) != value]
            if differs:
                raise AnsibleActionFail(
                    f"tune_resume={args['resume']}: {run_dir} was a search of another setting ({'; '.join(differs)}): "
                    "its figures would not be this host's; start a new run")
            space = state["space"]
            done = read_candidates(run_dir / CANDIDATES_FILE, warn=display.warning)
            line = (f"{args['host']}: resuming tuning run {args['resume']} over space {space['name']}: "
                    f"{len(done)} candidate(s) already recorded")
        else:
            run_dir = root / args["run"]
            if (run_dir / RUN_FILE).exists():
                raise AnsibleActionFail(f"{run_dir} holds a tuning run already: resume it with -e tune_resume={args['run']}")
            space = load_space(args["space"], self._loader.path_dwim)
            facts = dict(args["facts"])
            if args["probe_suites"]:
                try:
                    facts["probe_choices"] = most_choices(load_suites(args["probe_suites"]))
                except SuiteError as error:
                    raise AnsibleActionFail(f"tune_probe_suites: {error}") from None
            state = {**about, "run": args["run"], "space": space, "facts": facts,
                     "incumbent_settings": {section: incumbent[section] for section in SECTIONS},
                     "started": utc_timestamp()}
            write_atomic(str(run_dir / RUN_FILE), json.dumps(state, indent=1, sort_keys=True) + "\n")
            line = (f"{args['host']}: tuning run {args['run']} over space {space['name']} "
                    f"(at most {space['budget']['max_candidates']} full benches, {space['budget']['max_minutes']} min)")
        steps, note = self._memory_plan(run_dir, state)
        display.display(line + (f"; {note}" if note else ""))
        return {"run": run_dir.name, "run_dir": str(run_dir), "space": space["name"],
                "budget": space["budget"], "incumbent": incumbent, "memory_steps": steps,
                "deadline": time.time() + 60 * space["budget"]["max_minutes"], "msg": line}

    def _memory_plan(self, run_dir: Path, state: dict) -> tuple[list, str]:
        """The memory step-down's starts still to make: none once one started."""
        steps = memory_steps(state["space"], state["incumbent_settings"])
        if not steps:
            return [], ""
        valid, invalid = screen_candidates(steps[:1], **_screening(state))
        if invalid:
            return [], ("the largest candidate cannot run (" + "; ".join(invalid[0]["problems"]) +
                        "): no memory step-down")
        records = read_candidates(run_dir / MEMORY_FILE, warn=display.warning)
        if memory_choice(steps, records) is not None:
            return [], f"gpu_memory_utilization {memory_choice(steps, records)} chosen before"
        return [step for step in steps if step["id"] not in records], ""

    # --- round ------------------------------------------------------------------------------

    def _round(self, args) -> dict:
        run_dir = Path(args["run_dir"])
        state = _read_run(run_dir)
        space = state["space"]
        steps = memory_steps(space, state["incumbent_settings"])
        memory = read_candidates(run_dir / MEMORY_FILE, warn=display.warning)
        chosen = memory_choice(steps, memory)
        listed = candidates(space, state["incumbent_settings"], gpu_memory_utilization=chosen)
        valid, invalid = screen_candidates(listed, **_screening(state))
        path = run_dir / CANDIDATES_FILE
        records = read_records(path, warn=display.warning)
        recorded = {record["id"] for record in records}
        for candidate in invalid:
            if candidate["id"] not in recorded:
                append_candidate(path, candidate_record(candidate, INVALID, problems=candidate["problems"]))
                display.display(f"{state['host']}: candidate {candidate['id']} ({_changes(state, candidate)}) is "
                                f"invalid, never started: {'; '.join(candidate['problems'])}")
        rounds = search_rounds(valid, space["budget"])
        number = args["round"]
        if not 1 <= number <= len(rounds):
            raise AnsibleActionFail(f"round {number}: the search has rounds 1 to {len(rounds)}")
        for position in range(1, number):
            rounds[position]["ids"] = next_round(records, rounds[position - 1])
        this = rounds[number - 1]
        by_id = {candidate["id"]: candidate for candidate in valid}
        waiting = [by_id[key] for key in pending(this, records)]
        cost = _cost(rounds, args["finalists"], args["trials"], (state.get("facts") or {}).get("bench_seconds"),
                     space["budget"])
        if number == 1 and args["trials"]:
            # Said once, when the role plans the rounds (it names the final trials).
            display.display(f"{state['host']}: the search will cost {cost['line']}")
        memory_note = ("no memory step-down" if not steps else
                       f"gpu_memory_utilization {chosen}" if chosen is not None else
                       "no gpu_memory_utilization of the step-down started the largest candidate: searched as listed")
        return {"rounds": len(rounds), "round": number, "factor": this["factor"], "pending": waiting,
                "valid": len(valid), "invalid": len(invalid), "size": len(this["ids"] or ()), "cost": cost,
                "msg": (f"round {number} of {len(rounds)}: {len(this['ids'] or ())} candidate(s) on "
                        f"{this['factor']:g} of the workload, {len(waiting)} still to measure "
                        f"({len(valid)} valid, {len(invalid)} invalid; {memory_note})")}

    # --- record -----------------------------------------------------------------------------

    def _record(self, args) -> dict:
        run_dir = Path(args["run_dir"])
        state = _read_run(run_dir)
        candidate, status = args["candidate"], args["status"]
        figures = bench_figures(args["bench"]) if args["bench"] and "score" in args["bench"] else None
        if figures is not None:
            figures.update(_correctness(args["quality"], args["probes"]))
        log_tail = None
        if status == FAILED_TO_START:
            log_tail = (args["log_tail"] or args["failure"] or "")[-LOG_TAIL_CHARS:]
        record = candidate_record(
            candidate, status, round_number=args["round"], factor=args["factor"], figures=figures,
            log_tail=log_tail, gates=[args["failure"] or "a gate was missed"] if status == MISSED_GATE else None)
        path = run_dir / (MEMORY_FILE if args["file"] == "memory" else CANDIDATES_FILE)
        append_candidate(path, record)
        latest = read_candidates(path)
        line = self._progress(state, record, path, latest, args["file"] == "memory")
        display.display(line)
        # The finalists whose final trials failed, as the run's records say: their other trials
        # are not run.
        failed = sorted(key for key, last in latest.items()
                        if last.get("round") is None and last.get("status") in (MISSED_GATE, FAILED_TO_START)
                        ) if args["file"] == "candidates" else []
        return {"record": record, "failed_finalists": failed, "msg": line}

    def _progress(self, state: dict, record: dict, path: Path, latest: dict, memory: bool) -> str:
        """`h1: candidate 3 c1a2b3c4d5e (max_num_seqs 2 -> 8): score 9120 >= 8000, TTFT p99 212 ms;
        best so far c1a2b3c4d5e score 9120` (one line a candidate, marked when simulated)."""
        # Counted among those that ran: the invalid ones are listed when the round is planned.
        ran = [line for line in read_records(path) if line["status"] != INVALID and line.get("round") is not None]
        # A record of no round is a finalist's that failed its final trials (the invalid ones are
        # listed apart): it ran already and is not counted again.
        what = "memory step" if memory else f"candidate {len(ran)}" if record.get("round") is not None else "finalist"
        head = f"{state['host']}: {what} {record['id']} ({_changes(state, record)})"
        if record["status"] == STARTED:
            return f"{head}: started"
        if record["status"] == FAILED_TO_START:
            last = next((line for line in reversed(record["log_tail"].splitlines()) if line.strip()), "")
            return f"{head}: failed to start{': ' + last.strip() if last else ''}"
        parts = [head + ":"]
        figures = record.get("figures") or {}
        if isinstance(figures.get("score"), (int, float)):
            gate = figures.get("gate_score")
            versus = "" if gate is None else (" >= " if figures["score"] >= gate else " < ") + f"{gate:.0f}"
            parts.append(f"score {figures['score']:.0f}{versus}, TTFT p99 {_ms(figures.get('ttft_p99_ms'))}")
        if record["status"] == MISSED_GATE:
            parts.append("missed a gate: " + "; ".join(record["gates"]))
        best = ranked(latest.values())
        parts.append(f"best so far {best[0]['id']} score {best[0]['figures']['score']:.0f}" if best else
                     "no candidate has cleared every gate yet")
        return " ".join(parts[:1]) + " " + "; ".join(parts[1:]) + (" [simulated]" if figures.get("simulated") else "")

    # --- final ------------------------------------------------------------------------------

    def _final(self, args) -> dict:
        run_dir = Path(args["run_dir"])
        state = _read_run(run_dir)
        latest = read_candidates(run_dir / CANDIDATES_FILE, warn=display.warning)
        incumbent = incumbent_candidate(state["incumbent_settings"])
        eligible = ranked(latest.values())
        challengers = [record for record in eligible if record["id"] != incumbent["id"]][:max(args["finalists"], 0)]
        incumbent_record = latest.get(incumbent["id"]) or {}
        finalists = [_candidate_of(record) for record in challengers]
        measure = ([incumbent] if challengers and incumbent_record.get("status") == MEASURED else []) + finalists
        schedule = final_schedule(measure, args["trials"], state["run"], trials_done(run_dir, args["trials"]))
        resumed = len(measure) * args["trials"] - len(schedule)
        line = (f"{state['host']}: finalists {', '.join(record['id'] for record in challengers)} against the "
                f"incumbent {incumbent['id']}, {args['trials']} trials each, interleaved"
                + (f"; {resumed} trial(s) written before are kept" if resumed else "") if challengers else
                f"{state['host']}: no candidate but the incumbent cleared every gate")
        display.display(line)
        return {"finalists": finalists, "incumbent": incumbent,
                "incumbent_eligible": incumbent_record.get("status") == MEASURED,
                "measure": measure, "schedule": schedule, "msg": line}

    # --- propose ----------------------------------------------------------------------------

    def _propose(self, args) -> dict:
        run_dir = Path(args["run_dir"])
        state = _read_run(run_dir)
        latest = read_candidates(run_dir / CANDIDATES_FILE, warn=display.warning)
        incumbent = incumbent_candidate(state["incumbent_settings"])
        trials = read_trials(run_dir, args["trials"], latest)
        incumbent_record = latest.get(incumbent["id"]) or {}
        found = judge_finalists(
            trials, {key: record.get("figures") or {} for key, record in latest.items()}, incumbent["id"],
            {key: len(changed_settings(incumbent, record)) for key, record in latest.items()},
            incumbent_measured=incumbent_record.get("status") == MEASURED,
            incumbent_standing=_standing(incumbent_record), min_gain=args["min_gain"],
            quality_margin=_quality_margin(args["quality_margin"], incumbent_record))
        judged, winners, between = found["judged"], found["winners"], found["between"]
        best = latest[winners[0]["id"]] if winners else (incumbent_record or {**incumbent, "settings": incumbent})
        best_record = {**best, "figures": {**(best.get("figures") or {}),
                                           **({"score": winners[0]["median_score"]} if winners else {})}}
        incumbent_shown = {**(incumbent_record or {}), "id": incumbent["id"], "settings": state["incumbent_settings"],
                           "figures": {**(incumbent_record.get("figures") or {}),
                                       **({"score": median_score(trials[incumbent['id']])}
                                          if trials.get(incumbent["id"]) else {})}}
        verdicts = "; ".join(f"{entry['id']} {entry['why']}" for entry in judged) or "no finalist"
        about = {"run": state["run"], "host": state["host"], "instance": state["instance"],
                 "release": state["release"], "space": state["space"]["name"], "judged": verdicts}
        write_proposal(run_dir / PROPOSAL_FILE, best_record, incumbent_shown, about, self._inventory)
        write_atomic(str(run_dir / FINAL_FILE),
                     json.dumps({"judged": judged, "proposed": best["id"] if winners else None,
                                 "written": utc_timestamp()}, indent=1, sort_keys=True) + "\n")
        measured = [record for record in latest.values() if record.get("status") in (MEASURED, MISSED_GATE)]
        objective = describe(args["latency"])
        edges = edge_notes(state["space"], _candidate_of(best), state["incumbent_settings"]) if winners else []
        if winners:
            line = (f"{state['host']}: on {objective}, tune proposes {best['id']} "
                    f"({'; '.join(changed_settings(incumbent, best)) or 'no change'}), "
                    f"median score {winners[0]['median_score']:.0f} against the incumbent's "
                    f"{_figure(incumbent_shown['figures'].get('score'))}: {winners[0]['why']}"
                    + "".join(f"; {note}" for note in ([between] if between else []) + edges) + ". "
                    f"Deploy it: ansible-playbook deploy.yml -i {self._inventory} -e @{run_dir / PROPOSAL_FILE}")
        else:
            line = (f"{state['host']}: on {objective}, the incumbent {incumbent['id']} stays: no candidate beat it "
                    f"({verdicts}); {run_dir / PROPOSAL_FILE} holds the current settings")
        if any((record.get("figures") or {}).get("simulated") for record in latest.values()):
            line += " [simulated]"
        display.display(line)
        return {"proposed": bool(winners), "best": best["id"], "proposal_file": str(run_dir / PROPOSAL_FILE),
                "changes": changed_settings(incumbent, best) if winners else [], "judged": judged, "msg": line,
                "between_finalists": between, "edges": edges,
                "tune": {"run": state["run"], "space": state["space"]["name"], "measured": len(measured),
                         "candidates": len(latest), "proposed": best["id"] if winners else None, "objective": objective,
                         "incumbent": incumbent["id"], "msg": line}}


def _correctness(quality: dict | None, probes: dict | None) -> dict:
    """The quality score and the share of probes that passed, which the final judge holds the
    finalists to."""
    figures = {}
    if quality and _is_number(quality.get("score")):
        figures["quality"] = quality["score"]
        if _is_number(quality.get("bound")):
            figures["quality_bound"] = quality["bound"]
    verdicts = (probes or {}).get("probes") or []
    if verdicts:
        figures["probes_passed"] = sum(1 for verdict in verdicts if verdict.get("passed")) / len(verdicts)
    return figures


def _quality_margin(given: float | None, incumbent: dict) -> float:
    """The quality drop the judge allows: as given, else the quality gate's bound the incumbent
    was held to (0 without a quality gate: its metric then has no data)."""
    if given is not None:
        return given
    bound = ((incumbent or {}).get("figures") or {}).get("quality_bound")
    return bound if _is_number(bound) else 0.0


def _cost(rounds: list[dict], finalists: int, trials: int | None, bench_seconds, budget: dict) -> dict:
    """What the search costs before it starts: its full-workload benches (the rounds', then each
    finalist's and the incumbent's trials) and engine starts, and in host-hours when the bench's
    length is known (the incumbent release's recorded bench), against the budget."""
    benches = sum(round_["size"] * round_["factor"] for round_ in rounds) + (finalists + 1) * (trials or 0)
    # The final trials are interleaved: an engine start before each, unless the one before it ran
    # the same settings.
    starts = sum(round_["size"] for round_ in rounds) + (finalists + 1) * (trials or 1)
    cost = {"benches": round(benches, 2), "starts": starts, "hours": None, "over_budget": None}
    line = f"{benches:g} full benches and at most {starts} engine starts"
    if _is_number(bench_seconds) and bench_seconds > 0:
        cost["hours"] = round(benches * bench_seconds / 3600.0, 3)
        cost["over_budget"] = benches * bench_seconds > 60 * budget["max_minutes"]
        seconds = benches * bench_seconds
        length = f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
        line += f", some {length} of benching ({cost['hours']:g} host-hours) besides the starts"
        if cost["over_budget"]:
            line += f": over budget.max_minutes ({budget['max_minutes']})"
    return dict(cost, line=line)


def _screening(state: dict) -> dict:
    facts = state.get("facts") or {}
    return {key: facts.get(key) for key in ("known_flags", "torch_version", "gpus_free", "max_position_embeddings",
                                            "probe_choices")} | {
        "allow_long_max_model_len": bool(facts.get("allow_long_max_model_len"))}


def _read_run(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AnsibleActionFail(f"{run_dir} holds no tuning run ({RUN_FILE} is missing)") from None
    except (OSError, ValueError) as error:
        raise AnsibleActionFail(f"{run_dir / RUN_FILE}: cannot be read: {error}") from None


def _candidate_of(record: dict) -> dict:
    return {"id": record["id"], "incumbent": bool(record.get("incumbent")),
            **{section: (record.get("settings") or {}).get(section) or {} for section in SECTIONS}}


def _changes(state: dict, item: dict) -> str:
    changes = changed_settings(state["incumbent_settings"], item)
    return "; ".join(change.split(".", 1)[1] for change in changes) or "the incumbent"


def _standing(record: dict) -> str:
    status = record.get("status")
    return {MISSED_GATE: "missed a gate", FAILED_TO_START: "failed to start"}.get(status, "was not measured")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ms(value) -> str:
    return f"{value:.0f} ms" if _is_number(value) else "-"


def _figure(value) -> str:
    return f"{value:.0f}" if _is_number(value) else "-"
