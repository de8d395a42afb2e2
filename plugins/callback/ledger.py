# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The deployment ledger: one JSON line per host per run, and a Markdown table made from them.

Each host's line is made from its run record (the fact the serving_run action writes at each
phase boundary, plugins/plugin_utils/_run_record.py), with what only a callback sees: the first
failure of a host that ends the run failed, and the task at which a host became unreachable. At
the end of a run it appends one line per host that has a record (or per engine instance on a
host of several) to <ledger dir>/ledger.jsonl, then rewrites LEDGER.md from the whole file.
The ledger dir is ledger/<fleet> at the project root (ledger/biv100 for -i inventory/biv100), so
each fleet keeps its own record, outside its inventory folder: Ansible reads every file of an
inventory folder as an inventory source. serving_ledger_dir, BIV100_LEDGER_DIR or the ini key
name another. Check-mode runs leave no line.
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
    files changed, guard result, probe summary, engine arguments, what the release changed
    against the last good release with each change's mapping (source, place in the base, kind
    of change, the checks that prove it), the failure points it fixes, the platform's verdict,
    the rollback if any, the first failure with the engine's log tail when it has one, and the
    task at which the host became unreachable, if it did - and regenerates C(LEDGER.md).
  - C(LEDGER.md) shows first the iterations, newest first - per release its verdicts here and
    on the platform, the product brief's table of its changes (source, place in the base, kind
    of change) with the checks that prove each and what its last run proved of them - then a
    table of all lines.
  - The end-of-run lines and the table keep one line per host; a failure in them is its first
    line, cut at 240 characters. The engine's environment, which holds the clients' key, is
    never recorded, and the value of an C(--api-key) argument is masked.
  - Each line is made from the host's run record, the fact P(biv100.serving.serving_run#module)
    writes at each phase boundary; a host without one (a facts-only run) gets no line, and a
    check-mode run gets none.
  - A failure is recorded when the host ends the run failed; one a block rescued (a tuning
    candidate's that missed a gate) is the run's finding, which the record holds.
  - The ledger is kept outside the inventory folder, since Ansible reads every file of an
    inventory folder as an inventory source.
requirements:
  - enabled in ansible.cfg (callbacks_enabled), as the project's own is
options:
  ledger_dir:
    description:
      - The folder of C(ledger.jsonl) and C(LEDGER.md).
      - When not set, C(ledger/<fleet>) at the project root - C(ledger/biv100) for
        C(-i inventory/biv100). The project root is the folder of the C(ansible.cfg) in use, or
        the current folder when only a system or user one (C(/etc/ansible/ansible.cfg),
        C(~/.ansible.cfg)) or none is. The fleet is the name of the first inventory source that
        is a folder, or of the folder holding the first inventory file; C(default) when the
        inventory is only a host list (C(-i host1,host2)).
      - The variable C(serving_ledger_dir) is read once per run as the first host a task ran on
        sees it (extra vars, the play's vars, the inventory's host and group vars; templates
        are resolved), so set it for the whole fleet (C(-e) or C(group_vars/all)). Ansible does
        not hand variables to callback plugins; the callback reads this one itself, and it wins
        over the environment variable and C(ansible.cfg), as a variable does for other plugins.
      - A relative path is relative to the current folder, or in C(ansible.cfg) to its folder.
    type: path
    env:
      - name: BIV100_LEDGER_DIR
    ini:
      - section: biv100_ledger
        key: dir
    vars:
      - name: serving_ledger_dir
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

import os
from pathlib import Path

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase
from ansible.template import Templar

from ansible_collections.biv100.serving.plugins.module_utils._state_store import utc_timestamp
from ansible_collections.biv100.serving.plugins.plugin_utils import _json_lines as json_lines
from ansible_collections.biv100.serving.plugins.plugin_utils import _run_record as run_record
from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic
from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import figure_cells
from ansible_collections.biv100.serving.plugins.plugin_utils._iterations import iteration_section, iterations, markdown_table
from ansible_collections.biv100.serving.plugins.plugin_utils._ledger_location import (
    LEDGER_FILE,
    LEDGER_VARIABLE,
    TABLE_FILE,
    ledger_home,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import project_root

COLLECTION = "biv100.serving."

# How much of a failure the end-of-run line and a table cell show: its first line, at most
# this long. ledger.jsonl keeps all of it, and a failed engine start's log tail beside it.
SHOWN_FAILURE_CHARS = 240


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "biv100.serving.ledger"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._playbook = None
        self._submission = None
        # Per host, its run record as last written, and what only the callback sees: its first
        # failure and where it became unreachable.
        self._records: dict[str, dict] = {}
        self._hosts: dict[str, dict] = {}
        self._play = None
        # The play and host of the run's first task result: serving_ledger_dir as that host sees it.
        self._first = None

    def v2_playbook_on_start(self, playbook):
        self._playbook = os.path.basename(playbook._file_name)

    def v2_playbook_on_play_start(self, play):
        self._play = play
        extra = play.get_variable_manager().extra_vars
        self._submission = extra.get("serving_release", self._submission)

    def v2_runner_on_ok(self, result):
        self._note(result, failed=False)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._note(result, failed=True)

    def v2_runner_on_unreachable(self, result):
        self._first = self._first or (self._play, result._host)
        # A host lost mid-run: its line says where, so that the team knows to re-run it.
        entry = self._hosts.setdefault(result._host.get_name(), {})
        entry.setdefault("unreachable", f"{result._task.get_name()}: {result._result.get('msg', '')}")

    def _note(self, result, failed: bool) -> None:
        self._first = self._first or (self._play, result._host)
        host = result._host.get_name()
        answer = result._result
        record = (answer.get("ansible_facts") or {}).get(run_record.FACT)
        if isinstance(record, dict):
            # The host's run record as its last phase boundary left it: the line is made from it.
            self._records[host] = record
        entry = self._hosts.setdefault(host, {})
        if failed and "failure" not in entry:
            # Kept only if the host ends the run failed: a failure a block rescued (a tuning
            # candidate's, say) is the run's finding, which its record holds.
            entry["failure"] = f"{result._task.get_name()}: {failure_message(answer)}"
            if answer.get("log_tail"):
                # A failed engine start's own words, for the post-mortem.
                entry["failure_log_tail"] = answer["log_tail"]

    def v2_playbook_on_stats(self, stats):
        # Decided (and an old ledger moved out of the inventory) in every run, so that a facts-only
        # or check-mode run stops the inventory warnings too.
        directory = self._ledger_dir()
        # Only hosts with a run record: a facts-only run leaves no line.
        failed_hosts = set(getattr(stats, "failures", {}) or {})
        seen = {}
        for host, record in self._records.items():
            entry = self._hosts.get(host, {})
            noted = {key: value for key, value in entry.items()
                     if key == "unreachable" or host in failed_hosts}
            for name, line in run_record.ledger_lines(record).items():
                seen[name] = {**line, **noted}
        if not seen:
            return
        # The run's end, whatever stopped it (a failed canary ends the playbook early): each
        # host's release and state.
        self._display.banner("RELEASES")
        hosts_with_instances = {host.partition("/")[0] for host in seen}
        for host in sorted((set(stats.processed) - hosts_with_instances) | set(seen)):
            self._display.display(f"{host}: {outcome_line(seen.get(host))}")
        if context.CLIARGS.get("check"):
            return
        now = utc_timestamp()
        lines = [dict(time=now, host=host, playbook=self._playbook, submission=self._submission,
                      **entry) for host, entry in sorted(seen.items())]
        json_lines.append(directory / LEDGER_FILE, lines, sort_keys=True)
        written = json_lines.read(directory / LEDGER_FILE, self._display.warning)
        write_table(directory / TABLE_FILE, [line for _number, line in written if isinstance(line, dict)])

    def _ledger_dir(self) -> Path:
        """This run's ledger folder."""
        variable = self._ledger_variable()
        if variable:
            # What ansible-core does with an option's `vars` for the plugin types it hands
            # variables to: the variable wins over the environment and ansible.cfg.
            self.set_options(var_options={LEDGER_VARIABLE: variable})
        sources = context.CLIARGS.get("inventory") or ()
        root = project_root(C.CONFIG_FILE)
        configured = self.get_option("ledger_dir")
        directory = Path(configured) if configured else ledger_home(root, sources)
        return directory

    def _ledger_variable(self) -> str | None:
        """serving_ledger_dir as the host of the run's first task result sees it, templated."""
        if not self._first or self._first[0] is None:
            return None
        play, host = self._first
        try:
            variables = play.get_variable_manager().get_vars(play=play, host=host, include_hostvars=False)
            if LEDGER_VARIABLE not in variables:
                return None
            value = Templar(variables=variables).template(variables[LEDGER_VARIABLE])
        except Exception as error:  # a bad template must not cost the run its ledger line
            self._display.warning(f"{LEDGER_VARIABLE} could not be read ({error}); the ledger goes "
                                  "where BIV100_LEDGER_DIR, ansible.cfg or the default puts it")
            return None
        return str(value) if value not in (None, "") else None


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
    parts.extend(gate_parts(entry))
    if entry.get("canary"):
        parts.append(canary_part(entry["canary"]))
    if entry.get("tune"):
        parts.append(tune_part(entry["tune"]))
    if entry.get("failure"):
        parts.append(f"failed at {one_line(entry['failure'])}")
    if entry.get("unreachable"):
        parts.append(one_line(lost_at(entry)))
    return "; ".join(parts)


def gate_parts(entry: dict) -> list[str]:
    """The gates' headline figures of a host's line: the weighted score against its gate and the
    quality score against its baseline, each marked when the lab's stand-in produced it."""
    parts = []
    bench, quality = entry.get("bench") or {}, entry.get("quality") or {}
    if isinstance(bench.get("score"), (int, float)):
        gate = bench.get("gate") or {}
        verdict = f" {'>=' if gate.get('passed') else '<'} {gate['score']:.0f}" if "score" in gate else ""
        parts.append(f"score {bench['score']:.0f}{verdict} (output {bench.get('output_tps', 0):.0f} tok/s)"
                     + (" [simulated]" if bench.get("simulated") else ""))
    if isinstance(quality.get("score"), (int, float)):
        deviation = quality.get("deviation")
        versus = (f" ({100 * deviation:+.1f} % vs {quality['baseline']['release']})"
                  if isinstance(deviation, (int, float)) and quality.get("baseline") else "")
        parts.append(f"quality {quality['score']:.3f}{versus}" + (" [simulated]" if quality.get("simulated") else ""))
    return parts


def tune_part(tune: dict) -> str:
    """`tuning run 20261202T..: 25 candidates measured over space default, proposes c1a2b3c4d5e`."""
    found = f"proposes {tune['proposed']}" if tune.get("proposed") else f"the incumbent {tune.get('incumbent')} stays"
    return (f"tuning run {tune.get('run')}: {tune.get('measured')} candidates measured over space "
            f"{tune.get('space')}, {found}")


def canary_part(canary: dict) -> str:
    """`canary pass, score 100 vs gpu2 (same window, sub510), 3 trials`, marked when simulated."""
    baseline = canary.get("baseline") or {}
    score = "no score" if canary.get("score") is None else f"score {canary['score']:.0f}"
    accepted = " (accepted)" if canary.get("accepted") else ""
    return (f"canary {canary.get('verdict')}{accepted}, {score} vs {baseline.get('host') or 'own record'} "
            f"({baseline.get('kind')}, {baseline.get('release') or 'vendor files'}), {canary.get('trials')} trials"
            + (" [simulated]" if canary.get("simulated") else ""))


def failure_message(answer: dict) -> str:
    """A failed task's message; for a loop, its first failed item's, named by the item's label,
    since the loop's own says only that one or more items failed."""
    failed_items = [item for item in answer.get("results") or () if isinstance(item, dict) and item.get("failed")]
    if not failed_items:
        return str(answer.get("msg", ""))
    item = failed_items[0]
    label = item.get("_ansible_item_label", item.get(item.get("ansible_loop_var", "item")))
    return f"{label}: {item.get('msg', '')}" if label is not None else str(item.get("msg", ""))


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


COLUMNS = ("time", "host", "playbook", "submission", "release", "state", "files changed",
           "guard", "probes", "score", "output tok/s", "TTFT p99", "quality", "rollback", "changes",
           "failure")


def table_row(line: dict) -> list[str]:
    rollback = line.get("rollback")
    if isinstance(rollback, dict):
        rollback = f"{rollback['from'] or 'base'} → {rollback['to']} ({len(rollback['files'])} files)"
    return [line.get("time", ""), line.get("host", ""), line.get("playbook") or "",
            line.get("submission") or "", line.get("release") or "", line.get("state") or "",
            str(len(line.get("files_changed") or [])), one_line(line.get("guard") or "", 60),
            one_line(line.get("probes") or ""),
            # The gates' headline figures: blank when not measured, "(sim)" on the lab's stand-in.
            *figure_cells(line.get("bench"), line.get("quality")),
            one_line(rollback or ""), str(len(line["changes"])) if isinstance(line.get("changes"), list) else "",
            one_line(line.get("failure") or lost_at(line))]


def lost_at(line: dict) -> str:
    return f"unreachable at {line['unreachable']}" if line.get("unreachable") else ""


def write_table(path: Path, lines: list[dict]) -> None:
    rows = ["# Deployment ledger", "",
            f"Generated from {LEDGER_FILE} by the biv100.serving.ledger callback; do not edit.", ""]
    shown = iterations(lines)
    if shown:
        rows += ["## Iterations", "",
                 "Newest first: what each release changed against the last good release before it (the "
                 "vendor's base for a host's first), from its source to its place in the base, with the "
                 "checks that prove each fix: ✓ passed in the release's last run on every host, ✗ failed, "
                 "· not run.", ""]
        for item in shown:
            rows += iteration_section(item)
        rows += ["## Runs", ""]
    rows += markdown_table(COLUMNS, [table_row(line) for line in lines])
    write_atomic(path, "\n".join(rows) + "\n")
