"""deploy.yml against the lab: the payload lands where it applies, once, and nowhere else.

The module's lab is shared by the tests below in order: the first deploys, the next ones
build on that state (a second run changes nothing; hostile payloads change nothing; an
interrupted run converges).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from playbook_runs import REPO, run_playbook

DEPLOY = "deploy.yml"
STATE = "/var/lib/biv100-serving"
REGISTRY = "model_executor/models/registry.py"
CHAT = "entrypoints/openai/serving_chat.py"
PROTOCOL = "entrypoints/openai/protocol.py"
PAYLOAD = REPO / "files" / "serving"

pytestmark = pytest.mark.lab


def host_of(lab, variant):
    return next(host for host in lab.hosts if host.variant == variant)


def package_file(host, path) -> Path:
    return host.path(f"{host.package_root}/{path}")


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def serving_digests(lab) -> dict[str, str | None]:
    return {f"{host.name}:{path}": digest(package_file(host, path))
            for host in lab.hosts for path in (REGISTRY, CHAT, PROTOCOL)}


def host_state(lab) -> dict[str, str]:
    """Every file under each host's state dir and vllm package, with its digest."""
    files = {}
    for host in lab.hosts:
        for top in (STATE, host.package_root):
            root = host.path(top)
            for path in sorted(root.rglob("*")) if root.exists() else ():
                if path.is_file() and "__pycache__" not in path.parts:
                    files[f"{host.name}:{path}"] = digest(path)
    return files


def current_release(host) -> dict:
    link = host.path(f"{STATE}/current")
    return json.loads((link.parent / os.readlink(link) / "release.json").read_text())


@pytest.fixture(scope="module")
def first_deploy(lab, tmp_path_factory):
    return run_playbook(DEPLOY, lab.inventory_path, tmp_path_factory.mktemp("first"),
                        extravars={"serving_release": "sub510"})


def test_the_payload_lands_where_it_applies(lab, first_deploy):
    assert first_deploy.rc == 0, first_deploy.stats
    assert first_deploy.hosts_with("changed") == {host.name for host in lab.hosts}
    for host in lab.hosts:
        built = host.package_sha256
        record = current_release(host)
        assert record["id"] == "sub510" and record["status"] == "pending"
        # The registry is patched only where the base lacks the model's architecture.
        registry_changed = host.variant == "vendor-unregistered"
        assert (digest(package_file(host, REGISTRY)) != built[REGISTRY]) == registry_changed
        assert digest(package_file(host, CHAT)) != built[CHAT]
        assert digest(package_file(host, PROTOCOL)) != built[PROTOCOL]
        assert sorted(record["changed_files"]) == sorted(
            [CHAT, PROTOCOL] + ([REGISTRY] if registry_changed else []))
        # The vendor's files are kept before their first overwrite.
        for path in record["changed_files"]:
            assert digest(host.path(f"{STATE}/base/{path}")) == built[path]


def test_the_patched_registry_serves_qwen3_5_where_it_did_not(lab, first_deploy, tmp_path):
    host = host_of(lab, "vendor-unregistered")
    registry = package_file(host, REGISTRY).read_text()
    assert '"Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration")' in registry
    facts = run_playbook("playbooks/facts.yml", lab.inventory_path, tmp_path, limit=host.name)
    (summary,) = facts.results(host.name, "Show what the host has")
    assert summary["msg"][2] == "model /opt/models/qwen3_5: Qwen3_5ForConditionalGeneration, served: yes"


def test_no_protected_byte_changed_and_the_baseline_is_what_the_lab_built(lab, first_deploy):
    for host in lab.hosts:
        baseline = json.loads(host.path(f"{STATE}/baseline/protected.json").read_text())
        assert baseline["files"], host.name
        for path, sha in baseline["files"].items():
            assert sha == host.package_sha256.get(path), (host.name, path)
            assert digest(package_file(host, path)) == sha


def test_a_second_run_changes_nothing(lab, first_deploy, tmp_path):
    before = host_state(lab)
    again = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={"serving_release": "sub510"})
    assert again.rc == 0 and not again.hosts_with("changed"), again.stats
    assert host_state(lab) == before


def test_a_run_without_a_submission_id_makes_no_release_when_nothing_differs(lab, first_deploy, tmp_path):
    again = run_playbook(DEPLOY, lab.inventory_path, tmp_path)
    assert again.rc == 0 and not again.hosts_with("changed"), again.stats
    assert {current_release(host)["id"] for host in lab.hosts} == {"sub510"}


def test_check_mode_of_a_new_payload_reports_and_writes_nothing(lab, first_deploy, tmp_path):
    payload = copy_payload(tmp_path)
    overlay(payload, "mine", "reasoning/mine_parser.py", "PARSER = 'mine'\n")
    before = host_state(lab)
    checked = run_playbook(DEPLOY, lab.inventory_path, tmp_path,
                           extravars={"serving_release": "sub511", "stage_payload_dir": str(payload)},
                           check=True)
    assert checked.rc == 0, checked.stats
    for host in lab.hosts:
        (staged,) = checked.results(host.name, "Stage the serving-layer payload")
        assert staged["changed_files"] == ["reasoning/mine_parser.py"]
    assert host_state(lab) == before


# --- hostile payloads -----------------------------------------------------------------------


def copy_payload(tmp_path: Path) -> Path:
    payload = tmp_path / "payload"
    subprocess.run(["cp", "-r", str(PAYLOAD), str(payload)], check=True)
    return payload


def add_entry(payload: Path, entry: dict) -> None:
    manifest = payload / "manifest.yml"
    document = yaml.safe_load(manifest.read_text())
    document["entries"].append(entry)
    manifest.write_text(yaml.safe_dump(document, sort_keys=False))


def overlay(payload: Path, name: str, dest: str, text: str, **extra) -> None:
    source = payload / "overlays" / name
    source.parent.mkdir(exist_ok=True)
    source.write_text(text)
    add_entry(payload, {"name": name, "kind": "file", "src": f"overlays/{name}", "dest": dest, **extra})


def hostile_protected(payload):
    overlay(payload, "sampler", "model_executor/layers/sampler.py", "X = 1\n")
    return "manifest entry 'sampler': model_executor/layers/sampler.py is a protected model-layer file"


def hostile_outside(payload):
    overlay(payload, "worker", "worker/worker.py", "X = 1\n")
    return "manifest entry 'worker': worker/worker.py is outside the serving layer"


def hostile_traversal(payload):
    overlay(payload, "escape", "../../../../etc/evil.py", "X = 1\n")
    return "manifest entry 'escape': dest ../../../../etc/evil.py escapes the vllm package"


def hostile_symlink(payload):
    (payload / "overlays").mkdir(exist_ok=True)
    (payload / "overlays" / "link.py").symlink_to("/etc/hostname")
    add_entry(payload, {"name": "link", "kind": "file", "src": "overlays/link.py",
                        "dest": "entrypoints/openai/link.py"})
    return "manifest entry 'link': overlays/link.py is a symlink"


def hostile_syntax(payload):
    overlay(payload, "broken", "entrypoints/openai/broken.py", "def broken(:\n    pass\n")
    return "entrypoints/openai/broken.py line 1"


def hostile_too_new(payload):
    # PEP 695 type aliases need Python 3.12; the hosts' interpreter is 3.11.
    overlay(payload, "newer", "entrypoints/openai/newer.py", "type Choices = list[str]\n")
    return "entrypoints/openai/newer.py line 1"


def hostile_pinned(payload):
    overlay(payload, "old-base", "api_server.py", "X = 1\n", base_sha256="0" * 64)
    return "manifest entry 'old-base' (entrypoints/openai/api_server.py): the overlay was made from a base file with sha256 000000000000"


def hostile_patch(payload):
    (payload / "patches" / "cli_args.patch").write_text(
        "--- a/cli_args.py\n+++ b/cli_args.py\n@@ -1,2 +1,3 @@\n not the first line\n not the second\n+added\n")
    add_entry(payload, {"name": "cli", "kind": "patch", "src": "patches/cli_args.patch", "dest": "cli_args.py"})
    return "manifest entry 'cli' (entrypoints/openai/cli_args.py): entrypoints/openai/cli_args.py: hunk 1 (@@ -1,2 +1,3 @@) does not apply"


@pytest.mark.parametrize("make_hostile", [
    hostile_protected, hostile_outside, hostile_traversal, hostile_symlink, hostile_syntax,
    hostile_too_new, hostile_pinned, hostile_patch,
], ids=lambda make: make.__name__.removeprefix("hostile_"))
def test_a_hostile_payload_is_refused_naming_the_entry_and_nothing_changes(lab, first_deploy, tmp_path, make_hostile):
    payload = copy_payload(tmp_path)
    expected = make_hostile(payload)
    before = host_state(lab)
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path,
                       extravars={"serving_release": "sub666", "stage_payload_dir": str(payload)})
    assert run.rc != 0
    assert run.hosts_with("failures") == {host.name for host in lab.hosts}
    for host in lab.hosts:
        messages = run.failure_messages(host.name)
        assert any(expected in message for message in messages), messages
    assert host_state(lab) == before


# --- interruption ---------------------------------------------------------------------------


def test_a_deploy_killed_at_any_moment_leaves_whole_files_and_a_rerun_converges(lab, first_deploy, tmp_path):
    payload = copy_payload(tmp_path)
    bodies = {f"part{number}": f"PART = {number}\n" + "# padding\n" * 2000 for number in range(12)}
    for name, body in bodies.items():
        overlay(payload, name, f"entrypoints/openai/{name}.py", body)
    wanted = {f"entrypoints/openai/{name}.py": hashlib.sha256(body.encode()).hexdigest()
              for name, body in bodies.items()}
    old = serving_digests(lab)
    command = [str(Path(sys.executable).with_name("ansible-playbook")), DEPLOY, "-i", str(lab.inventory_path),
               "-e", "serving_release=sub520", "-e", f"stage_payload_dir={payload}"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    for delay in (2.0, 3.0, 4.0):
        controller = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(delay)
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
        for host in lab.hosts:
            for path, sha in wanted.items():
                assert digest(package_file(host, path)) in (None, sha), (delay, host.name, path)
        for key, sha in serving_digests(lab).items():
            assert sha == old[key], key  # the shipped patches were already installed
    # The killed runs' locks are stale (their controller process is gone): taken over, not refused.
    rerun = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={
        "serving_release": "sub520", "stage_payload_dir": str(payload)})
    assert rerun.rc == 0, rerun.stats
    for host in lab.hosts:
        assert current_release(host)["id"] == "sub520"
        for path, sha in wanted.items():
            assert digest(package_file(host, path)) == sha
    converged = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "again", extravars={
        "serving_release": "sub520", "stage_payload_dir": str(payload)})
    assert converged.rc == 0 and not converged.hosts_with("changed"), converged.stats


# --- concurrency ----------------------------------------------------------------------------


def test_a_host_locked_by_another_run_is_refused_naming_the_holder(lab, first_deploy, tmp_path):
    locked, *others = lab.hosts
    holder = {"run_id": "20261129T101500Z-42", "controller": "ci-runner-7", "user": "alice",
              "pid": 4242, "playbook": "deploy.yml", "release": "sub509",
              "acquired_at": "2026-11-29T10:15:00Z"}
    lock = locked.path(f"{STATE}/lock")
    lock.write_text(json.dumps(holder))
    try:
        run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={"serving_release": "sub530"})
        assert json.loads(lock.read_text()) == holder  # the other run's lock is left alone
    finally:
        lock.unlink()
    assert run.hosts_with("failures") == {locked.name}
    (message,) = [m for m in run.failure_messages(locked.name) if "is held by" in m]
    assert "run 20261129T101500Z-42 (alice@ci-runner-7, pid 4242, playbook deploy.yml, release sub509)" in message
    assert "serving_lock_break=true" in message
    assert {host.name for host in others} <= run.hosts_with("ok")
    assert current_release(locked)["id"] != "sub530"
    assert {current_release(host)["id"] for host in others} == {"sub530"}
