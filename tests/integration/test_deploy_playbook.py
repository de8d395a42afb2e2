"""deploy.yml against the lab: the payload lands where it applies, once, and nowhere else.

The module's lab and its first deploy (a module fixture) are shared by the tests below, which
start from that state (a second run changes nothing; hostile payloads change nothing; an
interrupted run converges). Each passes on its own too; the last one leaves drift behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lab_files import (
    CHAT,
    PID_FILE,
    PROTOCOL,
    REGISTRY,
    STATE,
    copy_payload,
    current_release,
    descendants,
    digest,
    engine_pids,
    engine_process,
    host_of,
    host_state,
    lock_holder,
    option_values,
    overlay,
    package_file,
    recorded,
    run_pids,
    serving_digests,
    start_ticks,
)
from playbook_runs import ONE_BATCH, REPO, ended, kill_controller, run_playbook, start_playbook

from ansible_collections.biv100.serving.plugins.plugin_utils._controller_processes import process_argv, runs_ansible_playbook

import lab as lab_builder

from engine_defaults import SUB168 as SUB168_ARGS

DEPLOY = "deploy.yml"
VERIFY = "verify.yml"
FINDINGS_TASK = "Report every finding"
PROTECTED = "sequence.py"
PROBE_TASK = "Probe the engine with the functional suites"

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def first_deploy(lab, tmp_path_factory):
    return run_playbook(DEPLOY, lab.inventory_path, tmp_path_factory.mktemp("first"),
                        extravars={"serving_release": "sub510", **ONE_BATCH})


def test_the_payload_lands_where_it_applies(lab, first_deploy):
    assert first_deploy.rc == 0, first_deploy.stats
    assert first_deploy.hosts_with("changed") == {host.name for host in lab.hosts}
    for host in lab.hosts:
        built = host.package_sha256
        record = current_release(host)
        assert record["id"] == "sub510" and record["status"] == "good"
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


def test_the_hosts_of_a_batch_run_and_probe_their_engines_together(lab, first_deploy):
    # Ansible announces a task once for the hosts that run it together, and once per host for an
    # include it runs on one host after the other.
    for task in ("Run the engine, restarting it on a new release or drift", "Wait until the engine serves the model",
                 "Probe the engine with the functional suites"):
        announced = [event for event in first_deploy.events
                     if event.get("event") == "playbook_on_task_start" and event["event_data"].get("task") == task]
        ran_on = {event["event_data"]["host"] for event in first_deploy.events
                  if event.get("event") == "runner_on_ok" and event["event_data"].get("task") == task}
        assert (len(announced), ran_on) == (1, {host.name for host in lab.hosts}), task


SUB168 = {"--max-model-len": "256000", "--max-num-seqs": "2", "--gpu-memory-utilization": "0.95",
          "--max-num-batched-tokens": "4096", "--enable-chunked-prefill": None, "--enforce-eager": None,
          "--dtype": "half", "--tensor-parallel-size": "4"}


def test_the_engine_runs_with_exactly_sub168_and_the_env_file(lab, first_deploy):
    for host in lab.hosts:
        argv, environ = engine_process(host)
        options = option_values(argv)
        assert {flag: options.get(flag, "absent") for flag in SUB168} == SUB168, host.name
        model = "/opt/models/qwen3_moe" if host.variant == "upstream" else "/opt/models/qwen3_5"
        assert options["--model"] == model
        assert options["--served-model-name"] == Path(model).name
        assert (options["--tool-call-parser"], options["--reasoning-parser"]) == ("qwen3_coder", "qwen3")
        assert environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8,max_split_size_mb:512"
        assert environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        env_file = host.path("/etc/biv100-serving/engine.env").read_text()
        assert "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8,max_split_size_mb:512" in env_file


def test_every_host_passes_the_probes_and_its_release_is_marked_good(lab, first_deploy):
    for host in lab.hosts:
        (probed,) = first_deploy.results(host.name, PROBE_TASK)
        assert probed["failed_probes"] == [] and len(probed["probes"]) >= 60
        saved = json.loads(Path(probed["results_file"]).read_text())
        assert saved["host"] == host.name and saved["summary"] == probed["summary"]
        assert [answer["name"] for answer in saved["answers"]] == [p["name"] for p in probed["probes"]]
        record = current_release(host)
        # Marked good with the verdict of the gates these runs apply (playbook_runs): the
        # functional one. test_gates.py proves the others.
        assert record["history"][-1]["status"] == "good"
        assert record["history"][-1]["reason"] == (
            f"{len(probed['probes'])}/{len(probed['probes'])} probes passed (at least 50)")


def test_the_release_records_the_platform_run_file_of_the_same_variables(lab, first_deploy):
    # What submission.yml puts in the bundle as computility-run.yaml, byte for byte.
    document = yaml.safe_load(recorded(current_release(lab.hosts[0]), "engine")["platform_run"])
    assert document["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8,max_split_size_mb:512"
    parameters = document["parameters"]
    assert {key: parameters[key] for key in SUB168_ARGS} == SUB168_ARGS
    argv, _env = engine_process(lab.hosts[0])
    # The platform starts vLLM with the very arguments the fleet's engine got.
    assert document["command"][3:] == argv[3:]


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


def test_a_second_run_changes_nothing_restarts_nothing_and_makes_no_release(lab, first_deploy, tmp_path):
    before, pids = host_state(lab), engine_pids(lab)
    # Without a submission id a run that changes nothing makes no release either.
    again = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars=ONE_BATCH)
    assert again.rc == 0 and not again.hosts_with("changed"), again.stats
    assert host_state(lab) == before
    assert engine_pids(lab) == pids
    assert {current_release(host)["id"] for host in lab.hosts} == {"sub510"}


def test_check_mode_of_a_new_payload_reports_and_writes_nothing(lab, first_deploy, tmp_path):
    payload = copy_payload(tmp_path)
    overlay(payload, "mine", "reasoning/mine_parser.py", "PARSER = 'mine'\n")
    before = host_state(lab)
    checked = run_playbook(DEPLOY, lab.inventory_path, tmp_path,
                           extravars={"serving_release": "sub511", "stage_payload_dir": str(payload), **ONE_BATCH},
                           check=True)
    assert checked.rc == 0, checked.stats
    for host in lab.hosts:
        (staged,) = checked.results(host.name, "Stage the serving-layer payload")
        assert staged["changed_files"] == ["reasoning/mine_parser.py"]
    assert host_state(lab) == before


# --- the engine's variables -----------------------------------------------------------------


def sub168(**changes) -> dict:
    return {**SUB168_ARGS, **changes}


def test_changing_one_argument_restarts_only_the_engine(lab, first_deploy, tmp_path):
    host = lab.hosts[3]  # the host whose supervisord runs the engine
    pids = engine_pids(lab)
    changed = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "one", limit=host.name, extravars={
        "serving_release": "sub510", "engine_args": sub168(gpu_memory_utilization=0.9)})
    assert changed.rc == 0, changed.stats
    (staged,) = changed.results(host.name, "Stage the serving-layer payload")
    assert staged["changed_files"] == []  # no payload travelled
    (engine,) = changed.results(host.name, "Run the engine, restarting it on a new release or drift")
    assert (engine["manager"], engine["action"]) == ("supervisord", "restart")
    assert "argument --gpu-memory-utilization: running 0.95, desired 0.9" in engine["drift"]
    assert option_values(engine_process(host)[0])["--gpu-memory-utilization"] == "0.9"
    assert {name for name, pid in engine_pids(lab).items() if pids[name] != pid} == {host.name}
    back = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "back", limit=host.name,
                        extravars={"serving_release": "sub510"})
    assert back.rc == 0 and option_values(engine_process(host)[0])["--gpu-memory-utilization"] == "0.95"


LAB_VARS = yaml.safe_load((REPO / "inventory" / "lab" / "group_vars" / "biv100.yml").read_text())
ALLOCATOR = yaml.safe_load((REPO / "roles" / "engine" / "defaults" / "main.yml").read_text())["engine_allocator"]
NOTE = "entrypoints/openai/biv100_trace_note.py"


def test_a_release_that_changed_a_file_an_env_variable_and_a_launch_parameter_is_drawn_as_the_brief_table(
        lab, first_deploy, tmp_path):
    host = lab.hosts[1]
    ledger = tmp_path / "ledger"
    payload = copy_payload(tmp_path)
    overlay(payload, "trace-note", NOTE, "NOTE = 'trace'\n", mapping={
        "source": "a request trace note (lab test)", "place": "entrypoints/openai, a new module", "change": "overlay",
        "proven_by": ["chat-basic"]})
    # The allocator's option is the brief's env row (PYTORCH_CUDA_ALLOC_CONF); the log level, which
    # nothing maps, stands out as such.
    changed = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "changed", limit=host.name, extravars={
        "serving_release": "sub512", "stage_payload_dir": str(payload), "serving_ledger_dir": str(ledger),
        "engine_args": sub168(gpu_memory_utilization=0.9),
        "engine_allocator": {**ALLOCATOR, "garbage_collection_threshold": 0.7},
        "engine_env": {**LAB_VARS["engine_env"], "VLLM_LOGGING_LEVEL": "DEBUG"}})
    assert changed.rc == 0, changed.stats
    verdict = run_playbook("record_verdict.yml", lab.inventory_path, tmp_path / "verdict", extravars={
        "serving_release": "sub512", "verdict": "failed", "reason": "n=3 cascaded into out-of-memory failures",
        "serving_ledger_dir": str(ledger)})
    again = run_playbook("record_verdict.yml", lab.inventory_path, tmp_path / "again", extravars={
        "serving_release": "sub512", "verdict": "failed", "reason": "n=3 cascaded into out-of-memory failures",
        "serving_ledger_dir": str(ledger)})
    # The shipped payload again, under a new id: sub510's record does not name the file sub512 added.
    back = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "back", limit=host.name,
                        extravars={"serving_release": "sub513", "serving_ledger_dir": str(ledger)})
    before = host_state(lab)
    unknown = run_playbook("record_verdict.yml", lab.inventory_path, tmp_path / "unknown",
                           extravars={"serving_release": "sub999", "verdict": "passed"})
    unexplained = run_playbook("record_verdict.yml", lab.inventory_path, tmp_path / "unexplained",
                               extravars={"serving_release": "sub512", "verdict": "failed"})
    # What `-e reason="n=3 cascaded"` hands Ansible: `reason=n=3 cascaded`, whose second word it
    # keeps apart as _raw_params; a reason cut short is refused, not recorded.
    cut_short = run_playbook("record_verdict.yml", lab.inventory_path, tmp_path / "cut-short", extravars={
        "serving_release": "sub512", "verdict": "failed", "reason": "n=3", "_raw_params": "cascaded"})

    assert verdict.rc == 0 and verdict.hosts_with("changed") == {host.name}, verdict.stats
    assert again.rc == 0 and not again.hosts_with("changed"), again.stats
    assert back.rc == 0, back.stats
    assert unknown.rc != 0 and any("has release sub999; no host changed" in message for message in
                                   unknown.failure_messages(lab.hosts[0].name)), unknown.stats
    assert unexplained.rc != 0 and any("a reason with verdict=failed" in message for message in
                                       unexplained.failure_messages(lab.hosts[0].name)), unexplained.stats
    assert cut_short.rc != 0 and any('the words "cascaded" of an -e were not key=value' in message for message in
                                     cut_short.failure_messages(lab.hosts[0].name)), cut_short.stats
    assert host_state(lab) == before
    record = json.loads(host.path(f"{STATE}/releases/sub512/release.json").read_text())
    assert (record["status"], record["platform"][-1]["verdict"]) == ("good", "failed")
    text = (ledger / "LEDGER.md").read_text()
    section = text[text.index("### sub512"):text.index("## Runs")]
    assert (f"{host.name} good; platform failed: n=3 cascaded into out-of-memory failures") in section
    assert (f"| a request trace note (lab test) | entrypoints/openai, a new module | overlay | {NOTE} | "
            "chat-basic ✓ |") in section
    assert ("| device_reduce policy_selector | computility-run.yaml params | launch parameters aligned with Sub168 | "
            "gpu_memory_utilization 0.95 -> 0.9 | long-prompt-chunked-prefill ✓, two-concurrent-requests ✓, "
            "n-above-max-num-seqs ✓ |") in section
    assert ("| buddy_allocator.cu | computility-run.yaml env | PYTORCH_CUDA_ALLOC_CONF | "
            "garbage_collection_threshold 0.8 -> 0.7 | two-long-prompts-at-once ✓ |") in section
    assert ("| (no mapping declared) | computility-run.yaml env | environment variable | VLLM_LOGGING_LEVEL = DEBUG |  |"
            in section)
    assert "- two long prompts at once ran out of memory from fragmentation: two-long-prompts-at-once ✓" in section
    # Going back changed the same three things the other way, against sub512, the last good release.
    back_section = text[text.index("### sub513"):text.index("### sub512")]
    assert "gpu_memory_utilization 0.9 -> 0.95" in back_section and "VLLM_LOGGING_LEVEL DEBUG -> (unset)" in back_section
    assert "garbage_collection_threshold 0.7 -> 0.8" in back_section
    assert "| removed: overlay |" in back_section


@pytest.mark.parametrize("extravars, messages", [
    # Preflight's tensor-parallel size is the engine's, in the lab's inventory as in any other.
    ({"engine_args": sub168(tensor_parallel_size=8)}, ["tensor_parallel_size is 8 but /usr/local/corex/bin/ixsmi reports 4 GPUs"]),
    # The engine's variables are judged together: one run names every problem.
    ({"engine_args": sub168(gpu_memory_utilization=1.2, dtype="fp16", enable_chunked_prefill=False,
                            max_model_len=300000, max_num_seq=2),
      "engine_allocator": {"expandable_segment": True}}, [
        "engine_args.gpu_memory_utilization is 1.2: it must be in (0, 1]",
        "engine_args.dtype is 'fp16': vLLM accepts auto, half",
        "engine_args.max_num_batched_tokens is 4096, smaller than engine_args.max_model_len 300000",
        "engine_args.max_model_len is 300000, above the model's max_position_embeddings 262144",
        "engine_args.max_num_seq is not an argument of the host's vLLM OpenAI server",
        "Unrecognized CachingAllocator option: expandable_segment"]),
    # A mapping that could not be recorded stops the deploy too, naming the variable and its place.
    ({"serving_mappings": [{"settings": "engine_args.dtype", "source": "x"}, {"settings": "dtype", "source": "y"}]},
     ["serving_mappings[1]: 'dtype' is not a setting: engine_args.<argument>, engine_env.<NAME>, "
      "engine_allocator.<option>, or one of those three whole; no host changed"]),
], ids=["preflight", "engine", "mapping"])
def test_an_invalid_engine_variable_fails_before_anything_changes(lab, first_deploy, tmp_path, extravars, messages):
    host = lab.hosts[0]  # the checks are the same on every host; one keeps the suite short
    before, pids = host_state(lab), engine_pids(lab)
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=host.name,
                       extravars={"serving_release": "sub666", **extravars})
    assert run.hosts_with("failures") == {host.name}
    failures = run.failure_messages(host.name)
    for message in messages:
        assert any(message in text for text in failures), (message, failures)
    assert host_state(lab) == before and engine_pids(lab) == pids


def test_an_engine_that_never_gets_healthy_fails_the_host_with_its_log_tail(lab, first_deploy, tmp_path):
    host = lab.hosts[0]
    never = {"PYTHONPATH": "/usr/local/corex/lab", "BIV100_STANDIN_NEVER_HEALTHY": "1"}
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "never", limit=host.name, extravars={
        "serving_release": "sub510", "engine_env": never, "engine_health_timeout": 3})
    assert run.hosts_with("failures") == {host.name}
    message, *_others = [text for text in run.failure_messages(host.name) if "not healthy" in text]
    assert "not healthy after 3 s" in message and message.endswith(" in log_tail")
    # This start's own words, from its log, and nothing of the engine it replaced: once, in the
    # failed task's log_tail.
    [failed_wait] = [result for result in run.results(host.name, "Wait until the engine serves the model")
                     if "log_tail" in result]
    tail = "\n".join(failed_wait["log_tail"])
    assert "BIV100_STANDIN_NEVER_HEALTHY=1: the engine never finishes loading" in tail
    assert "vllm starts: " in tail and "POST /v1/chat/completions" not in tail
    # The host went back to its release's proven settings, and says so.
    assert "the engine phase failed" in run.failure_messages(host.name)[-1]
    assert "rolled back to sub510, engine healthy" in run.failure_messages(host.name)[-1]
    assert "BIV100_STANDIN_NEVER_HEALTHY" not in engine_process(host)[1]


# --- hostile payloads -----------------------------------------------------------------------


def hostile_protected(payload):
    overlay(payload, "sampler", "model_executor/layers/sampler.py", "X = 1\n")
    return "manifest entry 'sampler': model_executor/layers/sampler.py is a protected model-layer file"


def hostile_syntax(payload):
    overlay(payload, "broken", "entrypoints/openai/broken.py", "def broken(:\n    pass\n")
    return "entrypoints/openai/broken.py line 1"


# End to end, one refusal made on the controller and one made by the hosts' own interpreter; the
# other refusals are covered by tests/unit/plugins/action/test_serving_overlay_action.py.
@pytest.mark.parametrize("make_hostile", [hostile_protected, hostile_syntax],
                         ids=lambda make: make.__name__.removeprefix("hostile_"))
def test_a_hostile_payload_is_refused_naming_the_entry_and_nothing_changes(lab, first_deploy, tmp_path, make_hostile):
    payload = copy_payload(tmp_path)
    expected = make_hostile(payload)
    before = host_state(lab)
    # One batch, so that every host's own check is seen (by default the canary's refusal would
    # stop the rollout before the others are asked).
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={
        "serving_release": "sub666", "stage_payload_dir": str(payload), **ONE_BATCH})
    assert run.rc != 0
    assert run.hosts_with("failures") == {host.name for host in lab.hosts}
    for host in lab.hosts:
        messages = run.failure_messages(host.name)
        assert any(expected in message for message in messages), messages
    assert host_state(lab) == before


def test_a_destination_through_the_hosts_own_link_is_refused_naming_it_and_nothing_changes(lab, first_deploy, tmp_path):
    """A vendor image may link a serving folder into the model layer: a destination is judged
    by where it leads on the host, not by its name."""
    host = lab.hosts[0]
    link = package_file(host, "entrypoints/openai/linked")
    link.symlink_to("../../model_executor/models")
    try:
        payload = copy_payload(tmp_path)
        overlay(payload, "through-link", "entrypoints/openai/linked/team_model.py", "X = 1\n")
        before = host_state(lab)
        models = sorted(os.listdir(package_file(host, "model_executor/models")))
        run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=host.name, extravars={
            "serving_release": "sub667", "stage_payload_dir": str(payload)})
        assert run.rc != 0 and run.hosts_with("failures") == {host.name}
        assert run.failure_messages(host.name)[0].startswith(
            f"{host.name}: refusing destinations that lead through the host's own links"), run.failure_messages(host.name)
        (message,) = run.failure_messages(host.name)
        for part in ("manifest entry 'through-link'", "entrypoints/openai/linked/team_model.py",
                     "entrypoints/openai/linked is a symlink to ../../model_executor/models", "nothing changed"):
            assert part in message, message
        assert sorted(os.listdir(package_file(host, "model_executor/models"))) == models
        assert host_state(lab) == before
    finally:
        link.unlink()


def test_a_model_layer_file_changed_added_or_removed_by_hand_stops_the_deploy_naming_it(lab, first_deploy, tmp_path):
    """The V1 engine 0.10.1.1 runs by default uses the V1 scheduler: the guard covers every
    file outside the serving layer, not one location per name of the brief."""
    edited, added, removed = lab.hosts[0], lab.hosts[1], lab.hosts[2]
    scheduler = package_file(edited, "v1/core/sched/scheduler.py")
    newcomer = package_file(added, "model_executor/models/team_model.py")
    gone = package_file(removed, "model_executor/models/llama.py")
    originals = {scheduler: scheduler.read_bytes(), gone: gone.read_bytes()}
    scheduler.write_bytes(originals[scheduler] + b"# tuned by hand\n")
    newcomer.write_text("X = 1\n")
    gone.unlink()
    try:
        payload = copy_payload(tmp_path)
        overlay(payload, "would-stage", "reasoning/would_stage_parser.py", "X = 1\n")
        before = host_state(lab)
        run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=",".join(h.name for h in (edited, added, removed)),
                           extravars={"serving_release": "sub669", "stage_payload_dir": str(payload), **ONE_BATCH})
        assert run.rc != 0 and run.hosts_with("failures") == {edited.name, added.name, removed.name}
        for host, expected in ((edited, "protected scheduler.py (v1/core/sched/scheduler.py) changed sha256"),
                               (added, "model_executor/models/team_model.py added"),
                               (removed, "model_executor/models/llama.py removed")):
            messages = run.failure_messages(host.name)
            assert any("model layer changed since first contact (before stage)" in text and expected in text
                       for text in messages), messages
        assert host_state(lab) == before
    finally:
        for path, data in originals.items():
            path.write_bytes(data)
        newcomer.unlink()


STAGED_TEMP = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}$")  # a write's temporary file (_no_follow)


def temporary_files(host) -> list[str]:
    return [str(path) for top in (STATE, host.package_root) for path in host.path(top).rglob(".*")
            if STAGED_TEMP.match(path.name)]


def test_a_state_store_that_fills_up_mid_stage_fails_clearly_and_changes_no_installed_file(lab, first_deploy, tmp_path):
    host = lab.hosts[0]
    payload = copy_payload(tmp_path)
    overlay(payload, "big", "entrypoints/openai/big_table.py", "X = 1\n" + "# a table too big for the store\n" * 32000)
    package_before = {key: sha for key, sha in host_state(lab).items()
                      if key.startswith(f"{host.name}:") and host.package_root in key}
    engine = engine_pids(lab)[host.name]
    current = current_release(host)["id"]
    # The state store moves onto a tmpfs with 256 KiB to spare: the release's own copy of the
    # 1 MiB file cannot fit, after the smaller ones were written.
    subprocess.run(lab.ssh_command(host, f"""set -e
        used=$(du -sk {STATE} | cut -f1)
        cp -a {STATE} /root/state-before-full
        mount -t tmpfs -o size=$((used + 256))k biv100-full {STATE}
        cp -a /root/state-before-full/. {STATE}/
        rm -rf /root/state-before-full"""), check=True)
    try:
        run = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "full", limit=host.name, extravars={
            "serving_release": "sub540", "stage_payload_dir": str(payload)})
        assert run.rc != 0 and run.hosts_with("failures") == {host.name}
        (message,) = [text for text in run.failure_messages(host.name) if "rolled back to" in text]
        assert message.startswith(f"{host.name}: the stage phase failed"), message
        assert f"staging sub540 stopped at {STATE}/releases/sub540/files/" in message
        assert "No space left on device" in message and "rolled back to" in message
        # Nothing installed changed, no write left a temporary file, the engine never stopped.
        assert {key: sha for key, sha in host_state(lab).items()
                if key.startswith(f"{host.name}:") and host.package_root in key} == package_before
        assert temporary_files(host) == []
        assert current_release(host)["id"] == current and engine_pids(lab)[host.name] == engine
    finally:
        subprocess.run(lab.ssh_command(host, f"umount {STATE}"), check=True)
    # With room again, the same deploy goes through.
    rerun = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "room", limit=host.name, extravars={
        "serving_release": "sub540", "stage_payload_dir": str(payload)})
    assert rerun.rc == 0, rerun.stats
    assert current_release(host)["id"] == "sub540"
    assert package_file(host, "entrypoints/openai/big_table.py").read_text().startswith("X = 1\n")


# --- interruption ---------------------------------------------------------------------------


def many_files_payload(tmp_path, stem: str) -> tuple[Path, dict[str, str]]:
    """The shipped payload and 24 more files, so that staging takes long enough to be caught
    in progress; returns the payload and {path: sha256} of the added files. Each test names its
    files by its own stem, so that a file another test installed is never taken for one this
    test's run installs."""
    payload = copy_payload(tmp_path)
    bodies = {f"{stem}{number}": f"PART = {number}\n" + "# padding\n" * 2000 for number in range(24)}
    for name, body in bodies.items():
        overlay(payload, name, f"entrypoints/openai/{name}.py", body)
    return payload, {f"entrypoints/openai/{name}.py": hashlib.sha256(body.encode()).hexdigest()
                     for name, body in bodies.items()}


def release_being_staged(host, release):
    """Whether the host is staging `release` now, read from its own state: the release's own
    copies are written before its record, which comes last."""
    folder = host.path(f"{STATE}/releases/{release}")
    return (folder / "files").exists() and not (folder / "release.json").exists()


def first_file_being_installed(host, release, wanted):
    return (any(package_file(host, path).exists() for path in wanted)
            and not host.path(f"{STATE}/releases/{release}/release.json").exists())


def caught(moment, still_running, timeout=300) -> bool:
    """Poll `moment` every millisecond while the run goes on; True once it is seen."""
    deadline = time.monotonic() + timeout
    while still_running() and time.monotonic() < deadline:
        if moment():
            return True
        time.sleep(0.001)
    return False


def test_a_host_whose_sshd_dies_mid_stage_is_reported_unreachable_while_the_others_finish(lab, first_deploy, tmp_path):
    lost = lab.hosts[1]
    others = [host for host in lab.hosts if host is not lost]
    payload, wanted = many_files_payload(tmp_path, "lost")
    deploy = {"serving_release": "sub550", "stage_payload_dir": str(payload), **ONE_BATCH}
    running = start_playbook(DEPLOY, lab.inventory_path, tmp_path / "cut", extravars=deploy)
    seen = caught(lambda: release_being_staged(lost, "sub550"), running.running)
    try:
        if seen:
            lab_builder.stop_sshd(lost, lab.dir)
        run = running.wait()
        assert seen, f"staging on {lost.name} was not caught in progress"
        assert run.hosts_with("dark") == {lost.name} and not run.hosts_with("failures"), run.stats
        for host in others:
            assert (current_release(host)["id"], current_release(host)["status"]) == ("sub550", "good")
        for path, sha in wanted.items():
            assert digest(package_file(lost, path)) in (None, sha), path
        lines = [json.loads(line) for line in (tmp_path / "cut" / "ledger" / "ledger.jsonl").read_text().splitlines()]
        assert "Stage the serving-layer payload" in [line["unreachable"] for line in lines if line["host"] == lost.name][0]
    finally:
        lab_builder.start_sshd(lost, lab.dir)
    # Back on the network, the host is brought to the release the others run.
    rerun = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "back", limit=lost.name, extravars=deploy)
    assert rerun.rc == 0, rerun.stats
    assert (current_release(lost)["id"], current_release(lost)["status"]) == ("sub550", "good")
    assert all(digest(package_file(lost, path)) == sha for path, sha in wanted.items())
    assert temporary_files(lost) == []


def test_a_deploy_killed_inside_staging_leaves_whole_files_and_a_rerun_completes_it(lab, first_deploy, tmp_path):
    payload, wanted = many_files_payload(tmp_path, "killed")
    old = serving_digests(lab)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), BIV100_LEDGER_DIR=str(tmp_path / "ledger"))
    watched = lab.hosts[0]
    moments = [
        ("sub560", "the first payload file is installed", lambda: first_file_being_installed(watched, "sub560", wanted)),
        # The files are all there by now (or whole, or absent): another release of the same
        # payload, caught while the host writes the release's own copies of them.
        ("sub561", "the release's own copies are being written", lambda: release_being_staged(watched, "sub561")),
    ]
    for release, moment, under_way in moments:
        command = [str(Path(sys.executable).with_name("ansible-playbook")), DEPLOY, "-i", str(lab.inventory_path),
                   "-e", f"serving_release={release}", "-e", f"stage_payload_dir={payload}",
                   "-e", json.dumps(ONE_BATCH)]
        controller = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        seen = caught(under_way, lambda: controller.poll() is None)
        kill_controller(controller)
        # The kill landed while the watched host was staging, not before or after it.
        assert seen, f"{moment}: staging on {watched.name} was not caught in progress"
        # The hosts finish the module they were running, their sessions gone; the next run
        # waits for them, as an operator does (a run's lock is not taken while its modules run).
        killed = lock_holder(watched)["run_id"]
        assert ended(lambda: not run_pids(killed)), f"{moment}: run {killed} still runs {run_pids(killed)}"
        for host in lab.hosts:
            for path, sha in wanted.items():
                assert digest(package_file(host, path)) in (None, sha), (moment, host.name, path)
        for key, sha in serving_digests(lab).items():
            assert sha == old[key], key  # the shipped patches were already installed
    # The killed runs' locks are stale (their controller process and modules are gone): taken
    # over, not refused.
    again = {"serving_release": "sub561", "stage_payload_dir": str(payload), **ONE_BATCH}
    rerun = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars=again)
    assert rerun.rc == 0, rerun.stats
    for host in lab.hosts:
        assert current_release(host)["id"] == "sub561"
        for path, sha in wanted.items():
            assert digest(package_file(host, path)) == sha


def waiting_for_health(host) -> bool:
    """Whether the run holding the host's lock waits there for its never-healthy engine, read off
    the host: a module of that run, started after the engine, still runs."""
    holder = lock_holder(host)
    try:
        _argv, environ = engine_process(host)
        engine = start_ticks(int(host.path(PID_FILE).read_text()))
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False  # between two engines
    return (holder is not None and environ.get("BIV100_STANDIN_NEVER_HEALTHY") == "1"
            and any(ticks > engine for ticks in started(run_pids(holder["run_id"])).values()))


def test_a_killed_deploys_lock_is_not_broken_while_its_module_still_runs_on_the_host(lab, first_deploy, tmp_path):
    host = lab.hosts[0]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), BIV100_LEDGER_DIR=str(tmp_path / "ledger"))
    never = {"PYTHONPATH": "/usr/local/corex/lab", "BIV100_STANDIN_NEVER_HEALTHY": "1"}
    command = [str(Path(sys.executable).with_name("ansible-playbook")), DEPLOY, "-i", str(lab.inventory_path),
               "-l", host.name, "-e", json.dumps({"serving_release": "sub570", "engine_env": never,
                                                  "engine_health_timeout": 600})]
    controller = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
    workers, killed = {}, None
    try:
        seen = caught(lambda: waiting_for_health(host), lambda: controller.poll() is None)
        # SIGKILL, as an operator's `kill -9`: ansible-playbook alone dies; its workers, in
        # sessions of their own, live on, and the host goes on waiting for the engine.
        workers = started(descendants(controller.pid))
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
        assert seen, f"the wait for the engine's health on {host.name} was not caught"
        killed = lock_holder(host)
        (module,) = run_pids(killed["run_id"])
        release, engine = current_release(host), engine_process(host)

        breaking = {"serving_release": "sub570", "serving_lock_break": True}
        refused = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "refused", limit=host.name, extravars=breaking)

        assert refused.hosts_with("failures") == {host.name}
        # The lock task's refusal (the host's failure repeats it).
        message, *_repeated = [text for text in refused.failure_messages(host.name) if "still runs on this host" in text]
        assert f"is held by run {killed['run_id']} " in message
        assert f"which still runs on this host: pid {module} (python3, since " in message
        assert f"or end them (kill {module}), and run again; " in message
        named = re.search(r"leftover ansible-playbook workers of a killed run on \S+ \(this controller\): ([\d, ]+) ",
                          message)
        assert named, message
        assert set(playbook_forks(workers)) <= {int(pid) for pid in named[1].split(", ")}
        assert lock_holder(host) == killed
        assert (current_release(host), engine_process(host)) == (release, engine)

        # As the message says: end the workers, then the module on the host, and run again.
        end(workers, signal.SIGTERM)
        end(started([module]), signal.SIGTERM)
        assert ended(lambda: not run_pids(killed["run_id"]) and not alive(workers))

        accepted = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "accepted", limit=host.name, extravars=breaking)

        assert accepted.rc == 0, accepted.stats
        assert f"run {killed['run_id']} left the lock behind" in accepted.stdout()
        assert (current_release(host)["id"], current_release(host)["status"]) == ("sub570", "good")
        assert "BIV100_STANDIN_NEVER_HEALTHY" not in engine_process(host)[1]
        assert lock_holder(host) is None
    finally:
        # Whatever this test left running, so that the next tests find the host free: the run
        # (when the test failed before its kill), its workers, its processes on the host and the
        # lock it left.
        if controller.poll() is None:
            kill_controller(controller)
        end(workers, signal.SIGKILL)
        killed = killed or lock_holder(host)
        if killed:
            end(started(run_pids(killed["run_id"])), signal.SIGKILL)
            if (lock_holder(host) or {}).get("run_id") == killed["run_id"]:
                host.path(f"{STATE}/lock").unlink()


def started(pids) -> dict[int, int]:
    """{pid: start time} of the processes that run now, so that ending them later never ends
    another process that took a pid of theirs."""
    found = {}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found[pid] = start_ticks(pid)
    return found


def end(processes: dict[int, int], signum) -> None:
    for pid, ticks in started(processes).items():
        if ticks == processes[pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def alive(processes: dict[int, int]) -> list[int]:
    return [pid for pid, ticks in started(processes).items() if ticks == processes[pid]]


def playbook_forks(processes: dict[int, int]) -> list[int]:
    """Those of the processes that run ansible-playbook's command line: its workers, not their
    ssh clients."""
    return [pid for pid in alive(processes) if runs_ansible_playbook(process_argv(pid) or ())]


# --- concurrency ----------------------------------------------------------------------------


def test_a_deploy_while_another_run_holds_one_host_is_refused_whole_naming_the_holder(lab, first_deploy, tmp_path):
    # Not the first host in name order: the run takes and gives back a lock before the refusal.
    locked = lab.hosts[1]
    holder = {"run_id": "20261129T101500Z-42", "controller": "ci-runner-7", "user": "alice",
              "pid": 4242, "playbook": "deploy.yml", "release": "sub509",
              "acquired_at": "2026-11-29T10:15:00Z"}
    lock = locked.path(f"{STATE}/lock")
    lock.write_text(json.dumps(holder))
    try:
        before = host_state(lab)
        run = run_playbook(DEPLOY, lab.inventory_path, tmp_path,
                           extravars={"serving_release": "sub530", **ONE_BATCH})
        assert json.loads(lock.read_text()) == holder  # the other run's lock is left alone
        assert host_state(lab) == before  # the locks this run took are given back
    finally:
        lock.unlink()
    assert run.rc != 0, run.stats
    (message,) = {m for host in lab.hosts for m in run.failure_messages(host.name) if "is held by" in m}
    assert message.startswith(f"{locked.name}: ")
    assert "run 20261129T101500Z-42 (alice@ci-runner-7, pid 4242, playbook deploy.yml, release sub509)" in message
    assert "since 2026-11-29T10:15:00Z" in message and "serving_lock_break=true" in message
    assert "this run changed nothing on any host" in message


def test_two_deploys_started_together_one_holds_every_host_and_the_other_changes_nothing(lab, first_deploy, tmp_path):
    releases = ("sub580", "sub581")
    started = {release: start_playbook(DEPLOY, lab.inventory_path, tmp_path / release,
                                       extravars={"serving_release": release, **ONE_BATCH})
               for release in releases}
    runs = {release: running.wait() for release, running in started.items()}

    (winner,) = [release for release, run in runs.items() if run.rc == 0] or [None]
    assert winner, {release: run.stats for release, run in runs.items()}
    (loser,) = set(releases) - {winner}
    refused = runs[loser]
    (message,) = {m for host in lab.hosts for m in refused.failure_messages(host.name) if "is held by" in m}
    assert f"playbook deploy.yml, release {winner})" in message
    assert "this run changed nothing on any host" in message
    for host in lab.hosts:
        assert (current_release(host)["id"], current_release(host)["status"]) == (winner, "good")
        assert not host.path(f"{STATE}/releases/{loser}").exists()
        assert not host.path(f"{STATE}/lock").exists()


# --- verify.yml on the deployed fleet (last: it leaves drift behind) --------------------------


def findings(run, host) -> list[str]:
    (result,) = run.results(host.name, FINDINGS_TASK)
    return result["msg"] if isinstance(result["msg"], list) else []


def test_verify_finds_a_healthy_fleet_green_and_changes_nothing(lab, first_deploy, tmp_path):
    run = run_playbook(VERIFY, lab.inventory_path, tmp_path)

    assert run.rc == 0 and not run.hosts_with("changed"), run.stats
    for host in lab.hosts:
        (result,) = run.results(host.name, FINDINGS_TASK)
        assert result["msg"].startswith(f"healthy: {current_release(host)['id']} as deployed")


def test_verify_fails_exactly_the_host_of_each_drift_naming_it(lab, first_deploy, tmp_path):
    untouched, edited, guarded, restarted = lab.hosts
    chat = edited.path(f"{edited.package_root}/{CHAT}")
    chat.write_text(chat.read_text() + "# edited by hand\n")
    protected = guarded.path(f"{guarded.package_root}/{PROTECTED}")
    protected.write_text(protected.read_text() + "# edited by hand\n")
    other = sub168(gpu_memory_utilization=0.9)
    moved = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "moved", limit=restarted.name,
                         extravars={"engine_args": other})
    assert moved.rc == 0, moved.stats

    run = run_playbook(VERIFY, lab.inventory_path, tmp_path / "verify")

    assert run.rc != 0 and not run.hosts_with("changed")
    assert run.hosts_with("failures") == {edited.name, guarded.name, restarted.name}
    (edit,) = findings(run, edited)
    assert edit.startswith(f"serving file drift from release {current_release(edited)['id']}: {CHAT}: installed ")
    (guard,) = findings(run, guarded)
    assert guard.startswith("model layer: ") and PROTECTED in guard
    (engine,) = findings(run, restarted)
    assert engine == "engine drift: argument --gpu-memory-utilization: running 0.9, desired 0.95"
