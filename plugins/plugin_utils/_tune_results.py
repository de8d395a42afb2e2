# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a tuning run writes under build/tune/<run>/: a record per candidate, one JSON line each,
appended as the search goes so that an interrupted run can be resumed, and the proposal.
Controller side only.

    candidates.jsonl   one line per candidate run (the same candidate again in each round it
                       runs), and one per invalid candidate
    memory.jsonl       one line per start of the memory step-down
    trials/<id>-<n>/   the results file of each finalist's (and the incumbent's) n-th trial, as
                       engine_bench writes it (<release>/<label>.json)
    proposal.yml       the extra vars that deploy the best candidate: deploy.yml -e @proposal.yml

A record:

    {"id": "c1a2b3c4d5e", "incumbent": false,
     "settings": {"engine_args": {...}, "engine_allocator": {...}, "engine_env": {...}},
     "status": "measured",          # see STATUSES
     "round": 1, "factor": 0.25,    # the search round and its bench length (null when not run)
     "time": "2026-01-01T12:00:00Z",
     "figures": {"score": ..., "output_tps": ..., "input_tps": ..., "ttft_p99_ms": ...,
                 "tpot_p99_ms": ..., "requests": ..., "simulated": ...,
                 "gate_score": ...},        # the throughput gate the score was judged against
     "problems": [...],             # invalid: why the deploy's checks refuse it
     "log_tail": "...",             # failed_to_start: the end of the engine's log
     "gates": [...]}                # missed_gate: the summary of each gate it missed

A line is written whole or not at all as far as a reader can tell: each is appended with one
write, flushed and fsynced before the next candidate starts; a line a kill cut short (the last,
without its newline) is left out by the reader, which names it, and cut off by the next append.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils import _bench_record as bench_record
from ansible_collections.biv100.serving.plugins.plugin_utils import _json_lines as json_lines
from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic

SECTIONS = ("engine_args", "engine_allocator", "engine_env")
MEASURED = "measured"  # cleared every gate: eligible
MISSED_GATE = "missed_gate"  # ran, and missed a gate (probes, quality or score)
FAILED_TO_START = "failed_to_start"  # out of memory, a crash or no health in time
INVALID = "invalid"  # refused by the deploy's checks: never started
STARTED = "started"  # the memory step-down: it started, nothing was measured
STATUSES = (MEASURED, MISSED_GATE, FAILED_TO_START, INVALID, STARTED)
# The folder of the finalists' trials, one results folder per trial: <id>-<n>.
TRIALS_FOLDER = "trials"
# The figures a record keeps of a bench result: (name, where in engine_bench's figures).
FIGURES = (
    *bench_record.HEADLINE,
    ("requests", ("requests",)),
    ("simulated", ("simulated",)),
    ("gate_score", ("gate", "score")),
)


class TuneRecordError(ValueError):
    """A record that cannot be written, or a results file that cannot be read."""


def bench_figures(bench: dict) -> dict:
    """The figures a record keeps of an engine_bench result (or its results file); a figure the
    bench did not give is null."""
    figures = {}
    for name, where in FIGURES:
        value = bench
        for key in where:
            value = value.get(key) if isinstance(value, dict) else None
        figures[name] = value
    return figures


def candidate_record(candidate: dict, status: str, *, round_number: int | None = None, factor: float | None = None,
                     figures: dict | None = None, problems: list | None = None, log_tail: str | None = None,
                     gates: list | None = None, time: str | None = None) -> dict:
    """The record of a candidate (as _tune_space makes them) that ended with `status`.

    A measured candidate needs its figures with a score; an invalid one its problems; one that
    failed to start its log tail (empty when there was none); one that missed a gate the gates'
    summaries, and its figures where the bench ran. time defaults to now (UTC).
    """
    if status not in STATUSES:
        raise TuneRecordError(f"candidate {candidate.get('id')}: status {status!r} is none of {', '.join(STATUSES)}")
    required = {MEASURED: ("figures", figures is not None and _is_number((figures or {}).get("score"))),
                INVALID: ("problems", bool(problems)),
                FAILED_TO_START: ("log_tail", isinstance(log_tail, str)),
                MISSED_GATE: ("gates", bool(gates))}
    if status in required and not required[status][1]:
        raise TuneRecordError(f"candidate {candidate.get('id')}: a {status} record needs its {required[status][0]}"
                              + (" with a score" if status == MEASURED else ""))
    record = {
        "id": candidate["id"],
        "incumbent": bool(candidate.get("incumbent")),
        "settings": {section: candidate.get(section) or {} for section in SECTIONS},
        "status": status,
        "round": round_number,
        "factor": factor,
        "time": time or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    extras = {"figures": figures, "problems": problems, "log_tail": log_tail, "gates": gates}
    record.update({key: value for key, value in extras.items() if value is not None})
    return record


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def append_candidate(path: str | os.PathLike, record: dict) -> None:
    """Append the record to the results file as one JSON line, on disk before this returns
    (_json_lines.append: a torn last line is cut off first; missing folders are made)."""
    _check(record, f"{path}: the record")
    try:
        json_lines.append(path, [record])
    except json_lines.JsonLinesError as error:
        raise TuneRecordError(f"{path}: the record of {record['id']} is {error.reason}") from None


def read_records(path: str | os.PathLike, warn=None) -> list[dict]:
    """Every record of the results file, in the order written; [] when there is none yet.

    A torn last line (no newline: the run was killed while writing it) is left out and named to
    warn(message); any other line that is not a record is an error naming its number.
    """
    try:
        lines = json_lines.read(path, warn, torn_means="its candidate counts as not run")
    except json_lines.JsonLinesError as error:
        raise TuneRecordError(str(error)) from None
    for number, record in lines:
        _check(record, f"{path}: line {number}")
    return [record for _number, record in lines]


def read_candidates(path: str | os.PathLike, warn=None) -> dict[str, dict]:
    """{id: the last record of that candidate} of the results file: the candidates a resumed run
    has measured already, with their latest figures."""
    return {record["id"]: record for record in read_records(path, warn)}


def read_trials(run_dir: str | os.PathLike, count: int, latest: dict[str, dict]) -> dict[str, list[dict]]:
    """{id: the figures of its trials 1 to count, in order} from <run_dir>/trials/<id>-<n>/: a
    candidate whose latest record is a failure of no round (a finalist that failed its final
    trials) has none, nor one the run does not know. A results file that is not a JSON object
    with a score is left out."""
    found: dict[str, list[tuple[int, dict]]] = {}
    for key, number, figures in _trial_results(run_dir, count):
        record = latest.get(key) or {}
        if not record or (record.get("round") is None and record.get("status") != MEASURED):
            continue
        found.setdefault(key, []).append((number, figures))
    return {key: [figures for _number, figures in sorted(trials, key=lambda trial: trial[0])]
            for key, trials in found.items()}


def trials_done(run_dir: str | os.PathLike, count: int) -> set[tuple[str, int]]:
    """(id, n) of each final trial, n from 1 to count, whose results file is written."""
    return {(key, number) for key, number, _figures in _trial_results(run_dir, count)}


def _trial_results(run_dir, count):
    """(id, n, figures) of each results file with a score under <run_dir>/trials/<id>-<n>/."""
    folder = os.path.join(run_dir, TRIALS_FOLDER)
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        key, sep, number = name.rpartition("-")
        if not sep or not number.isdigit() or not 1 <= int(number) <= count:
            continue
        for base, _folders, files in sorted(os.walk(os.path.join(folder, name))):
            for file_name in sorted(files):
                if file_name.endswith(".json"):
                    figures = _read_json(os.path.join(base, file_name))
                    if isinstance(figures, dict) and _is_number(figures.get("score")):
                        yield key, int(number), figures


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return None


def _check(record, where: str) -> None:
    if not isinstance(record, dict):
        raise TuneRecordError(f"{where} is not a mapping")
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise TuneRecordError(f"{where} has no id")
    if record.get("status") not in STATUSES:
        raise TuneRecordError(f"{where}: status {record.get('status')!r} is none of {', '.join(STATUSES)}")


def proposal(best: dict, incumbent: dict, about: dict | None = None, inventory: str = "<inventory>") -> str:
    """The YAML document of proposal.yml: engine_args, engine_allocator and engine_env of `best`,
    each whole, since -e replaces a dict rather than merging it, and serving_tune_mappings, the
    mapping of what it changes to this run. best and incumbent are records
    (or candidates); about holds what the header says it was measured under (run, host,
    release, workload, space, the judge's verdict, ...), one `# key: value` line each;
    inventory is the -i argument the header's deploy command names."""
    settings = _settings(best)
    about = dict(about or {})
    run = about.get("run")
    target = f"build/tune/{run}/proposal.yml" if run else "<this file>"
    header = []
    if best["id"] == incumbent["id"]:
        header += ["# tune.yml found no candidate that beats the incumbent: these are the host's current",
                   f"# engine settings (candidate {best['id']}), and deploying them changes nothing."]
    else:
        header += [f"# tune.yml proposes candidate {best['id']}. Deploy it through the canary and every gate:",
                   f"#   ansible-playbook deploy.yml -i {inventory} -e @{target}"]
    header.append("# Each dict is whole (-e replaces a dict): every key the engine runs with, not only the changed ones.")
    header += [f"# {key}: {_one_line(value)}" for key, value in about.items()]
    header.append(f"# measured against the incumbent {incumbent['id']}: {_comparison(best, incumbent)}")
    changes = _changes(_settings(incumbent), settings)
    if changes and best["id"] != incumbent["id"]:
        header.append("# changed: " + "; ".join(changes))
    if any((item.get("figures") or {}).get("simulated") for item in (best, incumbent)):
        header.append("# The figures are simulated: measured against the lab's engine stand-in.")
    header.append("# serving_tune_mappings records where each changed setting came from: this run.")
    mappings = [] if best["id"] == incumbent["id"] else tune_mappings(_settings(incumbent), settings, run)
    document = yaml.safe_dump({**settings, "serving_tune_mappings": mappings}, sort_keys=False,
                              default_flow_style=False, allow_unicode=True, explicit_start=True, width=100)
    return "\n".join(header) + "\n" + document


# The kind of change a tuned setting is, by its section (serving_mappings' `change`).
TUNED_CHANGE = {"engine_args": "tuned launch parameter", "engine_allocator": "tuned PYTORCH_CUDA_ALLOC_CONF",
                "engine_env": "tuned environment variable"}


def tune_mappings(before: dict, after: dict, run) -> list[dict]:
    """serving_tune_mappings of a proposal: per section, the settings it changes, mapped to the
    tuning run they come from (the place is left to the section's: the run file's parameters or env)."""
    mappings = []
    for section in SECTIONS:
        names = [f"{section}.{key}" for changed, key, _old, _new in _differences(before, after) if changed == section]
        if names:
            mappings.append({"settings": names, "source": f"tune.yml run {run or '(unnamed)'}",
                             "change": TUNED_CHANGE[section]})
    return mappings


def write_proposal(path: str | os.PathLike, best: dict, incumbent: dict, about: dict | None = None,
                   inventory: str = "<inventory>") -> None:
    """Write proposal(best, incumbent, about, inventory) to path, whole or not at all."""
    write_atomic(path, proposal(best, incumbent, about, inventory))


def changed_settings(before: dict, after: dict) -> list[str]:
    """`<section>.<key> <old> -> <new>` for each engine setting that `after` sets otherwise than
    `before` (records or candidates), sections in order, keys sorted."""
    return _changes(_settings(before), _settings(after))


def _settings(item: dict) -> dict:
    settings = item.get("settings") or item
    return {section: dict(settings.get(section) or {}) for section in SECTIONS}


def _one_line(value) -> str:
    return " ".join(str(value).split())


def _comparison(best: dict, incumbent: dict) -> str:
    ours, theirs = best.get("figures") or {}, incumbent.get("figures") or {}
    parts = []
    for name, label, unit in (("score", "score", ""), ("output_tps", "output", " tok/s"),
                              ("ttft_p99_ms", "TTFT p99", " ms")):
        if _is_number(ours.get(name)) or _is_number(theirs.get(name)):
            parts.append(f"{label} {_figure(ours.get(name))} vs {_figure(theirs.get(name))}{unit}")
    return ", ".join(parts) or "no figures"


def _figure(value) -> str:
    return f"{value:.1f}" if _is_number(value) else "-"


def _changes(before: dict, after: dict) -> list[str]:
    return [f"{section}.{key} {_shown(old)} -> {_shown(new)}" for section, key, old, new in _differences(before, after)]


def _differences(before: dict, after: dict):
    """(section, key, old, new) of each setting `after` sets otherwise than `before`, sections in
    order, keys sorted; a value of another type (true for 1) differs."""
    for section in SECTIONS:
        for key in sorted(set(before[section]) | set(after[section])):
            old, new = before[section].get(key), after[section].get(key)
            if old != new or type(old) is not type(new):
                yield section, key, old, new


def _shown(value) -> str:
    return "(unset)" if value is None else json.dumps(value)
