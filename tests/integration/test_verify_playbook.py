"""verify.yml against the lab: green and changed=0 on a healthy fleet; each kind of drift fails
exactly the host it was made on, naming it."""

from __future__ import annotations

import pytest

from playbook_runs import run_playbook

from ansible_collections.biv100.serving.plugins.filter.engine_cli_args import SUB168

pytestmark = pytest.mark.lab

VERIFY = "verify.yml"
FINDINGS_TASK = "Report every finding"
CHAT = "entrypoints/openai/serving_chat.py"
PROTECTED = "sequence.py"


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    run = run_playbook("deploy.yml", lab.inventory_path, tmp_path_factory.mktemp("deploy"),
                       extravars={"serving_release": "sub600"})
    assert run.rc == 0, run.stats
    return lab


def findings(run, host) -> list[str]:
    (result,) = run.results(host.name, FINDINGS_TASK)
    return result["msg"] if isinstance(result["msg"], list) else []


def test_a_healthy_fleet_is_green_and_nothing_changes(deployed, tmp_path):
    run = run_playbook(VERIFY, deployed.inventory_path, tmp_path)

    assert run.rc == 0 and not run.hosts_with("changed"), run.stats
    for host in deployed.hosts:
        (result,) = run.results(host.name, FINDINGS_TASK)
        assert result["msg"].startswith("healthy: sub600 as deployed")


def test_each_drift_fails_exactly_its_host_and_names_it(deployed, tmp_path):
    untouched, edited, guarded, restarted = deployed.hosts
    chat = edited.path(f"{edited.package_root}/{CHAT}")
    chat.write_text(chat.read_text() + "# edited by hand\n")
    protected = guarded.path(f"{guarded.package_root}/{PROTECTED}")
    protected.write_text(protected.read_text() + "# edited by hand\n")
    other = dict(SUB168, gpu_memory_utilization=0.9)
    moved = run_playbook("deploy.yml", deployed.inventory_path, tmp_path / "moved",
                         limit=restarted.name, extravars={"serving_release": "sub600", "engine_args": other})
    assert moved.rc == 0, moved.stats

    run = run_playbook(VERIFY, deployed.inventory_path, tmp_path / "verify")

    assert run.rc != 0 and not run.hosts_with("changed")
    assert run.hosts_with("failures") == {edited.name, guarded.name, restarted.name}
    (edit,) = findings(run, edited)
    assert edit.startswith(f"serving file drift from release sub600: {CHAT}: installed ")
    (guard,) = findings(run, guarded)
    assert guard.startswith("model layer: ") and PROTECTED in guard
    (engine,) = findings(run, restarted)
    assert engine == "engine drift: argument --gpu-memory-utilization: running 0.9, desired 0.95"
