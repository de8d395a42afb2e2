"""The real engine's runtime and hosts, in what can be checked without building them: the ELF
fix its torch extension needs, where a runtime may live, what its key follows, which hosts of a
lab run it, and the real-engine group's settings against Sub168."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
import yaml

import lab
import real_engine
from engine_defaults import SUB168
from real_engine import simulated_marker

from ansible_collections.biv100.serving.plugins.module_utils._bench_run import SIMULATED_HEADER

REPO = Path(__file__).resolve().parents[3]
PT_GNU_STACK, PT_LOAD = 0x6474E551, 1


def elf_with_program_headers(path: Path, headers: list[tuple[int, int]]) -> Path:
    """A minimal 64-bit little-endian ELF file holding these (type, flags) program headers."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 64)  # e_phoff: right after this header
    struct.pack_into("<HH", header, 0x36, 56, len(headers))  # e_phentsize, e_phnum
    table = b"".join(struct.pack("<II", kind, flags) + bytes(48) for kind, flags in headers)
    path.write_bytes(bytes(header) + table)
    return path


def program_flags(path: Path) -> list[int]:
    data = path.read_bytes()
    count = struct.unpack_from("<H", data, 0x38)[0]
    return [struct.unpack_from("<I", data, 64 + 56 * number + 4)[0] for number in range(count)]


def test_the_executable_stack_flag_is_cleared_and_nothing_else_changes(tmp_path):
    library = elf_with_program_headers(tmp_path / "lib.so", [(PT_LOAD, 0b101), (PT_GNU_STACK, 0b111)])
    before = library.read_bytes()
    assert real_engine.clear_executable_stack(library) is True
    assert program_flags(library) == [0b101, 0b110]  # the load segment keeps its X; the stack is RW
    after = library.read_bytes()
    assert [i for i, (old, new) in enumerate(zip(before, after)) if old != new] == [64 + 56 + 4]
    assert real_engine.clear_executable_stack(library) is False  # once cleared, nothing to do


def test_a_file_that_is_not_a_64_bit_elf_is_refused_untouched(tmp_path):
    text = tmp_path / "not-elf.so"
    text.write_bytes(b"#!/bin/sh\n" + bytes(100))
    with pytest.raises(real_engine.RuntimeBuildError, match="not a 64-bit little-endian ELF file"):
        real_engine.clear_executable_stack(text)
    assert text.read_bytes() == b"#!/bin/sh\n" + bytes(100)


def test_a_relative_runtime_folder_is_refused(monkeypatch):
    monkeypatch.setenv(real_engine.RUNTIME_DIR_ENV, "relative/runtime")
    with pytest.raises(real_engine.RuntimeBuildError, match="must be an absolute path"):
        real_engine.runtime_parent()


@pytest.mark.parametrize("parent, hidden", [("/root/.cache/runtime", "/root"), ("/opt/runtime", "/opt"),
                                            ("/usr/local/corex/x", "/usr/local/corex"), ("/run/x", "/run")])
def test_a_runtime_where_the_hosts_cannot_see_it_is_refused(monkeypatch, parent, hidden):
    monkeypatch.setenv(real_engine.RUNTIME_DIR_ENV, parent)
    with pytest.raises(lab.LabError, match=f"is under {hidden}, which every lab host mounts over: "
                                           "its hosts could not run it"):
        lab._refuse_unless_shared(real_engine.current_runtime().path, "the real engine's runtime",
                                  "the hosts' venv", "its hosts could not run it")


def test_the_runtime_key_follows_what_the_runtime_is_built_from(monkeypatch, tmp_path):
    for name in real_engine.RUNTIME_INPUTS:
        (tmp_path / name).write_text(f"{name}\n")
    monkeypatch.setattr(real_engine, "HERE", tmp_path)
    key = real_engine.runtime_key()
    (tmp_path / "unrelated.py").write_text("# not an input\n")
    assert real_engine.runtime_key() == key
    (tmp_path / "requirements.txt").write_text("torch==2.6.0\n")
    assert real_engine.runtime_key() != key
    changed_input = real_engine.runtime_key()
    monkeypatch.setattr(real_engine, "RUNTIME_FORMAT", real_engine.RUNTIME_FORMAT + 1)
    assert real_engine.runtime_key() not in (key, changed_input)


def test_every_package_the_runtime_installs_is_pinned():
    lines = [line for line in (Path(real_engine.__file__).parent / "requirements.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines and all(line.count("==") == 1 for line in lines), [l for l in lines if "==" not in l]
    pinned = dict(line.split("==") for line in lines)
    # What 0.10.1.1 needs beside its wheel (tests/lab/real_engine/requirements.txt says why).
    assert pinned["torch"] == "2.6.0" and pinned["transformers"].startswith("4.55.")
    assert pinned["intel_extension_for_pytorch"] == "2.6.0" and pinned["xgrammar"] == "0.1.21"


def test_the_lab_runs_the_real_engine_on_the_hosts_named():
    assert lab._engines(4, []) == ["standin"] * 4
    assert lab._engines(4, ["h4"]) == ["standin", "standin", "standin", "vllm"]
    assert lab._engines(3, ["lab-h1", "h3"]) == ["vllm", "standin", "vllm"]
    with pytest.raises(lab.LabError, match="the lab's hosts are h1 to h4"):
        lab._engines(4, ["h5"])
    assert lab._parse_hosts("none") == [] and lab._parse_hosts("h2, h4") == ["h2", "h4"]


def test_the_real_engine_group_runs_sub168_with_one_rank_and_short_chunks_gated_on_the_protocol_probes():
    settings = yaml.safe_load((REPO / "inventory" / "lab" / "group_vars" / "lab_real_engine.yml").read_text())
    assert "engine_args" not in settings and settings["engine_args_overrides"] == {
        "tensor_parallel_size": 1, "max_num_batched_tokens": 1024, "guided_decoding_backend": "xgrammar",
        "guided_decoding_disable_any_whitespace": True,
        "middleware": f"{real_engine.MARKER_MODULE}.{simulated_marker.mark_simulated.__name__}"}
    assert SUB168["tensor_parallel_size"] == 4
    assert settings["engine_command"][0] == "/usr/local/corex/lab/bin/in-engine-root"
    assert settings["engine_command"][1:] == ["/usr/local/corex/python3/bin/python3", "-m",
                                              "vllm.entrypoints.openai.api_server"]
    assert settings["probe_checks"] == ["protocol"] and list(settings["serving_gates"]) == ["functional"]
    assert not any(name.startswith("BIV100_STANDIN") for name in settings["engine_env"])


def test_a_build_removes_the_runtimes_no_lab_runs(tmp_path):
    old, running, current = (tmp_path / f"vllm-cpu-{key}" for key in ("aaa", "bbb", "ccc"))
    for folder in (old, running, current):
        (folder / "root").mkdir(parents=True)
    real_engine._remove_others(real_engine.Runtime(current), in_use={running})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["vllm-cpu-bbb", "vllm-cpu-ccc"]


def test_the_marker_puts_the_stand_in_s_header_on_every_answer():
    class Answer:
        headers = {}

    async def call_next(_request):
        return Answer()

    answer = asyncio.run(simulated_marker.mark_simulated(None, call_next))
    # The header the collection reads to mark figures simulated (engine_bench, engine_quality).
    assert list(answer.headers) == [SIMULATED_HEADER] == [simulated_marker.SIMULATED_HEADER[0]]
