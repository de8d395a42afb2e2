# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the systemd and supervisord managers share: a definition file, a control command, and
the pid file kept for the collection's other modules.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os
import time

from ansible_collections.biv100.serving.plugins.module_utils._engine_group import (
    KILL_WAIT_SECONDS,
    POLL_SECONDS,
    remaining,
    wait_until_gone,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import (
    EngineError,
    live_engine,
    read_pid_file,
    record_pid,
    remove_pid_files,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_log import (
    rotate_log,
    start_failure,
    write_start_header,
)


def definition_names(directory, prefix, suffix):
    """The engine names of the definition files in directory named <prefix><name><suffix>."""
    try:
        files = os.listdir(directory)
    except OSError:
        return []
    return sorted(
        name[len(prefix):-len(suffix)]
        for name in files
        if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix)
    )


class ServiceManager(object):
    """What systemd and supervisord share: a definition file, a control command, and the pid
    file kept for the collection's other modules."""

    owns_whole_environment = False  # the service manager adds variables of its own

    def __init__(self, params, run_command):
        self.params = params
        self.run_command = run_command

    def installed_definition(self):
        try:
            with open(self.definition_path, encoding="utf-8") as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def control(self, *arguments):
        """Run the control command; EngineError with its output when it fails."""
        argv = [self.control_command] + list(arguments)
        rc, out, err = self.run_command(argv)
        if rc != 0:
            raise EngineError(
                "%s failed (rc %d): %s" % (" ".join(argv), rc, (err or out).strip())
            )
        return out

    def find(self, command):
        engine = live_engine(self.main_pid())
        if engine is not None and read_pid_file(self.params["pid_file"]) != str(engine.pid):
            self.pid_file_outdated = True
        return engine, None

    pid_file_outdated = False

    def stop(self, engine):
        self.stop_service()
        if not wait_until_gone(engine, KILL_WAIT_SECONDS):
            raise EngineError(
                "%s: processes %s of engine %d outlived %s's stop"
                % (self.params["name"], ", ".join(map(str, remaining(engine))), engine.pid, self.name)
            )
        remove_pid_files(self.params["pid_file"])

    def start(self, command, env):
        params = self.params
        rotate_log(params["log_file"], params["log_max_bytes"], params["log_backups"])
        write_start_header(params["log_file"], params["name"], command)
        self.start_service()
        # Started is alive with the same pid after start_check_seconds.
        deadline = time.monotonic() + params["start_check_seconds"]
        engine = None
        while True:
            current = live_engine(self.main_pid())
            if current is None or (engine is not None and current.pid != engine.pid):
                raise start_failure(
                    params,
                    "%s (%s %s) exited within %s s of its start"
                    % (params["name"], self.name, self.unit, params["start_check_seconds"]),
                )
            engine = current
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        record_pid(params["pid_file"], engine, command, self.name)
        return engine

    def refresh_pid_file(self, engine, command):
        if self.pid_file_outdated:
            record_pid(self.params["pid_file"], engine, command, self.name)
