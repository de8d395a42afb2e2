"""Shared set-up of the unit tests: the real vLLM source trees, and copies of the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import vllm_sources  # tests/lab is on the path through pytest.ini, like the collection

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def vllm_trees():
    """The `vllm/` package folder of each release in LAYOUT_VERSIONS, fetched once and cached."""
    return {
        version: vllm_sources.ensure_tree(version) / "vllm"
        for version in vllm_sources.LAYOUT_VERSIONS
    }


@pytest.fixture(scope="session")
def checkout_copy():
    """copy(destination): the files a clean checkout of this working tree has (tracked, and new ones
    not ignored), as they are now, copied to destination. Tests of what the collection packs work
    on a copy, so that nothing else a tool left in the tree, or a file changed meanwhile, counts."""

    def copy(destination: Path) -> Path:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            source, target = REPO / name, destination / name
            if not source.is_symlink() and not source.exists():
                continue  # deleted in the working tree
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_symlink():
                os.symlink(os.readlink(source), target)
            else:
                shutil.copy2(source, target)
        return destination

    return copy


@pytest.fixture
def started_process():
    """start(argv, env=None): a Popen of argv in a session of its own, returned once the child
    runs argv (between fork and exec, and while exec swaps the image, /proc/<pid>/cmdline and
    environ are the parent's or empty, so a test asserting on either must not look earlier).
    Killed at teardown. The wait is long: a loaded machine may take seconds to exec."""
    started = []

    def start(argv, seconds=30.0, env=None):
        process = subprocess.Popen(argv, start_new_session=True, env=env)
        started.append(process)
        wanted = "\0".join(argv).encode() + b"\0"
        deadline = time.monotonic() + seconds
        while True:
            with open("/proc/%d/cmdline" % process.pid, "rb") as stream:
                if stream.read() == wanted:
                    return process
            if time.monotonic() > deadline:
                raise AssertionError("%r did not start within %.0f s" % (argv, seconds))
            time.sleep(0.005)

    yield start
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def loopback_server():
    """serve(handler_class) -> (url, server): an HTTP server on a free loopback port, answering
    from its own threads, shut down at teardown. Tests keep what they record on the server."""
    servers = []

    def serve(handler_class):
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return "http://127.0.0.1:%d" % server.server_address[1], server

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


# A module's main() in a Python process of its own, its arguments given as Ansible gives them.
MODULE_PROCESS = """
import importlib, json, sys
from ansible.module_utils.testing import patch_module_args
module = importlib.import_module(sys.argv[1])
with patch_module_args(json.loads(sys.stdin.read())):
    module.main()
"""


@pytest.fixture
def module_process(tmp_path):
    """run(module, args, timeout=30) -> (failed, result): the module (its import name) run as on a
    host, in a process of its own whose output is read to its end: for modules that leave a
    process behind, which must hold none of the module's output (Ansible's connection waits
    until every holder has closed it, and so does this). Its temporary files go to the test's
    folder."""
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "collections"), os.environ.get("PYTHONPATH")])))

    def run(module: str, args: dict, timeout: float = 30) -> tuple[bool, dict]:
        done = subprocess.run([sys.executable, "-c", MODULE_PROCESS, module], input=json.dumps(args), env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        try:
            return done.returncode != 0, json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"{module} answered no JSON: {done.stdout}{done.stderr}") from None

    return run
