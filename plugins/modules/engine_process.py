#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_process
short_description: Run the vLLM engine under systemd, supervisord or the collection's pid-file launcher
version_added: 0.1.0
description:
  - Runs the engine under the host's service manager - systemd where PID 1 is systemd,
    supervisord where one answers C(supervisorctl) - or, on hosts with neither (as in many
    containers), under the collection's own launcher. O(manager) can name one.
  - Under systemd it writes the unit C(/etc/systemd/system/biv100-serving-<name>.service);
    under supervisord the program file C(biv100-serving-<name>.conf) in
    C(/etc/supervisor/conf.d) (C(.ini) in C(/etc/supervisord.d)), mode 0600 since supervisord
    reads no env file and so carries the environment itself. A changed unit or program file
    restarts the engine. Neither restarts a crashed engine; deploy and verify see it down.
  - The launcher starts the engine in a session of its own, appends its output to a log
    rotated by size when it starts, stops it by process group with a grace period, and reads
    its state back from C(/proc).
  - Whatever runs it, the engine's pid is kept in O(pid_file), with a record of its start time
    and manager beside it in C(<pid file stem>.json), so that M(biv100.serving.gpu_facts) tells
    the engine from foreign GPU holders and the collection knows the engines it started on the
    host (the pid files in O(pid_dir)). An engine the launcher started is stopped before a
    service manager starts one.
  - Given O(layout), the names of every engine the host is to run, a start or restart first makes
    way - each of the collection's other running engines that listens on O(port) or sees one of
    this engine's GPUs (its C(CUDA_VISIBLE_DEVICES)) is stopped by the manager that started it,
    and retired when O(layout) does not name it (RV(retired)). An engine of the layout stopped
    so is started again at its own turn.
  - M(biv100.serving.engine_retire) retires the engines a host no longer runs.
  - The engine's environment is a minimal base (C(PATH), C(HOME), C(LANG=C.UTF-8)), then the
    variables of O(env_file), then O(env); never the environment of the connection that runs
    the module, so that the same task starts the same engine every time.
  - Under the launcher, the engine is the process the pid file names, when that process is the
    one it started (same pid and start time, since a reused pid has another start time and an
    engine may rewrite its own argv), or, lacking that record, when its command line equals
    O(command). A pid file naming anything else is stale; it is removed and that process is
    never signalled. Under a service manager, the engine is the service's main process.
  - Drift is every argument or environment variable in which the running engine differs from
    O(command) and the desired environment. Arguments are compared as option/value pairs, so
    the same options in another order are no drift. Under a service manager, variables the
    manager adds of its own are no drift.
  - A launcher at the front of O(command) that execs the rest (C(chroot), C(numactl),
    C(taskset), C(env)) leaves the running engine's argv without its words; the argv is then
    compared with O(command) from its program on, and the launcher's words with those of the
    command the launch record kept.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  name:
    description:
      - The engine's name; it names the default pid and log files.
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
      - A file of C(KEY=VALUE) lines, read as systemd's C(EnvironmentFile=) reads it, whichever
        manager runs the engine - blank lines and lines starting with C(#) or C(;) ignored,
        whitespace around C(=) and at the end of an unquoted value dropped, a backslash taking
        the next character as it is, C('...') literal and C("...") with C(\") and C(\\)
        escapes.
      - A line that is not C(KEY=VALUE), or whose name is not a shell variable's, fails the task
        naming the file and the line (systemd would skip it).
      - With O(state=status), environment variables are compared only when this or O(env) is
        given.
      - Under systemd a variable may be set in this file or in O(env), not both, since systemd
        lets the file win.
    type: path
  secret_env:
    description:
      - Names of environment variables whose values are secrets, such as the clients' bearer
        token C(VLLM_API_KEY). Their values - desired, and those the running engine has, which
        differ after the secret changed - are masked in everything the module returns (RV(env),
        RV(drift), the diff, messages and log tails), while drift is still told from the real
        values.
      - Give them in O(env_file) or O(env_file_content), which the engine reads as a file of
        mode 0600. Under systemd a secret in O(env) fails the task, since O(env) is written
        into the unit file, which every user may read.
    type: list
    elements: str
    default: [VLLM_API_KEY]
  env_file_content:
    description:
      - The content O(env_file) must have. The module writes it (mode 0600, through a temporary
        file and a rename) when the file differs, before the engine starts; a changed file is
        drift like any other change of the engine's environment.
      - With O(state=status) it is only compared, in RV(env_file_matches).
    type: str
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
  layout:
    description:
      - The names of every engine the host is to run, O(name) among them.
      - With O(state=started) and O(state=restarted), a start or restart first stops each other
        running engine of the collection's that holds O(port) or one of this engine's GPUs, and
        retires it when this list does not name it.
    type: list
    elements: str
    version_added: 0.2.0
  port:
    description:
      - The TCP port the engine listens on, which O(layout) frees before a start. The engine's
        own command line sets it; this only says which it is.
    type: int
    version_added: 0.2.0
  pid_file:
    description: The pid file. Defaults to C(<pid_dir>/<name>.pid).
    type: path
  log_file:
    description:
      - The file the engine's stdout and stderr are appended to.
      - Defaults to C(/var/log/biv100-serving/<name>.log).
    type: path
  log_max_bytes:
    description:
      - At each start, a log larger than this is rotated (C(log) to C(log.1) and so on).
      - A running engine's log is not rotated by this module; it is opened for appending (by
        every manager), so logrotate's C(copytruncate) can.
    type: int
    default: 104857600
  log_backups:
    description: How many rotated logs are kept.
    type: int
    default: 3
  start_check_seconds:
    description:
      - How long a new engine must stay alive to count as started (for supervisord, its
        C(startsecs), at least 1).
    type: float
    default: 2
extends_documentation_fragment:
  - biv100.serving.engine_manager
  - biv100.serving.run_lock
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what it would start, restart, stop or retire to make way; starts, stops and removes nothing.
  diff_mode:
    support: full
    details:
      - The engine's running state, command and environment before and after; the engines
        of the collection's the task stops or retires to make way, before and after.
  platform:
    support: full
    platforms: linux
notes:
  - The engine survives the module and the SSH session; under the launcher it runs in a new
    session and holds no descriptor of the module's.
  - The systemd unit appends the engine's output with C(StandardOutput=append:), which needs
    systemd 240 or newer.
  - A stale pid file is reported in a warning, and removed by every state but V(status);
    removing it alone is no change, since nothing was running.
  - The collection's engines are those whose pid files are in O(pid_dir); an engine given
    another O(pid_file) is left out of O(layout).
seealso:
  - module: biv100.serving.engine_health
  - module: biv100.serving.engine_retire
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

- name: Run vllm-2 of a host of two engines, first stopping any other engine on its port or GPUs
  biv100.serving.engine_process:
    name: vllm-2
    command: "{{ vllm_2_command }}"
    env_file: /etc/biv100-serving/vllm-2.env
    port: 8001
    layout: [vllm-1, vllm-2]
"""

RETURN = r"""
name:
  description:
    - The engine's name (O(name)); an engine instance's, on a host that runs several.
  returned: always
  type: str
  sample: vllm-1
  version_added: 0.2.0
manager:
  description: What runs the engine.
  returned: always
  type: str
  choices: [systemd, supervisord, pidfile]
  sample: supervisord
action:
  description:
    - What the task did (or would do, in check mode) to the engine.
  returned: always
  type: str
  choices: [none, start, restart, stop]
  sample: restart
retired:
  description:
    - The collection's engines the task stopped or retired (or would, in check mode) to make
      way for this one, each with its C(name), C(manager), the C(pid)
      it ran as (null when it was not running), its C(action) (V(stop) for an engine of
      O(layout), started again at its turn; V(retire) when it was stopped and its unit or program
      file and pid file removed), the unit or program file C(removed) (null when none) and, when
      it made way, what it C(held) of this engine's port and GPUs.
  returned: always
  type: list
  elements: dict
  version_added: 0.2.0
  sample:
    - name: vllm
      manager: pidfile
      pid: 48213
      action: retire
      removed: null
      held: [port 8000, GPU 0,1,2,3]
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
      one sentence each (and, under a service manager, that its unit or program file differs);
      with O(state=started), what made it restart.
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
env_file:
  description: The env file, as given.
  returned: always
  type: str
  sample: /etc/biv100-serving/engine.env
env_file_matches:
  description: Whether O(env_file) held O(env_file_content) before the task; null without O(env_file_content).
  returned: always
  type: bool
  sample: true
log_tail:
  description:
    - When a new engine exited during O(start_check_seconds), the lines of its log that say
      why, cut as M(biv100.serving.engine_health) cuts its RV(biv100.serving.engine_health#module:log_tail) -
      from this start on, without noise, from the last traceback or error block, at most 40
      lines of at most 300 characters each.
    - The tail is here only, never in the message, which says how many lines it holds.
  returned: failure
  type: list
  elements: str
"""

import contextlib
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._engine_drift import drift
from ansible_collections.biv100.serving.plugins.module_utils._engine_environment import (
    EnvironmentProblem,
    desired_environment,
    env_file_matches,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import (
    EngineError,
    launched_command,
    remove_pid_files,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_managers import (
    MANAGERS,
    choose_manager,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_pidfile import PidFileManager
from ansible_collections.biv100.serving.plugins.module_utils._engine_plan import (
    NOT_RUNNING,
    desired_view,
    diff_view,
    message,
    planned_action,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import PID_DIR
from ansible_collections.biv100.serving.plugins.module_utils._engine_retire import in_the_way, retire
from ansible_collections.biv100.serving.plugins.module_utils._own_engines import device_items
from ansible_collections.biv100.serving.plugins.module_utils._run_lock import NotHeld, fenced
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR, atomic_write

# What a write that the host's lock refused was about to do, for its message.
ACTION_WORDS = {"start": "starting", "restart": "restarting", "stop": "stopping"}


def hide_secrets(module, names, *environments):
    """Have the module mask the values of the variables named, in every environment given,
    wherever they appear in what it returns."""
    for env in environments:
        for name in names:
            value = (env or {}).get(name)
            # An empty value would mask every position of every string.
            if value:
                module.no_log_values.add(value)


def make_way(module, in_way, check_mode):
    """Stop each engine in the way (retiring those the layout does not name): what was done."""
    params = module.params
    retired = []
    for engine, held in in_way:
        remove = engine.name not in params["layout"]
        done = retire(params, module.run_command, engine.name, engine.manager, remove, check_mode)
        done["held"] = held
        retired.append(done)
    return retired


def write_env_file(params):
    atomic_write(params["env_file"], params["env_file_content"].encode("utf-8"), mode=0o600)


def apply(module, manager, action, engine, definition, desired_env, env_file_stale, in_way):
    """Write the env file, make way, stop, install the new definition, start: each step only when
    planned. Returns (the engine's state after, the engines retired to make way)."""
    params = module.params
    command = params["command"]
    after = engine.observed(desired_env) if engine else dict(NOT_RUNNING)
    if env_file_stale:
        write_env_file(params)
    retired = make_way(module, in_way, False)
    if action in ("start", "restart") and manager.name != PidFileManager.name:
        # An engine the launcher started holds the GPUs and the port: it goes before the
        # managed one starts.
        launcher = PidFileManager(params, module.run_command)
        leftover = launcher.find_own(command)
        if leftover is not None:
            launcher.stop(leftover)
    if action in ("stop", "restart"):
        manager.stop(engine)
        after = dict(NOT_RUNNING)
    if definition is not None:
        manager.install(definition)
    if action in ("start", "restart"):
        after = manager.start(command, desired_env).observed(desired_env)
    elif engine is not None and action == "none":
        manager.refresh_pid_file(engine, command)
    return after, retired


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            command=dict(type="list", elements="str"),
            env=dict(type="dict", default={}),
            env_file=dict(type="path"),
            env_file_content=dict(type="str", no_log=True),
            # The names of the secret variables, not their values.
            secret_env=dict(type="list", elements="str", default=["VLLM_API_KEY"], no_log=False),
            cwd=dict(type="path", default="/"),
            state=dict(
                type="str",
                choices=["started", "stopped", "restarted", "status"],
                default="started",
            ),
            layout=dict(type="list", elements="str"),
            port=dict(type="int"),
            pid_dir=dict(type="path", default=PID_DIR),
            manager=dict(type="str", choices=["auto"] + list(MANAGERS), default="auto"),
            pid_file=dict(type="path"),
            log_file=dict(type="path"),
            log_max_bytes=dict(type="int", default=104857600),
            log_backups=dict(type="int", default=3),
            stop_timeout=dict(type="int", default=30),
            start_check_seconds=dict(type="float", default=2),
            systemctl=dict(type="path"),
            supervisorctl=dict(type="path"),
            supervisor_conf_dir=dict(type="path"),
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
        ),
        required_if=[
            ("state", "started", ("command",)),
            ("state", "restarted", ("command",)),
        ],
        supports_check_mode=True,
    )
    params = module.params
    params["pid_file"] = params["pid_file"] or os.path.join(params["pid_dir"], params["name"] + ".pid")
    params["log_file"] = params["log_file"] or "/var/log/biv100-serving/%s.log" % params["name"]
    state, command = params["state"], params["command"]
    layout = params["layout"]
    if layout is not None and state in ("started", "restarted") and params["name"] not in layout:
        module.fail_json(msg="layout %s does not name %s, the engine to run" % (", ".join(layout), params["name"]))
    if command is not None and not command:
        module.fail_json(msg="command is empty")

    if params["env_file_content"] is not None and not params["env_file"]:
        module.fail_json(msg="env_file_content needs env_file, the file it is written to")
    matches = None
    if params["env_file_content"] is not None:
        matches = env_file_matches(params["env_file"], params["env_file_content"])
    try:
        environment = desired_environment(params, module.check_mode, module.warn)
    except EnvironmentProblem as error:
        module.fail_json(msg=str(error))
    desired_env = environment.merged if environment else None
    secrets = params["secret_env"]
    hide_secrets(module, secrets, desired_env)
    try:
        manager = choose_manager(params, module.run_command)
        engine, stale = manager.find(command)
    except EngineError as error:
        module.fail_json(msg=str(error), **error.extra)
    if environment and environment.overlap and manager.name == "systemd":
        # systemd lets EnvironmentFile= win over Environment=, the reverse of env over env_file.
        module.fail_json(
            msg="env and env_file %s both set %s: under systemd set each variable in one of them"
            % (params["env_file"], ", ".join(environment.overlap))
        )
    exposed = sorted(set(secrets) & set(params["env"]))
    if exposed and manager.name == "systemd" and state in ("started", "restarted"):
        module.fail_json(
            msg="env sets the secret %s, which systemd's unit file would show to every user: "
            "give it in env_file" % ", ".join(exposed)
        )
    before = engine.observed(desired_env) if engine else dict(NOT_RUNNING)
    hide_secrets(module, secrets, before["env"])
    drifted = drift(before, command, desired_env, manager.owns_whole_environment,
                    launched_command(params["pid_file"])) if engine else []

    definition = None
    if state in ("started", "restarted"):
        try:
            wanted = manager.definition(command, desired_env, environment.inline)
        except EngineError as error:
            module.fail_json(msg=str(error), **error.extra)
        if wanted is not None and wanted != manager.installed_definition():
            definition = wanted
            if engine is not None:
                drifted.append("%s differs from the desired one" % manager.definition_path)
    action = planned_action(state, engine, drifted)
    in_way = []
    if layout is not None and action in ("start", "restart"):
        devices = device_items(desired_env.get("CUDA_VISIBLE_DEVICES"))
        try:
            in_way = in_the_way(params, params["name"], params["port"], devices)
        except EngineError as error:
            module.fail_json(msg=str(error), **error.extra)
        except OSError as error:
            module.fail_json(msg="%s: finding the engines in its way: %s" % (params["name"], error))

    if stale:
        removes = state != "status" and not module.check_mode
        module.warn(
            "%s; that process is left alone%s"
            % (stale, ", the pid file removed" if removes else "")
        )
        if removes:
            remove_pid_files(params["pid_file"])
    env_file_stale = matches is False and state in ("started", "restarted")
    after = before
    try:
        if module.check_mode:
            retired = make_way(module, in_way, True)
        else:
            writes = action != "none" or definition is not None or env_file_stale or bool(in_way)
            # Only while the run holds the host's lock, checked under its flock (no take-over between).
            with fenced(params["state_dir"], writing="%s %s" % (ACTION_WORDS.get(action, "changing"), params["name"])) \
                    if writes else contextlib.nullcontext():
                after, retired = apply(
                    module, manager, action, engine, definition, desired_env, env_file_stale, in_way
                )
    except NotHeld as error:
        module.fail_json(msg=str(error), name=params["name"], action="none")
    except EngineError as error:
        module.fail_json(msg=str(error), **error.extra)
    except OSError as error:
        module.fail_json(msg="%s: %s" % (params["name"], error))

    result = dict(
        changed=action != "none" or definition is not None or env_file_stale or bool(retired),
        name=params["name"],
        action=action,
        manager=manager.name,
        env_file=params["env_file"],
        env_file_matches=matches,
        drift=drifted,
        log_file=params["log_file"],
        pid_file=params["pid_file"],
        retired=retired,
        msg=message(params["name"], manager.name, action, module.check_mode, after, retired),
        **after
    )
    if module._diff:
        result["diff"] = {
            "before": diff_view(before),
            "after": diff_view(desired_view(action, before, command, desired_env)),
        }
        if retired:
            result["diff"]["before"]["others"] = dict((entry["name"], "running") for entry in retired)
            result["diff"]["after"]["others"] = dict(
                (entry["name"], "retired" if entry["action"] == "retire" else "stopped") for entry in retired
            )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
