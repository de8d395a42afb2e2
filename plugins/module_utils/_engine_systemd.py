# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd manager: the engine as a unit of its own.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os
import re
import shutil

from ansible_collections.biv100.serving.plugins.module_utils._engine_service import (
    ServiceManager,
    definition_names,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import atomic_write

SYSTEMD_UNIT_DIR = "/etc/systemd/system"
UNIT_PREFIX, UNIT_SUFFIX = "biv100-serving-", ".service"


def systemd_quote(argument):
    """One word of ExecStart= or Environment=: quoted, with specifiers and variables escaped."""
    escaped = argument.replace("\\", "\\\\").replace('"', '\\"')
    return '"%s"' % escaped.replace("%", "%%").replace("$", "$$")


class SystemdManager(ServiceManager):
    name = "systemd"

    def __init__(self, params, run_command):
        ServiceManager.__init__(self, params, run_command)
        self.unit = UNIT_PREFIX + params["name"] + UNIT_SUFFIX
        self.definition_path = os.path.join(SYSTEMD_UNIT_DIR, self.unit)
        self.control_command = params["systemctl"] or shutil.which("systemctl") or "systemctl"

    def definition(self, command, env, unit_env):
        """The unit: unit_env (the base and O(env) variables) in it, O(env_file)'s read by systemd.

        systemd lets EnvironmentFile= override Environment=, the order the module's own
        environment follows (base, then env_file), except for O(env) over O(env_file): the
        module refuses that overlap before it gets here.
        """
        params = self.params
        lines = [
            "# Written by biv100.serving (engine_process); changes here are undone by the next run.",
            "[Unit]",
            "Description=vLLM engine %s (biv100.serving)" % params["name"],
            "After=network-online.target",
            "Wants=network-online.target",
            "",
            "[Service]",
            "Type=simple",
            "ExecStart=%s" % " ".join(systemd_quote(word) for word in command),
            "WorkingDirectory=%s" % params["cwd"],
        ]
        lines += [
            "Environment=%s" % systemd_quote("%s=%s" % item) for item in sorted(unit_env.items())
        ]
        if params["env_file"]:
            lines.append("EnvironmentFile=%s" % params["env_file"])
        lines += [
            "StandardOutput=append:%s" % params["log_file"],
            "StandardError=inherit",
            # The engine's workers are in its cgroup; all get SIGTERM, then SIGKILL.
            "KillMode=control-group",
            "TimeoutStopSec=%d" % params["stop_timeout"],
            # A crashed engine stays down: deploy and verify see it, and only the collection
            # starts it, so the pid file always names the engine that runs.
            "Restart=no",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
        return "\n".join(lines)

    def install(self, text):
        os.makedirs(os.path.dirname(self.params["log_file"]), exist_ok=True)
        atomic_write(self.definition_path, text.encode("utf-8"), mode=0o644)
        self.control("daemon-reload")
        self.control("enable", self.unit)

    def uninstall(self):
        """Disable and remove the unit, so that nothing starts this engine again."""
        self.control("disable", self.unit)
        os.unlink(self.definition_path)
        self.control("daemon-reload")

    def installed_names(self):
        """The engines whose units the collection wrote."""
        return definition_names(SYSTEMD_UNIT_DIR, UNIT_PREFIX, UNIT_SUFFIX)

    def main_pid(self):
        out = self.control("show", "--property=MainPID", self.unit)
        match = re.search(r"^MainPID=(\d+)$", out, re.M)
        return int(match.group(1)) if match else 0

    def start_service(self):
        self.control("start", self.unit)

    def stop_service(self):
        self.control("stop", self.unit)
