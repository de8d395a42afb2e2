"""What every benchmark here needs: the collection and the lab's helpers on the path, a folder of
its own for the labs it builds (once no lab is up: the benchmark's lab takes lab 0's network and
shares the machine's cores with nothing else of ours), and a playbook run timed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "collections"), str(REPO / "tests" / "lab")]

import lab as lab_builder  # noqa: E402


@contextlib.contextmanager
def work_dir(prefix: str) -> Iterator[Path]:
    """A temporary folder for the benchmark's labs and files, removed after; exits naming the
    lab if one is up."""
    running = lab_builder.running_lab_dir()
    if running:
        sys.exit(f"a lab is up in {running}: take it down first (make lab-down)")
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        yield Path(work)


def timed_playbook(playbook: str, inventory: Path, extravars: dict, options: list[str],
                   checkout: Path = REPO, task_times: Path | None = None) -> float:
    """Seconds one playbook run of `checkout` (its ansible.cfg, so its own collection) takes;
    with task_times, each task's seconds are appended there (callbacks/task_times.py)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(checkout / "ansible.cfg"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if task_times is not None:
        # Beside the ledger callback ansible.cfg enables, which every run of the collection has.
        env.update(ANSIBLE_CALLBACK_PLUGINS=str(REPO / "benchmarks" / "callbacks"),
                   ANSIBLE_CALLBACKS_ENABLED="biv100.serving.ledger,task_times", BIV100_TASK_TIMES=str(task_times))
    command = ["ansible-playbook", playbook, "-i", str(inventory), "-e", json.dumps(extravars), *options]
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if finished.returncode:
        sys.exit(f"{playbook} failed:\n{finished.stdout[-3000:]}")
    return time.perf_counter() - started
