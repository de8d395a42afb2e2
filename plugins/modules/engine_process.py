#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_process
short_description: Run the vLLM engine from a pid file on hosts without systemd or supervisord
version_added: 0.1.0
description:
  - The collection's own launcher, for hosts where PID 1 is not systemd and supervisord is
    absent. It starts the engine in a session of its own, appends its output to a log
    rotated by size when it starts, stops it by process group with a grace period, and reads
    its state back from C(/proc).
  - The engine's environment is exactly a minimal base (C(PATH), C(HOME), C(LANG=C.UTF-8)),
    then the variables of O(env_file), then O(env); never the environment of the connection
    that runs the module, so that the same task starts the same engine every time.
  - The engine is the process the pid file names, when that process is the one this module
    started (same pid and start time, recorded next to the pid file in C(<pid file stem>.json),
    since a reused pid has another start time and an engine may rewrite its own argv), or,
    lacking that record, when its command line equals O(command). A pid file naming anything
    else is stale; it is removed and that process is never signalled.
  - Drift is every argument or environment variable in which the running engine differs from
    O(command) and the desired environment. Arguments are compared as option/value pairs, so
    the same options in another order are no drift.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  name:
    description: The engine's name; it names the default pid and log files.
    type: str
    required: true
  command:
    description:
      - The engine's argv, compared with the running engine's C(/proc/<pid>/cmdline).
      - Name the interpreter first, as in the examples. A script started through its C(#!)
        line shows its interpreter in C(/proc) and would always differ.
      - Required for O(state=started) and O(state=restarted). With O(state=status), arguments
        are compared only when it is given.
    type: list
    elements: str
  env:
    description: The engine's environment variables, over those of O(env_file).
    type: dict
    default: {}
  env_file:
    description:
      - A file of C(KEY=VALUE) lines (blank lines and C(#) comments ignored, one pair of
        surrounding quotes removed, as systemd's C(EnvironmentFile=) reads it).
      - With O(state=status), environment variables are compared only when this or O(env) is
        given.
    type: path
  cwd:
    description: The engine's working directory.
    type: path
    default: /
  state:
    description:
      - V(started) starts the engine when it is not running and restarts it when it drifted.
      - V(restarted) stops and starts it unconditionally.
      - V(stopped) stops it.
      - V(status) only reports.
    type: str
    choices: [started, stopped, restarted, status]
    default: started
  pid_file:
    description: The pid file. Defaults to C(/run/biv100-serving/<name>.pid).
    type: path
  log_file:
    description:
      - The file the engine's stdout and stderr are appended to.
      - Defaults to C(/var/log/biv100-serving/<name>.log).
    type: path
  log_max_bytes:
    description:
      - At each start, a log larger than this is rotated (C(log) to C(log.1) and so on).
      - A running engine's log is not rotated by this module; it is opened for appending, so
        logrotate's C(copytruncate) can.
    type: int
    default: 104857600
  log_backups:
    description: How many rotated logs are kept.
    type: int
    default: 3
  stop_timeout:
    description: Seconds between C(SIGTERM) to the engine's process group and C(SIGKILL).
    type: int
    default: 30
  start_check_seconds:
    description: How long a new engine must stay alive to count as started.
    type: float
    default: 2
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what it would start, restart or stop; starts and stops nothing.
  diff_mode:
    support: full
    details:
      - The engine's running state, command and environment before and after.
  platform:
    support: full
    platforms: linux
notes:
  - The engine survives the module and the SSH session; it runs in a new session and holds
    no descriptor of the module's.
  - A stale pid file is reported in a warning, and removed by every state but V(status);
    removing it alone is no change, since nothing was running.
seealso:
  - module: biv100.serving.engine_health
"""

EXAMPLES = r"""
- name: Run the engine, restarting it when its arguments or environment drifted
  biv100.serving.engine_process:
    name: vllm
    command:
      - /usr/local/corex/bin/python3
      - -m
      - vllm.entrypoints.openai.api_server
      - --model=/opt/models/qwen3_5
      - --served-model-name=qwen3_5
      - --tensor-parallel-size=4
      - --max-model-len=256000
      - --max-num-seqs=2
    env_file: /etc/biv100-serving/vllm.env
    env:
      CUDA_VISIBLE_DEVICES: "0,1,2,3"
  register: engine

- name: Report how the running engine differs from the desired one
  biv100.serving.engine_process:
    name: vllm
    state: status
    command: "{{ serving_engine_command }}"
    env_file: /etc/biv100-serving/vllm.env
  register: engine_status

- name: Stop the engine
  biv100.serving.engine_process:
    name: vllm
    state: stopped
"""

RETURN = r"""
action:
  description: What the task did (or would do, in check mode).
  returned: always
  type: str
  choices: [none, start, restart, stop]
  sample: restart
running:
  description: Whether the engine runs after the task.
  returned: always
  type: bool
  sample: true
pid:
  description: The engine's pid; null when it does not run.
  returned: always
  type: int
  sample: 48213
command:
  description: The engine's actual argv, from C(/proc/<pid>/cmdline); empty when it does not run.
  returned: always
  type: list
  elements: str
  sample: [/usr/local/corex/bin/python3, -m, vllm.entrypoints.openai.api_server, --max-num-seqs=2]
env:
  description:
    - The engine's actual value, from C(/proc/<pid>/environ), of every variable of the desired
      environment and every variable the engine has; null for a variable it lacks.
    - Empty when it does not run.
  returned: always
  type: dict
  sample: {PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True", CUDA_VISIBLE_DEVICES: "0,1,2,3"}
drift:
  description:
    - How the engine running before the task differed from the desired command and environment,
      one sentence each; with O(state=started), what made it restart.
  returned: always
  type: list
  elements: str
  sample:
    - "argument --max-num-seqs: running 4, desired 2"
    - "env PYTORCH_CUDA_ALLOC_CONF: running expandable_segments:False, desired expandable_segments:True"
started_at:
  description: When the engine started (UTC); null when it does not run.
  returned: always
  type: str
  sample: "2026-05-09T07:35:25Z"
log_file:
  description: The engine's log.
  returned: always
  type: str
  sample: /var/log/biv100-serving/vllm.log
pid_file:
  description: The engine's pid file.
  returned: always
  type: str
  sample: /run/biv100-serving/vllm.pid
log_tail:
  description: The last 40 lines of the log, when a new engine exited during O(start_check_seconds).
  returned: failure
  type: list
  elements: str
"""

import os
import pwd
import re
import signal
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    ENDED_STATES,
    command_line,
    environment,
    group_members,
    is_alive,
    log_tail,
    process_stat,
    started_at,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    atomic_write,
    read_json,
    write_json,
)

# The whole inherited environment of the engine, before env_file and env.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# How often waits look at /proc again.
POLL_SECONDS = 0.1

# How long processes get to vanish after SIGKILL (longer means they are stuck in the kernel).
KILL_WAIT_SECONDS = 10

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Engine(object):
    """A live process that the pid file names and that is verified to be the engine."""

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


NOT_RUNNING = {"running": False, "pid": None, "command": [], "env": {}, "started_at": None}


def launch_record_path(pid_file):
    return os.path.splitext(pid_file)[0] + ".json"


def read_pid_file(pid_file):
    """The pid file's content, None when there is no pid file."""
    try:
        with open(pid_file) as stream:
            return stream.read().strip()
    except FileNotFoundError:
        return None


def find_engine(pid_file, desired_command):
    """(Engine or None, why the pid file is stale or None).

    The launch record's start time identifies the process this module started: a reused pid
    has another start time, and the engine may rewrite its own argv (process titles), so the
    command line is the test only for a pid file without its record.
    """
    content = read_pid_file(pid_file)
    if content is None:
        return None, None
    if not content.isdigit():
        return None, "%s holds no pid" % pid_file
    pid = int(content)
    stat = process_stat(pid)
    if stat is None or stat["state"] in ENDED_STATES:
        return None, "%s names process %d, which has ended" % (pid_file, pid)
    record = read_json(launch_record_path(pid_file), default={})
    if record.get("pid") == pid:
        ours = record.get("start_ticks") == stat["start_ticks"]
    else:
        ours = desired_command is not None and command_line(pid) == desired_command
    if not ours:
        return None, "%s names process %d (%s), which is not this engine" % (
            pid_file,
            pid,
            " ".join(command_line(pid) or []),
        )
    return Engine(pid, stat), None


def read_env_file(path):
    """The variables of a KEY=VALUE file; ValueError naming the line that is neither."""
    variables = {}
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not ENV_NAME.match(key):
                raise ValueError("%s line %d is not KEY=VALUE: %s" % (path, number, line))
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            variables[key] = value
    return variables


def base_environment():
    return {
        "PATH": BASE_PATH,
        "HOME": pwd.getpwuid(os.geteuid()).pw_dir,
        "LANG": "C.UTF-8",
    }


def desired_environment(module):
    """Base, then env_file, then env; None when the task does not concern the environment.

    Stopping needs no env_file, and a status given neither env nor env_file only reports.
    """
    params = module.params
    if params["state"] == "stopped" or (
        params["state"] == "status" and not params["env"] and not params["env_file"]
    ):
        return None
    variables = base_environment()
    if params["env_file"]:
        try:
            variables.update(read_env_file(params["env_file"]))
        except FileNotFoundError:
            if not module.check_mode:
                module.fail_json(msg="env_file %s does not exist" % params["env_file"])
            # An earlier task of the same check run would have written it.
            module.warn(
                "env_file %s does not exist yet; its variables are left out" % params["env_file"]
            )
        except (OSError, ValueError) as error:
            module.fail_json(msg="env_file: %s" % error)
    variables.update((key, str(value)) for key, value in params["env"].items())
    return variables


def split_arguments(argv):
    """(positional arguments, {option: [values]}) of an argv; a flag's value is None.

    `--opt=value` and `--opt value` read alike; a token after an option is its value unless
    it is itself an option.
    """
    positional, options = [], {}
    index = 0
    while index < len(argv):
        token = argv[index]
        if not is_option(token):
            positional.append(token)
            index += 1
            continue
        name, sep, value = token.partition("=")
        if not sep:
            following = argv[index + 1] if index + 1 < len(argv) else None
            value = following if following is not None and not is_option(following) else None
            index += value is not None
        options.setdefault(name, []).append(value)
        index += 1
    return positional, options


def is_option(token):
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)  # a negative number is a value
    except ValueError:
        return True
    return False


def shown(value):
    if value is None:
        return "unset"
    return value if value != "" else '""'


def shown_values(values):
    if values is None:
        return "absent"
    return ", ".join("set" if value is None else shown(value) for value in values)


def argument_drift(running, desired):
    running_positional, running_options = split_arguments(running)
    desired_positional, desired_options = split_arguments(desired)
    sentences = []
    if running_positional != desired_positional:
        sentences.append(
            "program and positional arguments: running %s, desired %s"
            % (" ".join(running_positional), " ".join(desired_positional))
        )
    names = list(desired_options) + [
        name for name in running_options if name not in desired_options
    ]
    for name in names:
        if running_options.get(name) != desired_options.get(name):
            sentences.append(
                "argument %s: running %s, desired %s"
                % (
                    name,
                    shown_values(running_options.get(name)),
                    shown_values(desired_options.get(name)),
                )
            )
    return sentences


def environment_drift(running, desired):
    names = list(desired) + sorted(name for name in running if name not in desired)
    return [
        "env %s: running %s, desired %s"
        % (name, shown(running.get(name)), shown(desired.get(name)))
        for name in names
        if running.get(name) != desired.get(name)
    ]


def drift(observed, desired_command, desired_env):
    sentences = []
    if desired_command is not None:
        sentences += argument_drift(observed["command"], desired_command)
    if desired_env is not None:
        sentences += environment_drift(observed["env"], desired_env)
    return sentences


def planned_action(state, engine, drifted):
    if state == "status":
        return "none"
    if state == "stopped":
        return "stop" if engine else "none"
    if state == "restarted":
        return "restart" if engine else "start"
    if engine is None:
        return "start"
    return "restart" if drifted else "none"


def remove_pid_files(pid_file):
    for path in (pid_file, launch_record_path(pid_file)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def signal_engine(engine, signum):
    """Signal the engine's whole process group when it leads one, as its own session does."""
    try:
        if engine.stat["pgrp"] == engine.pid:
            os.killpg(engine.pid, signum)
        else:
            os.kill(engine.pid, signum)
    except ProcessLookupError:
        pass


def remaining(engine):
    if engine.stat["pgrp"] == engine.pid:
        return group_members(engine.pid)
    return [engine.pid] if is_alive(engine.pid) else []


def wait_until_gone(engine, seconds):
    deadline = time.monotonic() + seconds
    while remaining(engine):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def stop(module, engine):
    """SIGTERM, the grace period, then SIGKILL; the pid file goes once nothing is left."""
    signal_engine(engine, signal.SIGTERM)
    if not wait_until_gone(engine, module.params["stop_timeout"]):
        signal_engine(engine, signal.SIGKILL)
        if not wait_until_gone(engine, KILL_WAIT_SECONDS):
            module.fail_json(
                msg="%s: processes %s of engine %d survived SIGKILL"
                % (module.params["name"], ", ".join(map(str, remaining(engine))), engine.pid)
            )
    remove_pid_files(module.params["pid_file"])


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


def fail_with_log(module, message, **extra):
    tail = log_tail(module.params["log_file"])
    module.fail_json(
        msg="%s; log tail (%s):\n%s" % (message, module.params["log_file"], "\n".join(tail)),
        log_tail=tail,
        **extra,
    )


def launch(module, env):
    """Popen the engine in a session of its own, with the log as its only output.

    Ansible's connection waits until every holder of the module's stdout and stderr has
    closed them, so the engine inherits none of the module's descriptors; its own session
    keeps the end of the SSH session's from reaching it.
    """
    params = module.params
    for path in (params["pid_file"], params["log_file"]):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    rotate_log(params["log_file"], params["log_max_bytes"], params["log_backups"])
    with open(params["log_file"], "ab") as log:
        # Marks where this start's output begins among the earlier starts' in the log.
        header = "--- %s %s starts: %s\n" % (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            params["name"],
            " ".join(params["command"]),
        )
        log.write(header.encode("utf-8"))
        log.flush()
        try:
            return subprocess.Popen(
                params["command"],
                cwd=params["cwd"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as error:
            module.fail_json(msg="%s could not be started: %s" % (params["name"], error))


def start(module, env):
    """Launch, record the pid, and make sure the engine outlives start_check_seconds."""
    params = module.params
    process = launch(module, env)
    stat = process_stat(process.pid)
    write_json(
        launch_record_path(params["pid_file"]),
        {"pid": process.pid, "start_ticks": stat["start_ticks"], "command": params["command"]},
    )
    atomic_write(params["pid_file"], ("%d\n" % process.pid).encode("ascii"))
    deadline = time.monotonic() + params["start_check_seconds"]
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    if process.returncode is not None:
        remove_pid_files(params["pid_file"])
        fail_with_log(
            module,
            "%s exited with status %d within %s s of its start"
            % (params["name"], process.returncode, params["start_check_seconds"]),
            rc=process.returncode,
        )
    return Engine(process.pid, stat)


def diff_view(observed):
    return dict((key, observed[key]) for key in ("running", "command", "env"))


def desired_view(action, observed, command, env):
    if action == "stop":
        return dict(NOT_RUNNING)
    if action in ("start", "restart"):
        return {"running": True, "command": command, "env": env}
    return observed


PAST_TENSE = {"start": "started", "restart": "restarted", "stop": "stopped"}


def message(name, action, check_mode, after):
    if action != "none":
        return "%s %s %s" % (name, "would be" if check_mode else "was", PAST_TENSE[action])
    if after["running"]:
        return "%s runs as pid %d" % (name, after["pid"])
    return "%s is not running" % name


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            command=dict(type="list", elements="str"),
            env=dict(type="dict", default={}),
            env_file=dict(type="path"),
            cwd=dict(type="path", default="/"),
            state=dict(
                type="str", choices=["started", "stopped", "restarted", "status"], default="started"
            ),
            pid_file=dict(type="path"),
            log_file=dict(type="path"),
            log_max_bytes=dict(type="int", default=104857600),
            log_backups=dict(type="int", default=3),
            stop_timeout=dict(type="int", default=30),
            start_check_seconds=dict(type="float", default=2),
        ),
        required_if=[("state", "started", ("command",)), ("state", "restarted", ("command",))],
        supports_check_mode=True,
    )
    params = module.params
    params["pid_file"] = params["pid_file"] or "/run/biv100-serving/%s.pid" % params["name"]
    params["log_file"] = params["log_file"] or "/var/log/biv100-serving/%s.log" % params["name"]
    state, command = params["state"], params["command"]
    if command is not None and not command:
        module.fail_json(msg="command is empty")

    desired_env = desired_environment(module)
    engine, stale = find_engine(params["pid_file"], command)
    before = engine.observed(desired_env) if engine else dict(NOT_RUNNING)
    drifted = drift(before, command, desired_env) if engine else []
    action = planned_action(state, engine, drifted)

    if stale:
        removes = state != "status" and not module.check_mode
        module.warn(
            "%s; that process is left alone%s"
            % (stale, ", the pid file removed" if removes else "")
        )
        if removes:
            remove_pid_files(params["pid_file"])
    after = before
    if action != "none" and not module.check_mode:
        try:
            if action in ("stop", "restart"):
                stop(module, engine)
                after = dict(NOT_RUNNING)
            if action in ("start", "restart"):
                after = start(module, desired_env).observed(desired_env)
        except OSError as error:
            module.fail_json(msg="%s: %s" % (params["name"], error))

    result = dict(
        changed=action != "none",
        action=action,
        drift=drifted,
        log_file=params["log_file"],
        pid_file=params["pid_file"],
        msg=message(params["name"], action, module.check_mode, after),
        **after,
    )
    if module._diff:
        result["diff"] = {
            "before": diff_view(before),
            "after": diff_view(desired_view(action, before, command, desired_env)),
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
