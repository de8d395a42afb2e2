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
import re
import shutil
import signal
import subprocess
import time

from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    ENDED_STATES,
    command_line,
    environment,
    group_members,
    is_alive,
    process_stat,
    started_at,
    with_log_tail,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    atomic_write,
    read_json,
    write_json,
)

MANAGERS = ("systemd", "supervisord", "pidfile")

# How often waits look at /proc again.
POLL_SECONDS = 0.1

# How long processes get to vanish after SIGKILL (longer means they are stuck in the kernel).
KILL_WAIT_SECONDS = 10

# systemd's test for "booted with systemd" (sd_booted(3)).
SYSTEMD_RUNTIME_DIR = "/run/systemd/system"
SYSTEMD_UNIT_DIR = "/etc/systemd/system"
# Where Debian's and Red Hat's supervisord.conf include program files from, with the suffix.
SUPERVISOR_INCLUDE_DIRS = (("/etc/supervisor/conf.d", ".conf"), ("/etc/supervisord.d", ".ini"))


class EngineError(Exception):
    """A manager could not do what it was asked; the message names what and why."""

    def __init__(self, message, **extra):
        Exception.__init__(self, message)
        self.extra = extra


class Engine(object):
    """A live process verified to be the engine."""

    def __init__(self, pid, stat):
        self.pid = pid
        self.stat = stat

    def observed(self, desired_env):
        actual = environment(self.pid) or {}
        desired = desired_env or {}
        keys = list(desired) + sorted(key for key in actual if key not in desired)
        return {
            "running": True,
            "pid": self.pid,
            "command": command_line(self.pid) or [],
            "env": dict((key, actual.get(key)) for key in keys),
            "started_at": started_at(self.stat["start_ticks"]),
        }


def live_engine(pid):
    stat = process_stat(pid) if pid else None
    if stat is None or stat["state"] in ENDED_STATES:
        return None
    return Engine(pid, stat)


# --- the pid file: every manager keeps it -----------------------------------------------------


def launch_record_path(pid_file):
    return os.path.splitext(pid_file)[0] + ".json"


def read_pid_file(pid_file):
    """The pid file's content, None when there is no pid file."""
    try:
        with open(pid_file) as stream:
            return stream.read().strip()
    except FileNotFoundError:
        return None


def record_pid(pid_file, engine, command, manager):
    """Write the pid file and, beside it, what identifies the process (pid and start time)
    and which manager runs it."""
    os.makedirs(os.path.dirname(pid_file), exist_ok=True)
    write_json(
        launch_record_path(pid_file),
        {
            "pid": engine.pid,
            "start_ticks": engine.stat["start_ticks"],
            "command": command,
            "manager": manager,
        },
    )
    atomic_write(pid_file, ("%d\n" % engine.pid).encode("ascii"))


def remove_pid_files(pid_file):
    for path in (pid_file, launch_record_path(pid_file)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def engine_of_pid_file(pid_file, desired_command):
    """(Engine or None, why the pid file is stale or None).

    The launch record's start time identifies the process that was started: a reused pid has
    another start time, and the engine may rewrite its own argv (process titles), so the command
    line is the test only for a pid file without its record.
    """
    content = read_pid_file(pid_file)
    if content is None:
        return None, None
    if not content.isdigit():
        return None, "%s holds no pid" % pid_file
    pid = int(content)
    engine = live_engine(pid)
    if engine is None:
        return None, "%s names process %d, which has ended" % (pid_file, pid)
    record = read_json(launch_record_path(pid_file), default={})
    if record.get("pid") == pid:
        ours = record.get("start_ticks") == engine.stat["start_ticks"]
    else:
        ours = desired_command is not None and command_line(pid) == desired_command
    if not ours:
        return None, "%s names process %d (%s), which is not this engine" % (
            pid_file,
            pid,
            " ".join(command_line(pid) or []),
        )
    return engine, None


# --- stopping a process group ----------------------------------------------------------------


def leads_group(engine):
    return engine.stat["pgrp"] == engine.pid


def remaining(engine):
    """The engine's processes still alive: its whole group when it leads one, as vLLM's
    tensor-parallel workers are in the group of the server that started them."""
    if leads_group(engine):
        return group_members(engine.pid)
    return [engine.pid] if is_alive(engine.pid) else []


def wait_until_gone(engine, seconds):
    deadline = time.monotonic() + seconds
    while remaining(engine):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def signal_engine(engine, signum):
    try:
        if leads_group(engine):
            os.killpg(engine.pid, signum)
        else:
            os.kill(engine.pid, signum)
    except ProcessLookupError:
        pass


def terminate(engine, grace_seconds, name):
    """SIGTERM, the grace period, then SIGKILL, to the engine's process group."""
    signal_engine(engine, signal.SIGTERM)
    if wait_until_gone(engine, grace_seconds):
        return
    signal_engine(engine, signal.SIGKILL)
    if not wait_until_gone(engine, KILL_WAIT_SECONDS):
        raise EngineError(
            "%s: processes %s of engine %d survived SIGKILL"
            % (name, ", ".join(map(str, remaining(engine))), engine.pid)
        )


# --- logs ------------------------------------------------------------------------------------


def rotate_log(path, max_bytes, backups):
    """log.<backups-1> → log.<backups>, …, log → log.1, when the log exceeds max_bytes."""
    try:
        if os.path.getsize(path) <= max_bytes:
            return
    except FileNotFoundError:
        return
    if backups < 1:
        os.unlink(path)
        return
    for number in range(backups - 1, 0, -1):
        older = "%s.%d" % (path, number)
        if os.path.exists(older):
            os.replace(older, "%s.%d" % (path, number + 1))
    os.replace(path, path + ".1")


def write_start_header(log_file, name, command):
    """Mark where this start's output begins among the earlier starts' in the log."""
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    with open(log_file, "ab") as log:
        header = "--- %s %s starts: %s\n" % (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            name,
            " ".join(command),
        )
        log.write(header.encode("utf-8"))


def start_failure(params, message, **extra):
    message, tail = with_log_tail(message, params["log_file"])
    return EngineError(message, log_tail=tail, **extra)


# --- the managers ----------------------------------------------------------------------------


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


def systemd_quote(argument):
    """One word of ExecStart= or Environment=: quoted, with specifiers and variables escaped."""
    escaped = argument.replace("\\", "\\\\").replace('"', '\\"')
    return '"%s"' % escaped.replace("%", "%%").replace("$", "$$")


class SystemdManager(ServiceManager):
    name = "systemd"

    def __init__(self, params, run_command):
        ServiceManager.__init__(self, params, run_command)
        self.unit = "biv100-serving-%s.service" % params["name"]
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

    def main_pid(self):
        out = self.control("show", "--property=MainPID", self.unit)
        match = re.search(r"^MainPID=(\d+)$", out, re.M)
        return int(match.group(1)) if match else 0

    def start_service(self):
        self.control("start", self.unit)

    def stop_service(self):
        self.control("stop", self.unit)


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
        self.unit = "biv100-serving-%s" % params["name"]
        self.control_command = params["supervisorctl"] or shutil.which("supervisorctl") or "supervisorctl"
        directory, suffix = supervisor_include_dir(params["supervisor_conf_dir"])
        self.definition_path = os.path.join(directory, self.unit + suffix)

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
