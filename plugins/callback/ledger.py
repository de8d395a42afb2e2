"""The deployment ledger: one JSON line per host per run, and a Markdown table made from them.

It listens to the collection's own modules - what was staged, what the guard found, what the
probes said, what the engine ran with, what was rolled back - and at the end of a run appends
one line per host it saw to <ledger dir>/ledger.jsonl, then rewrites LEDGER.md from the whole
file. The ledger dir is the `ledger` folder beside the inventory (inventory/biv100/ledger), so
each fleet keeps its own record next to its inventory; BIV100_LEDGER_DIR names another.
Check-mode runs change nothing and leave no line.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: ledger
type: notification
short_description: Append one JSON line per host per run to the fleet's deployment ledger
version_added: 0.1.0
description:
  - At the end of every run of the collection's playbooks, appends one JSON line per host to
    C(ledger.jsonl) - time, playbook, submission id, release and its state, payload digest,
    files changed, guard result, probe summary, engine arguments, the mappings (idea, place in
    the base, kind of change) the release carries, the rollback if any, the first failure
    with the engine's log tail when it has one, and the task at which the host became
    unreachable, if it did - and regenerates C(LEDGER.md), a Markdown table
    of all lines.
  - The end-of-run lines and the table keep one line per host; a failure in them is its first
    line, cut at 240 characters. The engine's environment, which holds the clients' key, is
    never recorded, and the value of an C(--api-key) argument is masked.
  - Hosts on which no module of the collection ran (a facts-only run) get no line; check-mode
    runs get none.
requirements:
  - enabled in ansible.cfg (callbacks_enabled), as the project's own is
options:
  ledger_dir:
    description: The folder of C(ledger.jsonl) and C(LEDGER.md); the C(ledger) folder beside the inventory when not set.
    type: path
    env:
      - name: BIV100_LEDGER_DIR
    ini:
      - section: biv100_ledger
        key: dir
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

import json
import os
import time
from pathlib import Path

from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.biv100.serving.plugins.filter.probe_summary import probe_summary

LEDGER_FILE = "ledger.jsonl"
TABLE_FILE = "LEDGER.md"
COLLECTION = "biv100.serving."

# How much of a failure the end-of-run line and a table cell show: its first line, at most
# this long. ledger.jsonl keeps all of it, and a failed engine start's log tail beside it.
SHOWN_FAILURE_CHARS = 240

# Engine options whose value is a secret: the ledger records that they were given, not the value.
SECRET_OPTIONS = ("--api-key",)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "biv100.serving.ledger"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._playbook = None
        self._submission = None
        self._hosts: dict[str, dict] = {}

    def v2_playbook_on_start(self, playbook):
        self._playbook = os.path.basename(playbook._file_name)

    def v2_playbook_on_play_start(self, play):
        extra = play.get_variable_manager().extra_vars
        self._submission = extra.get("serving_release", self._submission)

    def v2_runner_on_ok(self, result):
        self._note(result, failed=False)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._note(result, failed=True)

    def v2_runner_on_unreachable(self, result):
        # A host lost mid-run: its line says where, so that the team knows to re-run it.
        entry = self._hosts.setdefault(result._host.get_name(), {})
        entry.setdefault("unreachable", f"{result._task.get_name()}: {result._result.get('msg', '')}")

    def _note(self, result, failed: bool) -> None:
        action = result._task.resolved_action or result._task.action or ""
        answer = result._result
        entry = self._hosts.setdefault(result._host.get_name(), {})
        if failed and "failure" not in entry:
            entry["failure"] = f"{result._task.get_name()}: {answer.get('msg', '')}"
            if answer.get("log_tail"):
                # A failed engine start's own words, for the post-mortem.
                entry["failure_log_tail"] = answer["log_tail"]
        if not action.startswith(COLLECTION):
            return
        record = RECORDERS.get(action[len(COLLECTION):])
        if record:
            record(entry, answer, failed)

    def v2_playbook_on_stats(self, stats):
        # Only hosts a module of the collection ran on: a facts-only run leaves no line.
        seen = {host: entry for host, entry in self._hosts.items() if set(entry) - {"failure", "unreachable"}}
        if not seen:
            return
        # The run's end, whatever stopped it (a failed canary ends the playbook early): each
        # host's release and state.
        self._display.banner("RELEASES")
        for host in sorted(set(stats.processed) | set(seen)):
            self._display.display(f"{host}: {outcome_line(seen.get(host))}")
        if context.CLIARGS.get("check"):
            return
        directory = Path(self.get_option("ledger_dir") or _beside_inventory())
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        lines = [dict(time=now, host=host, playbook=self._playbook, submission=self._submission,
                      **entry) for host, entry in sorted(seen.items())]
        append_lines(directory / LEDGER_FILE, lines)
        write_table(directory / TABLE_FILE, read_lines(directory / LEDGER_FILE))


def _beside_inventory() -> str:
    sources = [source for source in context.CLIARGS.get("inventory") or () if "," not in source]
    first = Path(sources[0]) if sources else Path.cwd() / "inventory"
    return str((first if first.is_dir() else first.parent) / "ledger")


# --- what each module says ---------------------------------------------------------------------


def _staged(entry, answer, failed):
    if "release" in answer and "payload_digest" in answer:
        entry.update(release=answer["release"], payload_digest=answer["payload_digest"],
                     files_changed=answer.get("changed_files", []),
                     mappings=answer.get("mappings", []))


def _guarded(entry, answer, failed):
    entry["guard"] = ("FAILED: " if failed else "") + str(answer.get("msg", ""))[:300]


def _probed(entry, answer, failed):
    if "summary" in answer:
        entry["probes"] = probe_summary(answer)
        entry["failed_probes"] = answer.get("failed_probes", [])


def _engine(entry, answer, failed):
    argv = answer.get("command") or []
    if argv:
        # What follows the interpreter and `-m <module>` (or the program). The engine's
        # environment, which holds the clients' key, is never recorded.
        entry["engine_args"] = without_secrets(argv[3:] if argv[1:2] == ["-m"] else argv[1:])


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


def _marked(entry, answer, failed):
    if answer.get("release") and not failed:
        entry.update(release=answer["release"], state=answer.get("status"))


def _rolled_back(entry, answer, failed):
    if failed:
        entry["rollback"] = f"FAILED: {str(answer.get('msg', ''))[:300]}"
        return
    entry["rollback"] = {"from": answer.get("from_release"), "to": answer.get("release") or "base",
                         "files": answer.get("changed_files", [])}
    entry.update(release=answer.get("release") or "base", state="rolled back")


RECORDERS = {
    "serving_overlay": _staged,
    "model_guard": _guarded,
    "engine_probe": _probed,
    "engine_process": _engine,
    "serving_release": _marked,
    "serving_rollback": _rolled_back,
}


def outcome_line(entry: dict | None) -> str:
    """A host's release and state on one line, whatever its failure message holds."""
    if not entry:
        return "untouched"
    parts = [f"{entry.get('release') or 'no release'} {entry.get('state') or 'pending'}"]
    rollback = entry.get("rollback")
    if isinstance(rollback, dict):
        parts.append(f"rolled back from {rollback['from'] or 'base'}")
    elif rollback:
        parts.append(f"rollback {one_line(rollback)}")
    if entry.get("probes"):
        parts.append(one_line(entry["probes"]))
    if entry.get("failure"):
        parts.append(f"failed at {one_line(entry['failure'])}")
    if entry.get("unreachable"):
        parts.append(one_line(lost_at(entry)))
    return "; ".join(parts)


def one_line(text, limit: int = SHOWN_FAILURE_CHARS) -> str:
    """The first non-blank line of text, cut to limit; saying so when lines or text were left out."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0]
    more = f" [+{len(lines) - 1} lines]" if len(lines) > 1 else ""
    if len(first) + len(more) > limit:
        first = first[:max(0, limit - len(more) - 3)].rstrip() + "..."
    return first + more


# --- the files -----------------------------------------------------------------------------------


def append_lines(path: Path, lines: list[dict]) -> None:
    """Append whole lines and fsync: a reader never sees half a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n" for line in lines)
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


COLUMNS = ("time", "host", "playbook", "submission", "release", "state", "files changed",
           "guard", "probes", "rollback", "mappings", "failure")


def table_row(line: dict) -> list[str]:
    rollback = line.get("rollback")
    if isinstance(rollback, dict):
        rollback = f"{rollback['from'] or 'base'} → {rollback['to']} ({len(rollback['files'])} files)"
    mappings = "; ".join(f"{m.get('idea')} → {m.get('place')} ({m.get('change')})"
                         for m in line.get("mappings") or [])
    return [line.get("time", ""), line.get("host", ""), line.get("playbook") or "",
            line.get("submission") or "", line.get("release") or "", line.get("state") or "",
            str(len(line.get("files_changed") or [])), one_line(line.get("guard") or "", 60),
            one_line(line.get("probes") or ""), one_line(rollback or ""), mappings,
            one_line(line.get("failure") or lost_at(line))]


def lost_at(line: dict) -> str:
    return f"unreachable at {line['unreachable']}" if line.get("unreachable") else ""


def write_table(path: Path, lines: list[dict]) -> None:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["# Deployment ledger", "",
            f"Generated from {LEDGER_FILE} by the biv100.serving.ledger callback; do not edit.", "",
            "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    rows += ["| " + " | ".join(cell(value) for value in table_row(line)) + " |" for line in lines]
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text("\n".join(rows) + "\n", encoding="utf-8")
    os.replace(staged, path)
