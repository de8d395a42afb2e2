"""Run the project's playbooks through ansible-runner and read what happened per host."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner
from lab import descendants

REPO = Path(__file__).resolve().parents[2]
# The gates the integration tests' runs hold a release to, unless a test names its own: the
# functional gate. The quality and throughput gates are proven in test_gates.py, which names the
# competition's; measuring them on every deploy of the other tests would add minutes to the
# suite for no check of theirs.
FUNCTIONAL_GATE_ONLY = {"functional": {"min_probes": 50}}
# All hosts in one batch: a run that tests staging, the engine or the gates, not the canary
# rollout, takes half the time. The canary's own tests (test_rollback.py) keep the default.
ONE_BATCH = {"serving_serial": ["100%"]}
# ansible-runner starts `ansible-playbook` from PATH: make it the one beside this interpreter.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@dataclass
class PlaybookRun:
    rc: int
    stats: dict
    events: list[dict] = field(repr=False)

    def hosts_with(self, outcome: str) -> set[str]:
        """Hosts counted under `outcome` (ok, changed, failures, dark, skipped) in the recap."""
        return {host for host, count in (self.stats.get(outcome) or {}).items() if count}

    def failures(self, host: str) -> list[dict]:
        return [
            event["event_data"]["res"]
            for event in self.events
            if event.get("event") == "runner_on_failed" and event["event_data"].get("host") == host
        ]

    def failure_messages(self, host: str) -> list[str]:
        return [str(result.get("msg", "")) for result in self.failures(host)]

    def stdout(self) -> str:
        """What ansible-playbook printed, the callbacks' lines included."""
        return "\n".join(event["stdout"] for event in self.events if event.get("stdout"))

    def results(self, host: str, task: str) -> list[dict]:
        """Results of the tasks named `task` on `host`, in the order they ran."""
        return [
            event["event_data"]["res"]
            for event in self.events
            if event.get("event") in ("runner_on_ok", "runner_on_failed")
            and event["event_data"].get("host") == host
            and event["event_data"].get("task") == task
        ]


def run_playbook(playbook: str, inventory: Path, tmp_path: Path, *, extravars: dict | None = None,
                 limit: str | None = None, check: bool = False) -> PlaybookRun:
    runner = ansible_runner.run(**_runner_arguments(playbook, inventory, tmp_path, extravars, limit, check))
    return _outcome(runner)


@dataclass
class RunningPlaybook:
    """A playbook run going on in the background, for tests that act on the lab meanwhile."""

    thread: object = field(repr=False)
    runner: object = field(repr=False)

    def running(self) -> bool:
        return self.thread.is_alive()

    def wait(self, timeout: float = 600) -> PlaybookRun:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"the playbook still runs after {timeout} s")
        return _outcome(self.runner)


def start_playbook(playbook: str, inventory: Path, tmp_path: Path, *, extravars: dict | None = None,
                   limit: str | None = None) -> RunningPlaybook:
    thread, runner = ansible_runner.run_async(**_runner_arguments(playbook, inventory, tmp_path, extravars, limit, False))
    return RunningPlaybook(thread, runner)


def _runner_arguments(playbook, inventory, tmp_path, extravars, limit, check) -> dict:
    private_data_dir = tmp_path / "runner"
    private_data_dir.mkdir(parents=True)
    return dict(
        private_data_dir=str(private_data_dir),
        project_dir=str(REPO),
        playbook=str(REPO / playbook),
        inventory=str(inventory),
        # The ledger goes to the test's folder, not into the project's ledger/lab/.
        envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "BIV100_LEDGER_DIR": str(tmp_path / "ledger")},
        extravars={"serving_gates": FUNCTIONAL_GATE_ONLY, **(extravars or {})},
        limit=limit,
        cmdline="--check" if check else None,
        quiet=True,
    )


def _outcome(runner) -> PlaybookRun:
    return PlaybookRun(rc=runner.rc, stats=runner.stats or {}, events=list(runner.events))


def kill_controller(controller: subprocess.Popen) -> None:
    """SIGKILL an ansible-playbook started in a session of its own, as an operator's `kill -9`,
    and the workers it forked. ansible-core's workers leave the controller's session, so they
    are found by parentage before the kill and ended by their recorded pids along with it."""
    workers = descendants(controller.pid)
    with contextlib.suppress(ProcessLookupError):  # a run that ended first has no group left
        os.killpg(controller.pid, signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    controller.wait()


def ended(condition, timeout=60) -> bool:
    """Wait until condition() holds, at most timeout seconds; whether it did."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
