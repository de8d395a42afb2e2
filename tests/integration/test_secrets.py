"""The clients' key, kept inline in Ansible Vault as a team's group_vars would keep it, on a
deploy against the lab: it reaches the engine, and nothing else carries it.

One host (one without supervisord, whose program file would be a second 0600 copy of the
environment) keeps the run short.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from lab_files import STATE, current_release, engine_process, recorded
from playbook_runs import REPO, run_playbook

pytestmark = pytest.mark.lab

ENV_FILE = "/etc/biv100-serving/engine.env"
# Every folder a lab host keeps to itself that the collection or its connection writes to.
HOST_FOLDERS = (STATE, "/etc/biv100-serving", "/var/log/biv100-serving", "/run/biv100-serving", "/root")
ANSIBLE_VAULT = Path(sys.executable).with_name("ansible-vault")


def vault_inventory(lab, folder: Path, key: str) -> tuple[Path, Path]:
    """A copy of the lab's inventory whose group_vars hold `key` as engine_api_key, encrypted
    inline by ansible-vault; and the vault's password file."""
    password_file = folder / "vault-password"
    password_file.write_text(secrets.token_hex(16) + "\n")
    password_file.chmod(0o600)
    encrypted = subprocess.run(
        [str(ANSIBLE_VAULT), "encrypt_string", "--vault-password-file", str(password_file),
         "--stdin-name", "engine_api_key"],
        input=key, capture_output=True, text=True, check=True).stdout
    assert "!vault |" in encrypted and key not in encrypted
    inventory = folder / "inventory"
    group_vars = inventory / "group_vars"
    (group_vars / "biv100").mkdir(parents=True)
    shutil.copy(lab.inventory_path, inventory / "hosts.yml")
    for path in (REPO / "inventory" / "lab" / "group_vars").glob("*.yml"):
        shutil.copy(path, group_vars / "biv100" / "main.yml" if path.stem == "biv100" else group_vars / path.name)
    (group_vars / "biv100" / "vault.yml").write_text("---\n" + encrypted)
    return inventory, password_file


def files_holding(text: str, *roots: Path) -> list[Path]:
    found = []
    for root in roots:
        for path in [root] if root.is_file() else sorted(root.rglob("*")) if root.exists() else []:
            if path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes():
                found.append(path)
    return found


def status_of(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_vault_encrypted_api_key_reaches_the_engine_and_nothing_else(lab, tmp_path, monkeypatch):
    key = f"sk-biv100-{secrets.token_hex(16)}"
    host = next(host for host in lab.hosts if not host.supervisorctl)
    inventory, password_file = vault_inventory(lab, tmp_path, key)
    # ansible-runner gives ansible-playbook this process's environment.
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password_file))

    run = run_playbook("deploy.yml", inventory, tmp_path / "deploy", limit=host.name,
                       extravars={"serving_release": "sub700"})

    assert run.rc == 0, run.failure_messages(host.name)
    # The engine has it in its environment, from the env file, and not on its command line;
    # engine_health and the probes sent it (the engine refuses /v1 without it).
    argv, environ = engine_process(host)
    assert environ["VLLM_API_KEY"] == key and key not in "\0".join(argv)
    assert status_of(f"http://{host.ip}:8000/v1/models", None) == 401
    assert status_of(f"http://{host.ip}:8000/v1/models", key) == 200
    # The run's events and output, the ledger, the inventory (only encrypted).
    assert key not in json.dumps(run.events)
    assert files_holding(key, tmp_path) == []
    # The host: its 0600 env file holds it, no other file it keeps to itself does; the release
    # record says only that a key was set.
    env_file = host.path(ENV_FILE)
    assert files_holding(key, *(host.path(folder) for folder in HOST_FOLDERS)) == [env_file]
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert recorded(current_release(host), "engine")["api_key_set"] is True
    # The platform's run file the release records names the key and carries no value; no build
    # file has it.
    run_file = yaml.safe_load(recorded(current_release(host), "engine")["platform_run"])
    assert run_file["secret_env"] == ["VLLM_API_KEY"]
    assert files_holding(key, REPO / "build") == []
