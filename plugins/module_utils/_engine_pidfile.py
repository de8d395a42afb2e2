# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pidfile manager: the collection's own launcher, where neither systemd nor supervisord
runs the engine.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import subprocess
import time

from ansible_collections.biv100.serving.plugins.module_utils._engine_group import (
    POLL_SECONDS,
    terminate,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import (
    Engine,
    EngineError,
    engine_of_pid_file,
    launch_record_path,
    record_pid,
    remove_pid_files,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_log import (
    rotate_log,
    start_failure,
    write_start_header,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import process_stat
from ansible_collections.biv100.serving.plugins.module_utils._state_store import read_json


class PidFileManager(object):
    """The collection's own launcher: a session of the engine's own, the pid file, /proc."""

    name = "pidfile"
    # The engine's environment is exactly what the module gives it, so a variable it has
    # beyond the desired ones is drift.
    owns_whole_environment = True

    def __init__(self, params, run_command):
        self.params = params

    def definition(self, command, env, unit_env):
        return None

    def installed_definition(self):
        return None

    def find(self, command):
        return engine_of_pid_file(self.params["pid_file"], command)

    def find_own(self, command):
        """The engine this launcher started, None when another manager wrote the pid file."""
        record = read_json(launch_record_path(self.params["pid_file"]), default={})
        if record.get("manager", self.name) != self.name:
            return None
        return self.find(command)[0]

    def refresh_pid_file(self, engine, command):
        pass  # the pid file is this launcher's own record

    def install(self, text):
        raise AssertionError("the pid-file launcher installs no definition")

    def uninstall(self):
        raise AssertionError("the pid-file launcher installs no definition")

    def installed_names(self):
        return []  # its engines are known by their pid files alone

    def stop(self, engine):
        terminate(engine, self.params["stop_timeout"], self.params["name"])
        remove_pid_files(self.params["pid_file"])

    def start(self, command, env):
        """Popen the engine in a session of its own, with the log as its only output.

        Ansible's connection waits until every holder of the module's stdout and stderr has
        closed them, so the engine inherits none of the module's descriptors; its own session
        keeps the end of the SSH session's from reaching it.
        """
        params = self.params
        rotate_log(params["log_file"], params["log_max_bytes"], params["log_backups"])
        write_start_header(params["log_file"], params["name"], command)
        with open(params["log_file"], "ab") as log:
            try:
                process = subprocess.Popen(
                    command,
                    cwd=params["cwd"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as error:
                raise EngineError("%s could not be started: %s" % (params["name"], error))
        engine = Engine(process.pid, process_stat(process.pid))
        record_pid(params["pid_file"], engine, command, self.name)
        deadline = time.monotonic() + params["start_check_seconds"]
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if process.returncode is not None:
            remove_pid_files(params["pid_file"])
            raise start_failure(
                params,
                "%s exited with status %d within %s s of its start"
                % (params["name"], process.returncode, params["start_check_seconds"]),
                rc=process.returncode,
            )
        return engine
