# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""biv100.serving.serving_report: draw a fleet's deployment ledger on the controller.

Reads <ledger dir>/ledger.jsonl, where the ledger callback writes it, and renders the PNG plots
and index.html of plugins/plugin_utils/_report.py into build/report/<fleet>/ at the project
root, with a plot per tuning run found under build/tune/<run>/candidates.jsonl (or tune_dir).
Nothing runs on a host and no connection is opened. A file whose bytes would not change is not
written, so a second run with the same ledger reports changed=false; a canary plot whose analysis
is no longer in the ledger, or a tuning plot whose run is gone, is removed; check mode writes and
removes nothing and says what would change.

The ledger folder is the one the callback would use in this run, found as the callback finds
it (plugin_utils/_ledger_location.py): the task's ledger_dir, else the variable
serving_ledger_dir (which wins over the rest for the callback too), else the callback's own
ledger_dir option (BIV100_LEDGER_DIR, ansible.cfg's [biv100_ledger] dir, resolved by
ansible-core from the callback's documentation), else ledger_home() of the project root and
inventory.
"""

from __future__ import annotations

import os
from pathlib import Path

from ansible import constants as C
from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.plugins.loader import callback_loader
from ansible.utils.display import Display

from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.biv100.serving.plugins.plugin_utils._ledger_location import (
    LEDGER_CALLBACK,
    LEDGER_FILE,
    LEDGER_VARIABLE,
    ledger_home,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import fleet, project_root
from ansible_collections.biv100.serving.plugins.plugin_utils._report import INDEX, plot_names, render
from ansible_collections.biv100.serving.plugins.plugin_utils._report_canary import CANARY_PLOT_PREFIX
from ansible_collections.biv100.serving.plugins.plugin_utils._report_figures import PLOT_SUFFIX
from ansible_collections.biv100.serving.plugins.plugin_utils._report_ledger import ReportError, load_ledger, rows
from ansible_collections.biv100.serving.plugins.plugin_utils._report_tuning import TUNE_PLOT_PREFIX, load_tuning_runs

# build/report/<fleet> at the project root, beside the probes' results and computility-run.yaml.
REPORT_FOLDER = ("build", "report")
# Where tune.yml writes its runs, one folder each, at the project root.
TUNE_FOLDER = ("build", "tune")
# The plots a render makes one of per analysis or run: a stale one of these is removed.
PER_ITEM_PLOTS = (CANARY_PLOT_PREFIX, TUNE_PLOT_PREFIX)

display = Display()

ARGUMENT_SPEC = {
    "ledger_dir": {"type": "path"},
    "dest": {"type": "path"},
    "tune_dir": {"type": "path"},
    "compare": {"type": "list", "elements": "path", "default": []},
}


def ledger_dir() -> Path:
    """The folder the ledger callback writes this run's ledger to when no variable names one:
    BIV100_LEDGER_DIR or ansible.cfg as the callback's option resolves them, else ledger/<fleet>
    at the project root."""
    callback = callback_loader.get(LEDGER_CALLBACK)
    callback.set_options()
    configured = callback.get_option("ledger_dir")
    if configured:
        return Path(configured)
    return ledger_home(project_root(C.CONFIG_FILE), context.CLIARGS.get("inventory") or ())


def report_dir() -> tuple[str, Path]:
    """The fleet this run's inventory names, and build/report/<fleet> at the project root."""
    name = fleet(context.CLIARGS.get("inventory") or ())
    return name, project_root(C.CONFIG_FILE).joinpath(*REPORT_FOLDER, name)


def write_changed(dest: Path, files: dict[str, bytes], check: bool) -> list[str]:
    """Write each file whose bytes differ from what dest holds (through a temporary file and a
    rename, so that a reader never sees half a PNG); the names of those that differ."""
    changed = []
    for name, data in files.items():
        path = dest / name
        if path.is_file() and path.read_bytes() == data:
            continue
        changed.append(name)
        if not check:
            write_atomic(path, data)
    return changed


def tune_dir() -> Path:
    """build/tune at the project root: the folder of the tuning runs when none is named."""
    return project_root(C.CONFIG_FILE).joinpath(*TUNE_FOLDER)


def remove_stale(dest: Path, files: dict[str, bytes], check: bool) -> list[str]:
    """Remove each canary or tuning plot in dest that the render no longer has (its analysis left
    the ledger, its run's folder is gone), so that the folder holds what the page shows; the
    names of those removed. No other file of dest is touched."""
    if not dest.is_dir():
        return []
    stale = sorted(path.name for prefix in PER_ITEM_PLOTS for path in dest.glob(f"{prefix}*{PLOT_SUFFIX}")
                   if path.name not in files and path.is_file() and not path.is_symlink())
    if not check:
        for name in stale:
            (dest / name).unlink()
    return stale


def _compared_ledger(folder: str) -> Path:
    ledger = Path(folder).absolute() / LEDGER_FILE
    if not ledger.is_file():
        raise ReportError(f"compare: no deployment ledger at {ledger}: name the folder of another fleet's "
                          "ledger.jsonl (ledger/lab, say)")
    return ledger


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args: dict, task_vars: dict) -> dict:
        result = {}

        named = args["ledger_dir"]
        if named is None and task_vars.get(LEDGER_VARIABLE) not in (None, ""):
            # As the ledger callback reads it: the variable as this host sees it, templated.
            named = str(self._templar.template(task_vars[LEDGER_VARIABLE]))
            named = os.path.expanduser(os.path.expandvars(named))
        directory = (Path(named) if named else ledger_dir()).absolute()
        fleet, default_dest = report_dir()
        dest = Path(args["dest"]).absolute() if args["dest"] else default_dest

        tunes = Path(args["tune_dir"]).absolute() if args["tune_dir"] else tune_dir()
        if args["tune_dir"] and not tunes.is_dir():
            raise AnsibleActionFail(f"tune_dir {tunes} is not a folder: name the folder that holds the "
                                    "tuning runs (<run>/candidates.jsonl), as build/tune does")

        ledger = directory / LEDGER_FILE
        if not ledger.is_file():
            raise AnsibleActionFail(
                f"no deployment ledger at {ledger}: a deploy of this fleet writes it; name another "
                f"folder with -e {LEDGER_VARIABLE}=<folder> (or BIV100_LEDGER_DIR)")
        try:
            lines = load_ledger(ledger, display.warning)
            runs = load_tuning_runs(tunes, display.warning)
            compared = {Path(folder).absolute().name: load_ledger(_compared_ledger(folder), display.warning)
                        for folder in args["compare"]}
            files = render(lines, fleet, runs, compared)
        except ReportError as error:
            raise AnsibleActionFail(str(error)) from None
        table = rows(lines)
        try:
            changed = write_changed(dest, files, bool(self._task.check_mode))
            removed = remove_stale(dest, files, bool(self._task.check_mode))
        except OSError as error:
            raise AnsibleActionFail(f"the report could not be written to {dest}: {error}") from None

        releases = list(dict.fromkeys(row.release for row in table))
        hosts = list(dict.fromkeys(row.host for row in table))
        result.update(
            changed=bool(changed or removed),
            ledger=str(ledger),
            dest=str(dest),
            index=str(dest / INDEX),
            plots=[str(dest / name) for name in plot_names(files)],
            files_changed=changed,
            files_removed=removed,
            releases=releases,
            hosts=hosts,
            tune_dir=str(tunes),
            tuning_runs=[run.name for run in runs],
            msg=(f"{len(releases)} releases on {len(hosts)} hosts from {len(lines)} lines of {ledger}"
                 + (f" and {len(runs)} tuning runs of {tunes}" if runs else "") + f": {dest / INDEX}"),
        )
        return result
