# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The supervisord manager: the engine as a program of a supervisord.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os
import shutil

from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import EngineError
from ansible_collections.biv100.serving.plugins.module_utils._engine_log import start_failure
from ansible_collections.biv100.serving.plugins.module_utils._engine_service import (
    ServiceManager,
    definition_names,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import atomic_write

# Where Debian's and Red Hat's supervisord.conf include program files from, with the suffix.
SUPERVISOR_INCLUDE_DIRS = (("/etc/supervisor/conf.d", ".conf"), ("/etc/supervisord.d", ".ini"))
PROGRAM_PREFIX = "biv100-serving-"


def supervisor_quote(word):
    """One word of supervisor's command=, which it splits as a POSIX shell would after
    expanding %(name)s."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return '"%s"' % escaped


def supervisor_env_value(name, value):
    """One value of supervisor's environment=, read by a non-POSIX shlex that keeps the quotes
    and then strips every quote character from both ends: quoted with the quote it lacks."""
    quotes = ("'", '"')
    if "\n" in value or all(quote in value for quote in quotes) or (
        value and (value[0] in quotes or value[-1] in quotes)
    ):
        raise EngineError(
            "env %s cannot be given to supervisord: its environment= takes no value with a "
            "newline, with both kinds of quote, or starting or ending with a quote" % name
        )
    quote = "'" if '"' in value else '"'
    return quote + value.replace("%", "%%") + quote


class SupervisordManager(ServiceManager):
    name = "supervisord"

    def __init__(self, params, run_command):
        ServiceManager.__init__(self, params, run_command)
        self.unit = PROGRAM_PREFIX + params["name"]
        self.control_command = params["supervisorctl"] or shutil.which("supervisorctl") or "supervisorctl"
        self.include_dir, self.suffix = supervisor_include_dir(params["supervisor_conf_dir"])
        self.definition_path = os.path.join(self.include_dir, self.unit + self.suffix)

    def definition(self, command, env, unit_env):
        """The program section; supervisord reads no env file, so the whole environment is in
        it (the file is 0600, as the env file is)."""
        params = self.params
        lines = [
            "; Written by biv100.serving (engine_process); changes here are undone by the next run.",
            "[program:%s]" % self.unit,
            "command=%s" % " ".join(supervisor_quote(word) for word in command),
            "directory=%s" % params["cwd"].replace("%", "%%"),
            "environment=%s"
            % ",".join(
                "%s=%s" % (key, supervisor_env_value(key, value)) for key, value in sorted(env.items())
            ),
            "autostart=true",
            # A crashed engine stays down: deploy and verify see it, and only the collection
            # starts it, so the pid file always names the engine that runs.
            "autorestart=false",
            "startsecs=%d" % max(1, int(round(params["start_check_seconds"]))),
            "startretries=0",
            "stopsignal=TERM",
            "stopwaitsecs=%d" % params["stop_timeout"],
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            "stdout_logfile=%s" % params["log_file"].replace("%", "%%"),
            # The module rotates at each start, as the pid-file launcher does.
            "stdout_logfile_maxbytes=0",
            "",
        ]
        return "\n".join(lines)

    def install(self, text):
        os.makedirs(os.path.dirname(self.params["log_file"]), exist_ok=True)
        previous = self.installed_definition()
        atomic_write(self.definition_path, text.encode("utf-8"), mode=0o600)
        try:
            self.control("reread")
        except EngineError:
            # A program file supervisord refuses would make it refuse every later reread.
            if previous is None:
                os.unlink(self.definition_path)
            else:
                atomic_write(self.definition_path, previous.encode("utf-8"), mode=0o600)
            raise
        # update: supervisord takes the new section (stopping the program first when it ran
        # under the old one).
        self.control("update", self.unit)

    def uninstall(self):
        """Remove the program file and the program from supervisord (which stops it first), so
        that nothing starts this engine again."""
        os.unlink(self.definition_path)
        self.control("reread")
        rc, out, err = self.run_command([self.control_command, "update", self.unit])
        # A program supervisord never took (its file written, its reread refused) is no group.
        if rc != 0 and "no such group" not in (out + err).lower():
            raise EngineError(
                "%s update %s failed (rc %d): %s"
                % (self.control_command, self.unit, rc, (err or out).strip())
            )

    def installed_names(self):
        """The engines whose program files the collection wrote."""
        return definition_names(self.include_dir, PROGRAM_PREFIX, self.suffix)

    def main_pid(self):
        rc, out, err = self.run_command([self.control_command, "pid", self.unit])
        text = out.strip()
        if text.isdigit():
            return int(text)
        if "no such process" in (out + err).lower():
            return 0
        raise EngineError(
            "%s pid %s failed (rc %d): %s" % (self.control_command, self.unit, rc, (err or out).strip())
        )

    def start_service(self):
        rc, out, err = self.run_command([self.control_command, "start", self.unit])
        if rc != 0 and "already started" not in out + err:
            raise start_failure(
                self.params,
                "%s start %s failed: %s" % (self.control_command, self.unit, (err or out).strip()),
            )

    def stop_service(self):
        rc, out, err = self.run_command([self.control_command, "stop", self.unit])
        if rc != 0 and "not running" not in out + err:
            raise EngineError(
                "%s stop %s failed: %s" % (self.control_command, self.unit, (err or out).strip())
            )


def supervisor_include_dir(configured):
    if configured:
        suffix = ".ini" if configured.rstrip("/").endswith("supervisord.d") else ".conf"
        return configured, suffix
    for directory, suffix in SUPERVISOR_INCLUDE_DIRS:
        if os.path.isdir(directory):
            return directory, suffix
    return SUPERVISOR_INCLUDE_DIRS[0]


def supervisord_answers(params, run_command):
    """Whether a supervisord answers its supervisorctl here."""
    control = params["supervisorctl"] or shutil.which("supervisorctl")
    if not control:
        return False
    rc, out, err = run_command([control, "pid"])
    return rc == 0 and out.strip().isdigit()
