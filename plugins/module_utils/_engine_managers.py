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


def choose_manager(params, run_command):
    """systemd where PID 1 is systemd, supervisord where one answers, else the pid file."""
    name = params["manager"]
    if name == "auto":
        if os.path.isdir(SYSTEMD_RUNTIME_DIR) and (params["systemctl"] or shutil.which("systemctl")):
            name = "systemd"
        elif supervisord_answers(params, run_command):
            name = "supervisord"
        else:
            name = "pidfile"
    manager = {
        "systemd": SystemdManager,
        "supervisord": SupervisordManager,
        "pidfile": PidFileManager,
    }[name]
    return manager(params, run_command)
