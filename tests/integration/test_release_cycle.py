"""One release's whole cycle on a lab of one host, as a team runs it: deploy.yml with every gate
of the competition (the bench's detached worker included), verify.yml, then rollback.yml to the
vendor's files. The controller is the ansible-core of the environment pytest runs in, so that
`make integration-2.21` (.venv-2.21/bin/pytest) proves the cycle on ansible-core 2.21, the other
line meta/runtime.yml declares; `make integration` runs it on the first line with the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.release import __version__ as ansible_version
from lab_files import REPO, STATE, current_release, digest, package_file, recorded
from lab_guard import built_lab
from playbook_runs import run_playbook

pytestmark = pytest.mark.lab

# The competition's gates, as the gates role applies them by default.
COMPETITION = yaml.safe_load((REPO / "roles" / "serving" / "defaults" / "main.yml").read_text())["serving_competition"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from built_lab(tmp_path_factory, n_hosts=1)


def test_deploy_verify_and_rollback_with_this_controller(lab, tmp_path):
    # The playbooks run with the ansible-core this interpreter imports (playbook_runs starts the
    # ansible-playbook beside it).
    shown = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "--version"],
                           capture_output=True, text=True, check=True).stdout
    assert f"[core {ansible_version}]" in shown.splitlines()[0], shown
    [host] = lab.hosts

    deployed = run_playbook("deploy.yml", lab.inventory_path, tmp_path / "deploy",
                            extravars={"serving_release": "sub510", "serving_gates": COMPETITION})
    assert deployed.rc == 0, deployed.stdout()[-3000:]
    record = current_release(host)
    assert record["id"] == "sub510" and record["status"] == "good"
    bench = recorded(record, "gates")["bench"]
    assert bench["gate"] == {"score": 8000, "passed": True} and bench["simulated"] is True
    assert bench["requests"]["ok"] > 0 and bench["requests"]["failed"] == 0
    figures = json.loads((REPO / "build" / "bench" / "sub510" / f"{host.name}.json").read_text())
    assert figures["score"] == bench["score"] and figures["quality"]["passed"] is True
    # Held to the vendor's base, scored before the payload went in.
    assert recorded(record, "gates")["quality"]["baseline"]["release"] == "base"

    verified = run_playbook("verify.yml", lab.inventory_path, tmp_path / "verify")
    assert verified.rc == 0 and not verified.hosts_with("changed"), verified.stdout()[-3000:]

    rolled_back = run_playbook("rollback.yml", lab.inventory_path, tmp_path / "rollback",
                               extravars={"serving_rollback_to": "base"})
    assert rolled_back.rc == 0, rolled_back.stdout()[-3000:]
    assert not host.path(f"{STATE}/current").is_symlink()
    overlaid = json.loads(host.path(f"{STATE}/base/index.json").read_text())
    assert overlaid and {path: digest(package_file(host, path)) for path in overlaid} == {
        path: host.package_sha256.get(path) for path in overlaid}
