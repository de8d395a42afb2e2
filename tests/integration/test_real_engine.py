"""deploy.yml onto the lab's real engine: the payload's serving files run in the real vLLM
0.10.1.1, where the stand-in can only read which fixes they carry.

The lab has two hosts: lab-h1 runs the stand-in (vendor variant), lab-h2 the real engine on the
vendor-unregistered variant, whose registry lacks the checkpoint's Qwen3_5ForCausalLM: the real
engine serves there only once the payload's registry.py overlay registers it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from lab_files import REGISTRY, REPO, current_release, digest, engine_process, package_file
from lab_guard import built_lab
from playbook_runs import ONE_BATCH, run_playbook

pytestmark = pytest.mark.lab

PROTOCOL_PROBES = sum(probe["checks"] == "protocol" for probe in
                      yaml.safe_load((REPO / "files" / "probes" / "default.yml").read_text()))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from built_lab(tmp_path_factory, n_hosts=2, real_engines=["h2"])


@pytest.fixture(scope="module")
def first_deploy(lab, tmp_path_factory):
    run = run_playbook("deploy.yml", lab.inventory_path, tmp_path_factory.mktemp("deploy"),
                       extravars={"serving_release": "sub601", **ONE_BATCH})
    assert run.rc == 0, run.stdout()[-4000:]
    return run


def chat_status(lab, host) -> str:
    """The HTTP status of a plain chat request sent on the host to its engine."""
    body = json.dumps({"model": "qwen3_5", "messages": [{"role": "user", "content": "Hi"}],
                       "max_tokens": 4})
    command = ("curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' "
               f"-d '{body}' http://127.0.0.1:8000/v1/chat/completions")
    return subprocess.run(lab.ssh_command(host, command), capture_output=True, text=True,
                          timeout=120, check=False).stdout


def test_the_real_engine_serves_the_payload_and_its_registry_overlay(lab, first_deploy):
    standin, real = lab.hosts
    assert (standin.engine, real.engine) == ("standin", "vllm")
    lines = first_deploy.stdout()
    assert f"{real.name}: sub601 good; {PROTOCOL_PROBES}/{PROTOCOL_PROBES} probes passed" in lines, lines[-3000:]
    # The engine is vLLM's own server, from the host's vllm package, in the runtime's root.
    argv, environ = engine_process(real)
    assert argv[argv.index("-m") + 1] == "vllm.entrypoints.openai.api_server"
    assert environ["TORCHDYNAMO_DISABLE"] == "1" and "PYTHONPATH" not in environ
    # The vendor-unregistered base cannot serve Qwen3_5ForCausalLM: the overlay made it serve.
    assert digest(package_file(real, REGISTRY)) != real.package_sha256[REGISTRY]
    assert current_release(real)["status"] == "good" and chat_status(lab, real) == "200"
