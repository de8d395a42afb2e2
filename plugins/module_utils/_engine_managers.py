# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The three ways engine_process runs the engine: systemd, supervisord, or its own pid file.

Every manager answers the same questions (which process is the engine, what definition file it
wants installed) and does the same things (install that file, start, stop), so the module's
drift and planning logic is one. Whatever runs it, the engine's pid is also kept in the pid
file, which gpu_facts reads to tell the collection's engine from foreign GPU holders.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os
import shutil

from ansible_collections.biv100.serving.plugins.module_utils._engine_pidfile import PidFileManager
from ansible_collections.biv100.serving.plugins.module_utils._engine_supervisord import (
    SupervisordManager,
    supervisord_answers,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_systemd import SystemdManager

MANAGERS = ("systemd", "supervisord", "pidfile")

# systemd's test for "booted with systemd" (sd_booted(3)).
SYSTEMD_RUNTIME_DIR = "/run/systemd/system"


def chosen_manager_name(params, run_command):
    """systemd where PID 1 is systemd, supervisord where one answers, else pidfile; or the one
    params name."""
    name = params["manager"]
    if name != "auto":
        return name
    if os.path.isdir(SYSTEMD_RUNTIME_DIR) and (params["systemctl"] or shutil.which("systemctl")):
        return "systemd"
    if supervisord_answers(params, run_command):
        return "supervisord"
    return "pidfile"


def choose_manager(params, run_command):
    """The manager params name (auto: chosen_manager_name), for the engine params name."""
    manager = {
        "systemd": SystemdManager,
        "supervisord": SupervisordManager,
        "pidfile": PidFileManager,
    }[chosen_manager_name(params, run_command)]
    return manager(params, run_command)
