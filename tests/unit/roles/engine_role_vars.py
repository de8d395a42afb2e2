"""Render the engine role's variables as Ansible does, from an inventory given as YAML (inline
`!vault` values included), in a process of its own.

The role's filters resolve through Ansible's collection loader, which is installed once per
process and would change how every other test imports the collection: the tests run this file
with the interpreter they run under, a JSON request on stdin, the rendered values on stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.parsing.dataloader import DataLoader
from ansible.parsing.vault import VaultSecret, VaultSecretsContext
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "engine"

# What the facts role would have learned on a host of four free GPUs.
FACTS = {
    "ansible_facts": {
        "vllm_facts": {"interpreter": "/usr/local/corex/python3/bin/python3"},
        "gpu_facts": {"count": 4, "free": [0, 1, 2, 3], "processes": []},
    },
}


def render(request: dict) -> dict:
    init_plugin_loader([str(REPO / "collections")])
    loader = DataLoader()
    secrets = [("default", VaultSecret(request["vault_password"].encode()))]
    loader.set_vault_secrets(secrets)
    VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    variables = {"role_path": str(ROLE), "inventory_hostname": "bi-v100-01", **FACTS}
    for folder in ("defaults", "vars"):
        variables.update(loader.load_from_file(str(ROLE / folder / "main.yml"), trusted_as_template=True))
    variables.update(loader.load(request["inventory"]) or {})
    templar = Templar(loader=loader, variables=variables)
    # As tasks_from: instances decides them and tasks_from: check judges them.
    instances = templar.template(trust_as_template(
        "{{ engine_instances | biv100.serving.engine_instances(inventory_hostname, engine_instance_defaults,"
        " gpus=ansible_facts.gpu_facts) }}"))
    if request.get("restore"):
        # As the rollback role makes the instances a release recorded from the host's.
        instances = Templar(loader=loader, variables={"instances": instances, "restore": request["restore"]}).template(
            trust_as_template("{{ instances | biv100.serving.restored_instances(restore) }}"))
    problems = Templar(loader=loader, variables={**variables, "instances": instances}).template(trust_as_template(
        "{{ instances | biv100.serving.engine_instance_problems(inventory_hostname, ansible_facts.gpu_facts) }}"))
    # The env file of the first instance, as the engine role writes it.
    env_file = Templar(loader=loader, variables={**variables, "engine_instance": instances[0]}).template(
        variables["engine_env_file_content"])
    return {"instances": instances, "problems": problems, "engine_env_file_content": env_file}


if __name__ == "__main__":
    json.dump(render(json.load(sys.stdin)), sys.stdout, default=str)
