"""The facts playbook against the lab: what it reports, what it refuses, and that it is read-only."""

from __future__ import annotations

import hashlib

import pytest

from playbook_runs import run_playbook

FACTS = "playbooks/facts.yml"
SUMMARY_TASK = "Show what the host has"
# Everything the collection may ever write on a host; /root and /run hold ssh's own traces.
HOST_STATE = ("/opt", "/usr/local/corex", "/var/lib/biv100-serving", "/etc/biv100-serving",
              "/var/log/biv100-serving")

pytestmark = pytest.mark.lab


def host_of(lab, variant: str):
    return next(host for host in lab.hosts if host.variant == variant)


def snapshot(lab) -> dict[str, str]:
    digests = {}
    for host in lab.hosts:
        for top in HOST_STATE:
            root = host.path(top)
            for path in sorted(root.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    key = f"{host.name}:{top}/{path.relative_to(root)}"
                    digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


@pytest.fixture(scope="module")
def pristine(lab):
    """The hosts' files before this module's runs; the last test compares with them."""
    return snapshot(lab)


def test_every_host_is_summarised_with_what_the_lab_built(lab, pristine, tmp_path):
    run = run_playbook(FACTS, lab.inventory_path, tmp_path)
    assert run.rc == 0, run.stats
    assert run.hosts_with("ok") == {host.name for host in lab.hosts}
    assert not run.hosts_with("failures") and not run.hosts_with("changed")
    for host in lab.hosts:
        (result,) = run.results(host.name, SUMMARY_TASK)
        summary = result["msg"]
        assert summary[0].startswith(f"vLLM {host.vllm_version} (layout v0)")
        qwen3_5 = "yes" if host.variant == "vendor" else "no"
        assert summary[1].endswith(f"Qwen3_5 registered: {qwen3_5}")
        assert summary[4] == f"GPUs: {host.gpu_count} x Iluvatar BI-V100 32768 MiB; free: {host.gpu_count}"


def test_check_mode_reports_the_same(lab, pristine, tmp_path):
    normal = run_playbook(FACTS, lab.inventory_path, tmp_path / "normal")
    checked = run_playbook(FACTS, lab.inventory_path, tmp_path / "check", check=True)
    assert checked.rc == 0
    for host in lab.hosts:
        assert checked.results(host.name, SUMMARY_TASK) == normal.results(host.name, SUMMARY_TASK)


def test_an_interpreter_without_vllm_fails_naming_it(lab, pristine, tmp_path):
    host = lab.hosts[0]
    run = run_playbook(FACTS, lab.inventory_path, tmp_path, limit=host.name,
                       extravars={"facts_vllm_python": "/usr/bin/python3"})
    assert run.hosts_with("failures") == {host.name}
    (message,) = run.failure_messages(host.name)
    assert "/usr/bin/python3" in message and "vllm" in message


def test_a_registry_that_does_not_parse_fails_naming_the_line(lab, pristine, tmp_path):
    host = host_of(lab, "vendor")
    registry = host.path(f"{host.package_root}/model_executor/models/registry.py")
    original = registry.read_bytes()
    lines = original.decode().splitlines(keepends=True)
    broken_line = 40
    lines.insert(broken_line - 1, "def broken(:\n")
    try:
        registry.write_text("".join(lines))
        run = run_playbook(FACTS, lab.inventory_path, tmp_path, limit=host.name)
    finally:
        registry.write_bytes(original)
    assert run.hosts_with("failures") == {host.name}
    (message,) = run.failure_messages(host.name)
    assert "registry.py" in message and f"line {broken_line}" in message


def test_a_missing_registry_fails_naming_the_file(lab, pristine, tmp_path):
    host = host_of(lab, "vendor-unregistered")
    registry = host.path(f"{host.package_root}/model_executor/models/registry.py")
    aside = registry.with_suffix(".aside")
    registry.rename(aside)
    try:
        run = run_playbook(FACTS, lab.inventory_path, tmp_path, limit=host.name)
    finally:
        aside.rename(registry)
    assert run.hosts_with("failures") == {host.name}
    (message,) = run.failure_messages(host.name)
    assert "model_executor/models/registry.py" in message


def test_fewer_gpus_than_the_tensor_parallel_size_fails_every_host(lab, pristine, tmp_path):
    run = run_playbook(FACTS, lab.inventory_path, tmp_path,
                       extravars={"preflight_tensor_parallel_size": 8})
    assert run.hosts_with("failures") == {host.name for host in lab.hosts}
    for host in lab.hosts:
        assert f"tensor_parallel_size is 8 but /usr/local/corex/bin/ixsmi reports {host.gpu_count} GPUs" \
            in run.failure_messages(host.name)[0]


def test_a_model_the_base_cannot_register_is_refused_where_it_cannot(lab, pristine, tmp_path):
    upstream = host_of(lab, "upstream")
    unregistered = host_of(lab, "vendor-unregistered")
    run = run_playbook(FACTS, lab.inventory_path, tmp_path,
                       limit=f"{upstream.name},{unregistered.name}",
                       extravars={"facts_model_path": "/opt/models/qwen3_5"})
    assert run.hosts_with("failures") == {upstream.name}
    (message,) = run.failure_messages(upstream.name)
    assert "Qwen3_5ForConditionalGeneration" in message and "cannot be registered" in message
    (summary,) = run.results(unregistered.name, SUMMARY_TASK)
    assert "served: no, registrable" in summary["msg"][2]


def test_no_run_changed_a_file_on_any_host(lab, pristine):
    assert snapshot(lab) == pristine
