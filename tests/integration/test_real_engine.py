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
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import conformance
import pytest
import yaml
from conformance import command_line
from engine_standin import cli
from lab_files import (CHAT, REGISTRY, REPO, STATE, copy_payload, current_release, digest,
                       engine_process, package_file, recorded)
from lab_guard import built_lab
from playbook_runs import ONE_BATCH, run_playbook
from probe_values import probe_values

from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import expand, load_workload
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import (
    load_suites,
    module_request,
    select,
    with_values,
)

# Never beside the other of the two (tests/integration/conftest.py).
pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("one_cpu_heavy_module_at_a_time")]

PROTOCOL_PROBES = sum(probe["checks"] == "protocol" for probe in
                      yaml.safe_load((REPO / "files" / "probes" / "default.yml").read_text()))
# A serving file that compiles and imports, and raises inside the request path of every chat.
CHECK_MODEL = "        error_check_ret = await self._check_model(request)\n"
RAISES = "        raise RuntimeError('the payload broke the chat request path')\n"
# A model file of the vendor's, which the guard must find as its installer recorded it.
QWEN3 = "model_executor/models/qwen3.py"
CONFORMANCE = Path(conformance.__file__).parent
IN_ENGINE_ROOT = "/usr/local/corex/lab/bin/in-engine-root"
# The bench's streaming requests held to the real engine: the default workload's warm-up pair.
BENCH_REQUESTS = 2


def host_python(lab, host, script: Path, stdin: str, *launcher: str) -> str:
    """What a script of tests/lab/conformance prints, run by the host's Python on the host."""
    command = [*launcher, host.interpreter, "-c", shlex.quote(script.read_text())]
    run = subprocess.run(lab.ssh_command(host, *command), input=stdin, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()[-1]  # the real vllm logs to stdout before the answer


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


def test_the_real_engine_serves_the_payload_and_its_registry_overlay(lab, first_deploy):
    standin, real = lab.hosts
    assert (standin.engine, real.engine) == ("standin", "vllm")
    lines = first_deploy.stdout()
    assert f"{real.name}: sub601 good; {PROTOCOL_PROBES}/{PROTOCOL_PROBES} probes passed" in lines, lines[-3000:]
    # The engine is vLLM's own server, from the host's vllm package, in the runtime's root.
    argv, environ = engine_process(real)
    assert argv[argv.index("-m") + 1] == "vllm.entrypoints.openai.api_server"
    # Its figures are the lab's, marked simulated as the stand-in's are.
    assert argv[argv.index("--middleware") + 1] == "biv100_lab_marker.mark_simulated"
    headers = subprocess.run(lab.ssh_command(real, "curl -s -o /dev/null -D - http://127.0.0.1:8000/health"),
                             capture_output=True, text=True, timeout=60, check=False).stdout
    assert "x-biv100-simulated: real vLLM 0.10.1.1 on the lab's CPU" in headers, headers
    assert environ["TORCHDYNAMO_DISABLE"] == "1" and "PYTHONPATH" not in environ
    # The vendor-unregistered base cannot serve Qwen3_5ForCausalLM: the overlay made it serve.
    assert digest(package_file(real, REGISTRY)) != real.package_sha256[REGISTRY]
    assert current_release(real)["status"] == "good" and chat_status(lab, real) == "200"


def test_the_stand_in_answers_every_protocol_probe_and_bench_request_as_the_real_engine(lab, first_deploy):
    standin, real = lab.hosts
    args = recorded(current_release(real), "engine")["args"]
    assert args == {**recorded(current_release(standin), "engine")["args"], "tensor_parallel_size": 1,
                    "max_num_batched_tokens": 1024, "guided_decoding_backend": "xgrammar", "guided_decoding_disable_any_whitespace": True,
                    "middleware": "biv100_lab_marker.mark_simulated"}
    probes = select(load_suites([str(REPO / "files" / "probes" / "default.yml")]), [], [], checks=["protocol"])
    requests = [module_request(with_values(probe, probe_values(args, "qwen3_5"))) for probe in probes]
    bench = expand(load_workload(REPO / "files" / "bench" / "default.yml"), "qwen3_5", 1)
    requests += [{"name": f"bench-{index}", "method": "POST", "path": "/v1/chat/completions",
                  "body": body, "timeout": 300} for index, body in enumerate(bench[:BENCH_REQUESTS])]
    job = json.dumps({"url": "http://127.0.0.1:8000", "requests": requests})

    with ThreadPoolExecutor(2) as pool:
        standin_answers, real_answers = pool.map(
            lambda host: json.loads(host_python(lab, host, CONFORMANCE / "exchange.py", job)), lab.hosts)
    problems, compared = [], 0
    for ours, theirs in zip(standin_answers, real_answers):
        assert ours["name"] == theirs["name"] and len(ours["answers"]) == len(theirs["answers"])
        for copy, (mine, other) in enumerate(zip(ours["answers"], theirs["answers"])):
            compared += 1
            problems += [f"{ours['name']} #{copy}: {found}" for found in conformance.differences(mine, other)]
    assert not problems, "\n".join(problems)
    # Every request was answered and compared; the streams among them read to [DONE].
    assert compared >= len(requests) == PROTOCOL_PROBES + BENCH_REQUESTS
    streams = [answer for request in real_answers for answer in request["answers"]
               if conformance.protocol(answer).done]
    assert len(streams) >= BENCH_REQUESTS + 5


def test_the_stand_in_starts_or_refuses_every_command_line_as_the_real_parser(lab, first_deploy):
    """Every flag of the stand-in's table and each engine's own command line (Sub168 as the
    engine role renders it), parsed by the real vLLM in its root and by the stand-in."""
    # python3 -m engine_standin|vllm.entrypoints.openai.api_server ARGS...
    own = [argv[argv.index("-m") + 2:] for argv, _environ in map(engine_process, lab.hosts)]
    assert all("--max-num-seqs" in argv and "--enforce-eager" in argv for argv in own)
    cases = command_line.flag_cases(cli.load_flag_table())
    cases += [case for argv in own for case in command_line.sub168_cases(argv)]
    real = lab.hosts[1]
    verdicts = json.loads(host_python(lab, real, CONFORMANCE / "real_parser.py", json.dumps(cases),
                                      IN_ENGINE_ROOT))
    assert len(verdicts) == len(cases)
    assert not command_line.disagreements(cases, verdicts), "\n".join(command_line.disagreements(cases, verdicts))
    # Both sides refuse as well as accept: the comparison is not of two parsers that take all.
    assert {verdict["status"] for verdict in verdicts} >= {0, 1, 2}
    assert all(verdict["status"] == 0 for verdict in verdicts[-len(own) * 2:])


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


def test_the_vendor_unregistered_base_cannot_start_the_real_engine(lab, first_deploy, tmp_path):
    """Without the payload's registry.py the real vLLM refuses the checkpoint: the rollback
    refuses to go to the vendor's files, and forced there, the engine ends naming the model."""
    real = lab.hosts[1]
    to_base = {"serving_rollback_to": "base"}
    refused = run_playbook("rollback.yml", lab.inventory_path, tmp_path / "refused",
                           extravars=to_base, limit=real.name)
    assert refused.rc != 0
    assert "cannot serve Qwen3_5ForCausalLM there (its registry lacks it)" in " ".join(
        refused.failure_messages(real.name))
    assert chat_status(lab, real) == "200"

    forced = run_playbook("rollback.yml", lab.inventory_path, tmp_path / "forced",
                          extravars={**to_base, "serving_rollback_force": True}, limit=real.name)
    assert forced.rc != 0
    assert "ended while waiting" in " ".join(forced.failure_messages(real.name))
    log = real.path("/var/log/biv100-serving/engine.log").read_text()
    assert "Model architectures ['Qwen3_5ForCausalLM'] are not supported for now" in log
    assert digest(package_file(real, REGISTRY)) == real.package_sha256[REGISTRY]
