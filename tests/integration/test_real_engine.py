"""deploy.yml onto the lab's real engine: the payload's serving files run in the real vLLM
0.10.1.1, where the stand-in can only read which fixes they carry.

The lab has two hosts: lab-h1 runs the stand-in (vendor variant), lab-h2 the real engine on the
vendor-unregistered variant, whose registry lacks the checkpoint's Qwen3_5ForCausalLM: the real
engine serves there only once the payload's registry.py overlay registers it.

The tests run in this file's order: the first meets the real host before the collection ever
has, the last leaves it on the vendor's base.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
import yaml
from lab_files import (CHAT, REGISTRY, REPO, STATE, copy_payload, current_release, digest,
                       engine_process, package_file)
from lab_guard import built_lab
from playbook_runs import ONE_BATCH, run_playbook

pytestmark = pytest.mark.lab

PROTOCOL_PROBES = sum(probe["checks"] == "protocol" for probe in
                      yaml.safe_load((REPO / "files" / "probes" / "default.yml").read_text()))
# A serving file that compiles and imports, and raises inside the request path of every chat.
CHECK_MODEL = "        error_check_ret = await self._check_model(request)\n"
RAISES = "        raise RuntimeError('the payload broke the chat request path')\n"
# A model file of the vendor's, which the guard must find as its installer recorded it.
QWEN3 = "model_executor/models/qwen3.py"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from built_lab(tmp_path_factory, n_hosts=2, real_engines=["h2"])


def test_first_contact_names_a_model_file_edited_before_it_against_the_vendor_record(lab, tmp_path):
    real = lab.hosts[1]
    model = package_file(real, QWEN3)
    original = model.read_bytes()
    model.write_bytes(original + b"# edited before the collection first came\n")
    try:
        run = run_playbook("deploy.yml", lab.inventory_path, tmp_path,
                           extravars={"serving_release": "sub600"}, limit=real.name)
    finally:
        model.write_bytes(original)
    assert run.rc != 0
    (failed,) = run.failure_messages(real.name)
    record = f"{real.package_root}-{real.vllm_version}.dist-info/RECORD"
    assert failed.startswith(f"the model layer differs from what its installer recorded in {record}, "
                             f"at first contact (before stage): 1 model-layer file: {QWEN3} changed "
                             f"sha256 {digest_of(original)[:8]}"), failed
    # Nothing was recorded or staged: the next run meets the host for the first time again.
    assert not real.path(f"{STATE}/baseline/protected.json").exists()
    assert not real.path(f"{STATE}/releases/sub600").exists()


@pytest.fixture(scope="module")
def first_deploy(lab, tmp_path_factory):
    run = run_playbook("deploy.yml", lab.inventory_path, tmp_path_factory.mktemp("deploy"),
                       extravars={"serving_release": "sub601", **ONE_BATCH})
    assert run.rc == 0, run.stdout()[-4000:]
    return run


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


@pytest.fixture
def raising_payload(lab, first_deploy, tmp_path):
    """The shipped payload with serving_chat.py replaced by a whole file: the one the first
    release installed (the vendor's, with the payload's fix), raising before it answers any
    chat."""
    payload = copy_payload(tmp_path)
    installed = package_file(lab.hosts[1], CHAT).read_text()
    assert installed.count(CHECK_MODEL) == 1 and installed != lab.hosts[1].path(f"{STATE}/base/{CHAT}").read_text()
    (payload / "overlays").mkdir()
    (payload / "overlays" / "serving_chat.py").write_text(installed.replace(CHECK_MODEL, RAISES + CHECK_MODEL))
    manifest = yaml.safe_load((payload / "manifest.yml").read_text())
    manifest["entries"] = [entry for entry in manifest["entries"] if entry["dest"] != "serving_chat.py"]
    manifest["entries"].append({"name": "raises-in-chat", "kind": "file",
                                "src": "overlays/serving_chat.py", "dest": "serving_chat.py"})
    (payload / "manifest.yml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return payload


def test_a_serving_file_that_raises_passes_the_stand_in_and_the_real_engine_rolls_it_back(
        lab, raising_payload, tmp_path):
    standin, real = lab.hosts
    deploy = {"serving_release": "sub602", "stage_payload_dir": str(raising_payload)}

    # The stand-in reads which fixes the serving files carry, not what they do: it cannot fail.
    on_standin = run_playbook("deploy.yml", lab.inventory_path, tmp_path / "standin",
                              extravars=deploy, limit=standin.name)
    assert on_standin.rc == 0, on_standin.stdout()[-3000:]
    assert (current_release(standin)["id"], current_release(standin)["status"]) == ("sub602", "good")

    # The real engine runs the file: its chats answer 500, the probes fail, the host goes back.
    on_real = run_playbook("deploy.yml", lab.inventory_path, tmp_path / "real", extravars=deploy,
                           limit=real.name)
    assert on_real.rc != 0
    failed = " ".join(on_real.failure_messages(real.name))
    assert "probes failed" in failed and "status == `200`" in failed, failed
    assert current_release(real)["id"] == "sub601"
    assert json.loads(real.path(f"{STATE}/releases/sub602/release.json").read_text())["status"] == "failed"
    assert f"{real.name}: sub601 rolled back; rolled back from sub602" in on_real.stdout(), on_real.stdout()[-2000:]
    assert chat_status(lab, real) == "200"
