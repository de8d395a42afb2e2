# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One record of each host's run: the phase it is in, the instance the phase is about, and what
each phase proved, written at each phase boundary by the serving_run action.

Everything after a phase reads it: the deploy's rescue (which phase failed, for which instance),
the release record (what each instance was proven with), the canary analysis (the canary's
probes and quality), and the ledger (one line per host, or per instance). What is kept of a
module's result is decided here once, so that a playbook passes results, not fields.

Controller side only: standard library.
"""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils import _bench_record as bench_record
from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import canary_record
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_summary import probe_summary
from ansible_collections.biv100.serving.plugins.plugin_utils._verify_findings import healthy_line, instance_findings

# The host fact the record is: the serving_run action writes it, the ledger callback reads it.
FACT = "serving_run"

# The phases of a run, in the order a deploy meets them. A failure is named by the phase the
# record is in: before the first phase the run only holds the host's lock; in `base`, a host's
# first deploy scores the vendor's files on the quality set, before anything is staged.
PHASES = ("lock", "base", "stage", "guard", "engine", "probes", "gates", "canary", "mark", "rollback", "tune", "done")

# Engine options whose value is a secret: the record keeps that they were given, not the value.
SECRET_OPTIONS = ("--api-key",)

# The quality gate's figures, as the engine_quality action returns them.
QUALITY_KEYS = ("score", "cases", "correct", "baseline", "deviation", "bound", "passed", "simulated")

# What a ledger line keeps of the record: the host's, and each instance's.
LEDGER_HOST_KEYS = ("release", "state", "payload_digest", "files_changed", "mappings", "changes", "failure_points",
                    "platform", "guard", "rollback", "canary", "tune")
LEDGER_INSTANCE_KEYS = ("engine_args", "probes", "failed_probes", "bench", "quality")


class RunRecordError(ValueError):
    """An input the record cannot take, named."""


def start(run: str, host: str) -> dict:
    """A host's record at the start of a run: it holds the host's lock, nothing more."""
    return {"run": run, "host": host, "phase": "lock", "instance": "", "release": None, "state": "pending",
            "instances": {}}


def update(record: dict | None, *, run: str, host: str, phase: str | None = None, instance=None,
           failed: dict | None = None, failed_task: str | None = None, **results) -> dict:
    """The record after a phase boundary: `phase` entered (None: the same one), the results the
    ending phase gave kept, and a failure named. A record of another run (a fact cache's) is
    started afresh."""
    record = dict(record) if record and record.get("run") == run else start(run, host)
    record["instances"] = {name: dict(entry) for name, entry in (record.get("instances") or {}).items()}
    if phase is not None:
        if phase not in PHASES:
            raise RunRecordError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
        record["phase"] = phase
    name = instance_name(instance)
    if instance is not None:
        record["instance"] = name
        if name:
            entry = record["instances"].setdefault(name, {})
            if isinstance(instance, dict):
                entry["label"] = instance.get("label", name)
                if instance.get("record") is not None:
                    entry["engine"] = instance["record"]
    for key, result in results.items():
        if key not in RESULTS:
            raise RunRecordError(f"{key} is not a result the run record keeps ({', '.join(RESULTS)})")
        if result is None:
            continue
        if not isinstance(result, dict):
            raise RunRecordError(f"{key} must be a task's result (a dict), not {type(result).__name__}")
        KEEPERS[key](record, record["instances"].get(record["instance"]) if record["instance"] else None, result)
    if failed is not None:
        record["failure"] = failure_line(record, host, failed_task or "an unnamed task", failed)
    return record


def instance_name(instance) -> str:
    """The name of an instance given as its value ({name, label, record, ...}) or its name."""
    if isinstance(instance, dict):
        return str(instance.get("name") or "")
    return str(instance or "")


# --- what is kept of each phase's result ---------------------------------------------------------


def _instance(entry: dict | None, what: str) -> dict:
    if entry is None:
        raise RunRecordError(f"{what} is an engine instance's result: name the instance")
    return entry


def staged(record: dict, _entry, result: dict) -> None:
    if "release" in result:
        record.update(release=result["release"], payload_digest=result.get("payload_digest"),
                      files_changed=result.get("changed_files", []), mappings=result.get("mappings", []),
                      changed=bool(result.get("changed")))


def guarded(record: dict, _entry, result: dict) -> None:
    record["guard"] = ("FAILED: " if result.get("failed") else "") + str(result.get("msg", ""))[:300]


def engine(record: dict, entry, result: dict) -> None:
    entry = _instance(entry, "engine")
    entry["restarted"] = bool(result.get("changed"))
    argv = [str(argument) for argument in result.get("command") or ()]
    if argv:
        # What follows the interpreter and `-m <module>` (or the program). The engine's
        # environment, which holds the clients' key, is never recorded.
        entry["engine_args"] = without_secrets(argv[3:] if argv[1:2] == ["-m"] else argv[1:])


def probed(record: dict, entry, result: dict) -> None:
    entry = _instance(entry, "probed")
    if "summary" not in result:
        return
    # Of each probe, only its verdict: the canary analysis counts the share that passed.
    verdicts = [{"name": probe.get("name"), "passed": bool(probe.get("passed"))} for probe in result.get("probes", [])]
    entry.update(probes=probe_summary(result), failed_probes=result.get("failed_probes", []),
                 probe_verdicts=verdicts, summary=result["summary"])
    if record["phase"] == "rollback":
        # What the rollback proved, instance by instance: the deploy's failure message ends with it.
        record.setdefault("rollback_proven", {})[record["instance"]] = probe_summary(result)


def gated(record: dict, entry, result: dict) -> None:
    """The gates role's result: {verdicts, record: {bench, quality}}."""
    entry = _instance(entry, "gated")
    figures = result.get("record") or {}
    entry["gates"] = figures
    entry["summary"] = "; ".join(verdict.get("summary", "") for verdict in result.get("verdicts") or ())
    if figures.get("bench"):
        entry["bench"] = bench_record.kept(figures["bench"], per_request=False)
    if figures.get("quality"):
        entry["quality"] = {key: figures["quality"][key] for key in QUALITY_KEYS if key in figures["quality"]}


def canary(record: dict, _entry, result: dict) -> None:
    kept = canary_record(result)
    if kept:
        record["canary"] = kept


def marked(record: dict, _entry, result: dict) -> None:
    """A serving_release result: the release it marked (or read) and its state, what it changed
    against the last good release, the failure points it fixes, and the platform's last verdict
    on it, as its record holds them."""
    if result.get("release") and not result.get("failed") and result.get("status"):
        record.update(release=result["release"], state=result.get("status"))
        for key in ("changes", "failure_points"):
            if result.get(key) is not None:
                record[key] = result[key]
        if result.get("platform"):
            record["platform"] = result["platform"][0]


def rolled_back(record: dict, _entry, result: dict) -> None:
    record["phase"] = "rollback"
    if result.get("failed"):
        record["rollback"] = f"FAILED: {str(result.get('msg', ''))[:300]}"
        return
    target = result.get("release") or "base"
    record["rollback"] = {"from": result.get("from_release"), "to": target, "files": result.get("changed_files", [])}
    record.update(release=target, state="rolled back")


def verified(record: dict, entry, result: dict) -> None:
    """verify.yml's checks of an instance ({engine: engine_process state=status, probes:
    engine_probe}): what differs from the desired engine, one sentence each, and the line a
    healthy instance is reported with."""
    entry = _instance(entry, "verified")
    engine_status, probes = result.get("engine") or {}, result.get("probes") or {}
    entry.update(findings=instance_findings(engine_status, probes),
                 healthy=healthy_line(entry.get("label", record["instance"]), engine_status, probes))


def tuned(record: dict, _entry, result: dict) -> None:
    if isinstance(result.get("tune"), dict):
        record["tune"] = result["tune"]


# What the serving_run action takes besides the phase: each the result of the module (or role)
# that ends a phase, kept by the function of the same name above.
KEEPERS = {"staged": staged, "guarded": guarded, "engine": engine, "probed": probed, "gated": gated,
           "canary": canary, "marked": marked, "rolled_back": rolled_back, "verified": verified, "tuned": tuned}
RESULTS = tuple(KEEPERS)


def without_secrets(arguments: list) -> list:
    """The arguments with the value of every secret option replaced by a mask."""
    shown = []
    masks_next = False
    for argument in arguments:
        name, sep, _value = str(argument).partition("=")
        if masks_next:
            shown.append("********")
        elif sep and name in SECRET_OPTIONS:
            shown.append(f"{name}=********")
        else:
            shown.append(argument)
        masks_next = not sep and argument in SECRET_OPTIONS
    return shown


# --- what a failure says -------------------------------------------------------------------------


def failure_line(record: dict, host: str, task: str, result: dict) -> str:
    """`<host or host/instance>: the <phase> phase failed at '<task>': <first line>`, one line
    whatever the message holds, saying how many lines were left to the task's output."""
    entry = record["instances"].get(record.get("instance") or "") or {}
    lines = [line.strip() for line in str(result.get("msg") or "no message").splitlines() if line.strip()]
    lines = lines or ["no message"]
    more = f" [{len(lines) - 1} more lines in its output above]" if len(lines) > 1 else ""
    return f"{entry.get('label') or host}: the {record['phase']} phase failed at '{task}': {lines[0]}{more}"


# --- the ledger's view -------------------------------------------------------------------------


def ledger_lines(record: dict) -> dict[str, dict]:
    """{name: line} of a host's ledger lines: one, named after the host, for a host that ran one
    engine; one per instance, named <host>/<instance>, each with the host's release and state,
    for a host that ran several."""
    host = {key: record[key] for key in LEDGER_HOST_KEYS if record.get(key) is not None}
    host.setdefault("release", record.get("release"))
    host.setdefault("state", record.get("state"))
    instances = {name: {key: entry[key] for key in LEDGER_INSTANCE_KEYS if key in entry}
                 for name, entry in (record.get("instances") or {}).items()}
    if len(instances) <= 1:
        for own in instances.values():
            host.update(own)
        return {record["host"]: host}
    return {f"{record['host']}/{name}": {**host, **own} for name, own in instances.items()}
