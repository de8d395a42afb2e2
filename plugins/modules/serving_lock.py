#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_lock
short_description: Hold a host for one deployment run; refuse a concurrent one, naming its holder
version_added: 0.1.0
description:
  - Takes (O(state=present)) or releases (O(state=absent)) the run lock C(<state_dir>/lock) of
    a host. The lock names its holder; a deployment that finds it held by another run fails
    with that holder's run id, user, controller, process, playbook, release and start time.
  - Taking the lock again in the run that holds it changes nothing, so every play of a
    deployment can take it.
  - A run holds several hosts in two rounds. O(state=taking) marks each host's lock as this
    run's but still being taken; once every host is taken, O(state=present) marks it held. A
    run that finds another run still taking a host waits for it (up to O(wait) seconds from when
    that run began taking it) when that run is the older, and is refused at once when it is the younger; a run refused at one
    host gives back the others. Runs started together therefore end with exactly one of them
    holding every host it wants, whatever order their tasks ran in, since a run only ever waits
    for an older one. Runs are ordered by their O(run_id) (the playbooks begin it with the
    run's start time).
  - The action of the same name, on the controller, says who holds the lock (this
    controller's host name, the user, the C(ansible-playbook) process). When the holder is a
    run started on this same controller whose C(ansible-playbook) process no longer runs (a
    crashed or killed deployment), it takes the lock over and warns, naming that run. A lock
    left by a run on another controller is only taken over with O(break_lock=true).
  - A lock is never taken over while its holder still has processes on the host. A killed
    C(ansible-playbook) leaves its workers running on the controller, and they can still be
    running a module on the host. The playbooks mark every module of a lock-taking play with
    the run's id in the variable C(BIV100_SERVING_RUN) of its environment (a play-level
    C(environment)). Before it takes a lock over, the module looks in C(/proc) for processes
    that carry the holder's id and see this host's O(state_dir). It refuses while one runs,
    naming each by pid, command and start time, and says how to end them.
  - The collection's modules that write fence their writes with the lock - under the same
    C(flock), each refuses unless the lock names the run its C(BIV100_SERVING_RUN) names - so a
    run whose lock was taken over changes nothing more on the host.
  - Looking at the lock and changing it happen under an C(flock) of the state directory, so
    two deployments starting at the same instant cannot both take it; the lock is written
    through a temporary file and a rename, so it is never seen half-written.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  run_id:
    description:
      - The id of this deployment run, the same on every host; make it once per run (for
        instance with C(run_once) on the controller).
    type: str
    required: true
  state:
    description:
      - Hold the lock for this run (V(present)), mark it taken but still being taken with the
        run's other hosts (V(taking)), or release it (V(absent)).
      - V(present) on a lock this run is taking marks it held.
    type: str
    choices: [present, taking, absent]
    default: present
  wait:
    description:
      - How long an older run may take the lock, in seconds from when it began, before this run
        stops waiting for it and is refused. A run still taking after that is stuck or gone (its
        two rounds take seconds); the action then judges it as it does a held lock.
    type: int
    default: 60
  playbook:
    description: The playbook running the deployment, named in refusals.
    type: str
  release:
    description: The release being deployed, named in refusals.
    type: str
  break_lock:
    description:
      - Take the lock over from whichever run holds it, for a lock left by a run that is gone
        but cannot be proven gone from here (it ran on another controller).
      - Refused while the holder's C(ansible-playbook) process may still run on this
        controller (the holder names this controller, and its pid is a live process running
        C(ansible-playbook) or one whose command line cannot be read), and while the host still
        runs processes of the holder (see the description).
      - The playbooks map C(-e serving_lock_break=true) to it.
    type: bool
    default: false
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - biv100.serving.state_store
attributes:
  action:
    support: full
    details:
      - The action of the same name names the run, takes over a dead run's lock and decides
        O(break_lock) with what the controller sees; it passes the host half internal
        C(_)-prefixed options of its own, which tasks do not give.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details:
      - Writes nothing; a lock held by another run still fails, so that a check run detects a
        concurrent deployment, and so does a takeover refused because the holder still runs.
  diff_mode:
    support: full
    details:
      - The lock's content before and after.
notes:
  - The controller's C(ansible-playbook) process is the parent of the worker process that runs
    the action (ansible-core forks its workers from it), so a holder's C(pid) lives exactly as
    long as its run.
  - Releasing a lock another run holds leaves it in place, with a warning.
  - Processes are found only where this module may read their environment
    (C(/proc/<pid>/environ)), those of its own user or, as root, every one; run the
    deployments as one user.
seealso:
  - module: biv100.serving.serving_overlay
"""

EXAMPLES = r"""
- name: Name the run
  hosts: biv100
  gather_facts: false
  tasks:
    - name: Make one id for this run
      ansible.builtin.set_fact:
        serving_run_id: "{{ now(utc=true, fmt='%Y%m%dT%H%M%SZ') }}-{{ 99999 | random }}"
      run_once: true

- name: Deploy under the lock
  hosts: biv100
  gather_facts: false
  # Every module of the play carries the run's id: a later run finds them if this one is killed.
  environment:
    BIV100_SERVING_RUN: "{{ serving_run_id }}"
  tasks:
    - name: Hold the host for this deployment
      biv100.serving.serving_lock:
        run_id: "{{ serving_run_id }}"
        playbook: "{{ ansible_play_name }}"
        release: "{{ serving_release }}"
        break_lock: "{{ serving_lock_break | default(false) | bool }}"

    - name: Let the next deployment in
      biv100.serving.serving_lock:
        run_id: "{{ serving_run_id }}"
        state: absent
"""

RETURN = r"""
lock:
  description: The path of the lock.
  returned: always
  type: str
  sample: /var/lib/biv100-serving/lock
holder:
  description:
    - Who holds the lock after the task; when the task is refused, the run holding it.
    - Null when the lock is free. C(taking) is true while that run is still taking its hosts.
  returned: always
  type: dict
  sample:
    run_id: 20260509T073525Z-4711
    controller: ctl1
    user: deploy
    pid: 48213
    playbook: deploy.yml
    release: sub510
    acquired_at: "2026-05-09T07:35:26Z"
holder_processes:
  description:
    - The processes of the holder that still run on the host, when they kept the task from
      taking the lock over; the command is shortened to file names (a module piped to its
      interpreter shows as the interpreter alone).
  returned: when a takeover was refused because the holder still runs on the host
  type: list
  elements: dict
  sample:
    - pid: 48377
      command: python3 AnsiballZ_engine_health.py
      started_at: "2026-05-09T07:36:02Z"
previous_holder:
  description: The run this task took the lock over from (O(break_lock), or a stale holder).
  returned: when the lock was taken over
  type: dict
  sample:
    run_id: 20260508T221003Z-118
    controller: ctl1
    user: deploy
    pid: 40017
    playbook: deploy.yml
    release: sub509
    acquired_at: "2026-05-08T22:10:04Z"
"""

import calendar
import contextlib
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._run_lock import (
    describe,
    lock_text,
    read_holder,
    serialised,
)
from ansible_collections.biv100.serving.plugins.module_utils._run_processes import (
    describe_processes,
    run_processes,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    TIMESTAMP_FORMAT,
    StateDir,
    fsync_dir,
    utc_timestamp,
    write_json,
)

# How often a run waiting for an older one looks at the lock again.
POLL_SECONDS = 0.2


def our_holder(params):
    holder = {
        "run_id": params["run_id"],
        "controller": params["_controller"],
        "user": params["_user"],
        "pid": params["_pid"],
        "playbook": params["playbook"],
        "release": params["release"],
        "acquired_at": utc_timestamp(),
    }
    if params["state"] == "taking":
        holder["taking"] = True
    return holder


def may_take_over(params, holder):
    """Whether this task may take the lock from holder.

    The action names the one run it found stale, or the operator declared stale with
    break_lock (_break_stale), rather than asking for break_lock, so that a live run which took
    the lock since is not overrun.
    """
    named = params["_break_stale"]
    return params["break_lock"] or (named is not None and holder.get("run_id") == named)


def refuse_while_it_runs(module, path, holder):
    """Fail when the holder still has processes working on this host: its lock is not over."""
    processes = run_processes(holder.get("run_id"), os.path.dirname(path))
    if not processes:
        return
    module.fail_json(
        msg="%s is held by %s, which still runs on this host: %s. The lock is not taken over "
        "while they run: end that run's leftover ansible-playbook workers on %s, then wait for "
        "these processes to end or end them (kill %s), and run again"
        % (
            path,
            describe(holder),
            describe_processes(processes),
            holder.get("controller") or "its controller",
            " ".join(str(process["pid"]) for process in processes),
        ),
        lock=path,
        holder=holder,
        holder_processes=processes,
    )


def older(holder, run_id):
    """Whether the run holding the lock is older than run_id. Run ids begin with the run's start
    time, so this is the runs' order; two begun in the same second are ordered by the rest of
    their ids, the same way on every host, which is all the two rounds need."""
    return str(holder.get("run_id")) < run_id


def waits_for(params, holder, ours):
    """Whether this run waits for the holder: an older run still taking its hosts, which will
    hold them all or give them all back, once its round ends."""
    return (
        holder is not None
        and holder.get("taking") is True
        and holder.get("run_id") != ours["run_id"]
        and older(holder, ours["run_id"])
        and not may_take_over(params, holder)
    )


def taking_since(holder):
    """When the holder began taking the lock (seconds since the epoch), None when it does not say."""
    try:
        return calendar.timegm(time.strptime(str(holder.get("acquired_at") or ""), TIMESTAMP_FORMAT))
    except ValueError:
        return None


def acquire(module, path, ours, exclusive):
    """Take the lock for ours, after waiting for an older run still taking it.

    An older run gets `wait` seconds from when it began taking the host (from when this run
    began waiting, when its lock does not say): its two rounds take seconds, so one still taking
    after that is stuck or gone, and is refused at once, for the action to judge.
    """
    began_waiting = time.time()
    while True:
        with exclusive():
            holder = read_holder(path)
            if not waits_for(module.params, holder, ours):
                return settle(module, path, ours, holder)
            since = taking_since(holder)
            if time.time() >= (began_waiting if since is None else since) + module.params["wait"]:
                return settle(module, path, ours, holder)
        # Outside the flock: the older run's own tasks need it to go on.
        time.sleep(POLL_SECONDS)


def settle(module, path, ours, holder):
    if holder is not None:
        if holder.get("run_id") == ours["run_id"]:
            return ours_already(module, path, ours, holder)
        if not may_take_over(module.params, holder):
            module.fail_json(
                msg="%s is held by %s" % (path, describe(holder)), lock=path, holder=holder
            )
        refuse_while_it_runs(module, path, holder)
    if not module.check_mode:
        write_json(path, ours)
    return taken(path, ours, holder)


def ours_already(module, path, ours, holder):
    """This run has the lock: held stays held, and a lock it was taking becomes held."""
    if not holder.get("taking") or ours.get("taking"):
        return dict(changed=False, holder=holder, msg="this run holds the lock")
    held = {key: value for key, value in holder.items() if key != "taking"}
    if not module.check_mode:
        write_json(path, held)
    diff = {"before_header": path, "after_header": path, "before": lock_text(holder), "after": lock_text(held)}
    return dict(changed=True, holder=held, msg="this run holds the lock, taken with its other hosts", diff=diff)


def taken(path, ours, previous):
    verb = "is taking" if ours.get("taking") else "took"
    result = dict(changed=True, holder=ours, msg="this run %s the lock" % verb)
    if previous is not None:
        result.update(
            previous_holder=previous, msg="this run %s the lock over from %s" % (verb, describe(previous))
        )
    result["diff"] = {
        "before_header": path,
        "after_header": path,
        "before": lock_text(previous),
        "after": lock_text(ours),
    }
    return result


def release(module, path, run_id):
    holder = read_holder(path)
    if holder is None:
        return dict(changed=False, holder=None, msg="the lock is free")
    if holder.get("run_id") != run_id:
        module.warn("%s is held by %s, not by this run: left in place" % (path, describe(holder)))
        return dict(changed=False, holder=holder, msg="another run holds the lock")
    if not module.check_mode:
        remove(path)
    diff = {"before_header": path, "after_header": path, "before": lock_text(holder), "after": ""}
    return dict(changed=True, holder=None, msg="this run released the lock", diff=diff)


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        return  # gone already: released is what we wanted
    fsync_dir(os.path.dirname(path))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_id=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "taking", "absent"], default="present"),
            wait=dict(type="int", default=60),
            playbook=dict(type="str"),
            release=dict(type="str"),
            break_lock=dict(type="bool", default=False),
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            # Set by the action of the same name: who runs the deployment, on which controller.
            _controller=dict(type="str"),
            _user=dict(type="str"),
            _pid=dict(type="int"),
            _break_stale=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    store = StateDir(params["state_dir"])
    path = store.lock

    # Check mode writes nothing, so it has nothing to serialise.
    def exclusive():
        return contextlib.nullcontext() if module.check_mode else serialised(store.root)

    try:
        if params["state"] == "absent":
            with exclusive():
                result = release(module, path, params["run_id"])
        else:
            result = acquire(module, path, our_holder(params), exclusive)
    except OSError as error:
        module.fail_json(msg="%s: %s" % (error.filename or path, error.strerror), lock=path)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(lock=path, **result)


if __name__ == "__main__":
    main()
