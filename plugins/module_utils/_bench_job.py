# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""engine_bench's job: the measurement runs in a worker detached from the module, so that the
module can return at once and later calls of it can show the run's progress while it goes,
then take its result - with nothing but the module's own calls between the controller and it.

    <temporary folder>/biv100-engine-bench-XXXXXXXX/    the job (0700, made by mkdtemp)
        running          held locked (flock) by the worker for as long as it runs
        worker.json      the worker's pid and the progress file it writes
        progress.json    the run so far, unless the task names its own progress file
        result.json      the module's result, written whole once the measurement ended

The worker is a fork of the module: the request bodies and the engine's key stay in its memory
and are never written to the job's folder. It reads the module's arguments from nowhere else,
imports nothing after the fork (the module's own files may be gone by then: Ansible removes
them when the module returns), holds none of the module's descriptors (Ansible's connection
waits until every holder of the module's output has closed it) and lives in a session of its
own, so that the end of the SSH session that started it does not reach it.

Runs on the host: standard library only, Python 3.8, Linux (fork, setsid, flock, /proc).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
import tempfile
import time
import traceback

from ansible_collections.biv100.serving.plugins.module_utils._state_store import atomic_write, read_json

JOB_PREFIX = "biv100-engine-bench-"
RUNNING = "running"
WORKER = "worker.json"
PROGRESS = "progress.json"
RESULT = "result.json"
# How often a status call looks for the result while it waits for the job to end.
WAIT_TICK_SECONDS = 0.1
# How long a stopped worker gets to end after SIGTERM, then after SIGKILL.
STOP_SECONDS = 5


class JobError(Exception):
    pass


def start(measure, progress_file=None):
    """Run measure(progress_path) -> the module's result in a detached worker; return
    (job_dir, pid) once the worker holds its lock, so that a status or stop call that follows
    at once finds it running."""
    job_dir = tempfile.mkdtemp(prefix=JOB_PREFIX)
    progress_path = progress_file or os.path.join(job_dir, PROGRESS)
    ready_read, ready_write = os.pipe()
    try:
        child = os.fork()
    except OSError as error:
        os.close(ready_read)
        os.close(ready_write)
        remove(job_dir)
        raise JobError("cannot start the benchmark worker: %s" % error)
    if child == 0:
        code = 1
        try:
            os.close(ready_read)
            os.setsid()
            if os.fork() == 0:
                _work(job_dir, measure, progress_path, ready_write)
            code = 0
        finally:
            # Never back into the module, whose exit would answer the controller a second time.
            os._exit(code)
    os.close(ready_write)
    os.waitpid(child, 0)
    # The pipe ends when the worker is ready and closes it, or when it died before.
    while os.read(ready_read, 64):
        pass
    os.close(ready_read)
    worker = _read(os.path.join(job_dir, WORKER))
    if not worker:
        remove(job_dir)
        raise JobError("the benchmark worker did not start")
    return job_dir, worker["pid"]


def _work(job_dir, measure, progress_path, ready):
    """The worker: detach, lock, record itself, measure, write the result; never returns."""
    code = 1
    try:
        _detach(keep=ready)
        lock = os.open(os.path.join(job_dir, RUNNING), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write(os.path.join(job_dir, WORKER), {"pid": os.getpid(), "progress_file": progress_path})
        os.close(ready)
        try:
            result = measure(progress_path)
        except Exception as error:
            result = {"failed": True, "msg": "the benchmark worker failed: %s" % (str(error) or type(error).__name__),
                      "exception": traceback.format_exc()}
        _write(os.path.join(job_dir, RESULT), result)
        code = 0
    finally:
        os._exit(code)


def _detach(keep):
    """/dev/null as stdin, stdout and stderr, every other descriptor but `keep` closed, / as
    the working folder."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already
    os.chdir("/")


def _write(path, document):
    atomic_write(path, json.dumps(document).encode("utf-8"), mode=0o600)


def _read(path):
    """A JSON document, or None when the file is not there or is not JSON (a progress file the
    task named may hold anything)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def check(job_dir):
    """Refuse a folder that is not a job of this user's; JobError also when it is gone."""
    if not os.path.isabs(job_dir) or not os.path.basename(job_dir).startswith(JOB_PREFIX):
        raise JobError("%s is not the folder of an engine_bench job" % job_dir)
    try:
        found = os.lstat(job_dir)
    except OSError as error:
        raise JobError("%s: the engine_bench job's folder is gone (%s)" % (job_dir, error.strerror))
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
        raise JobError("%s is not a private folder of this user's, as an engine_bench job's is" % job_dir)


def running(job_dir):
    """Whether the job's worker still runs: it holds the lock until it ends, however it ends."""
    try:
        fd = os.open(os.path.join(job_dir, RUNNING), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return False
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def status(job_dir, wait):
    """Wait up to `wait` seconds for the job to end. Ended: its result, and the folder is
    removed; else the run so far (None before the first progress)."""
    check(job_dir)
    deadline = time.monotonic() + wait
    while True:
        result = _read(os.path.join(job_dir, RESULT))
        if result is None and not running(job_dir):
            # Written between the two looks, or never: the worker was killed.
            result = _read(os.path.join(job_dir, RESULT))
            if result is None:
                pid = (_read(os.path.join(job_dir, WORKER)) or {}).get("pid")
                remove(job_dir)
                raise JobError("the benchmark worker (pid %s) ended without a result" % pid)
        if result is not None:
            remove(job_dir)
            return {"finished": True, "result": result}
        if time.monotonic() >= deadline:
            break
        time.sleep(WAIT_TICK_SECONDS)
    worker = _read(os.path.join(job_dir, WORKER)) or {}
    return {"finished": False, "progress": _read(worker.get("progress_file") or os.path.join(job_dir, PROGRESS))}


def stop(job_dir):
    """End the job's worker if it runs (SIGTERM, then SIGKILL) and remove its folder; whether
    a worker was stopped. A job already gone is nothing to stop."""
    try:
        check(job_dir)
    except JobError:
        if os.path.lexists(job_dir):
            raise
        return False
    stopped = False
    pid = (_read(os.path.join(job_dir, WORKER)) or {}).get("pid")
    if isinstance(pid, int) and running(job_dir):
        # The lock is held, so its holder - the pid the worker recorded - is alive: the pid
        # cannot belong to another process yet.
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + STOP_SECONDS
            while running(job_dir) and time.monotonic() < deadline:
                time.sleep(WAIT_TICK_SECONDS)
            if not running(job_dir):
                break
        stopped = True
    remove(job_dir)
    return stopped


def remove(job_dir):
    """The job's folder and what is in it (files only: a job has no subfolder)."""
    try:
        names = os.listdir(job_dir)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return
        raise
    for name in names:
        try:
            os.unlink(os.path.join(job_dir, name))
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise
    os.rmdir(job_dir)


def follow(module):
    """engine_bench's _job status or stop, answered through its AnsibleModule: the job's
    progress, its result once it ended, or its end."""
    params = module.params
    if not params["_job_dir"]:
        module.fail_json(msg="_job %s needs _job_dir, the folder _job start returned" % params["_job"])
    try:
        if params["_job"] == "stop":
            stopped = stop(params["_job_dir"])
            module.exit_json(changed=stopped, stopped=stopped,
                             msg="the benchmark worker was stopped" if stopped else "no benchmark worker ran")
        found = status(params["_job_dir"], params["_job_wait"] or 0)
    except JobError as error:
        # A worker that ended without a result leaves no job to follow.
        module.fail_json(msg=str(error), finished=not os.path.lexists(params["_job_dir"]))
    if not found["finished"]:
        module.exit_json(changed=False, finished=False, progress=found["progress"])
    result = dict(found["result"], finished=True)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)
