"""The payload's validation: every hostile or broken entry is refused, naming the entry."""

from __future__ import annotations

import copy
import hashlib
import os
import stat
import textwrap

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._payload import (
    PayloadError,
    read_manifest,
    payload_digest,
    plan_for_host,
)

FACTS = {
    "version": "0.10.1.1",
    "layout": "v0",
    "files": {
        "serving": {
            "serving_chat.py": {"path": "entrypoints/openai/serving_chat.py", "exists": True},
            "registry.py": {"path": "model_executor/models/registry.py", "exists": True},
            "reasoning/": {"path": "reasoning/", "exists": True},
            "qwen3coder_tool_parser.py": {"path": None, "exists": False,
                                          "equivalent": "tool_parsers/qwen3_engine_tool_parser.py"},
        },
        "protected": {
            "sampler.py": {"path": "model_executor/layers/sampler.py", "exists": True},
            "mamba_cache.py": {"path": None, "exists": False},
        },
    },
    "model": {"missing": []},
}


def facts(model_missing=()):
    result = copy.deepcopy(FACTS)
    result["model"]["missing"] = list(model_missing)
    return result


@pytest.fixture
def payload(tmp_path):
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "serving_chat.py").write_text("print('chat')\n")
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "registry.patch").write_text("--- a\n+++ b\n")
    (tmp_path / "reasoning").mkdir()
    (tmp_path / "reasoning" / "__init__.py").write_text("")
    (tmp_path / "reasoning" / "mine_parser.py").write_text("X = 1\n")
    return tmp_path


def write_manifest(payload, body: str):
    (payload / "manifest.yml").write_text(textwrap.dedent(body))


def refused(payload, body: str) -> str:
    write_manifest(payload, body)
    with pytest.raises(PayloadError) as error:
        plan_for_host(read_manifest(payload).entries, facts())
    return str(error.value)


CHAT = """\
    entries:
      - name: chat
        kind: file
        src: overlays/serving_chat.py
        dest: serving_chat.py
"""


def test_a_brief_name_resolves_through_the_hosts_layout(payload):
    write_manifest(payload, CHAT)
    (target,) = plan_for_host(read_manifest(payload).entries, facts())
    assert target.path == "entrypoints/openai/serving_chat.py"
    assert target.source == payload / "overlays" / "serving_chat.py"


def test_a_dir_entry_expands_to_its_files(payload):
    write_manifest(payload, """\
        entries:
          - {name: parsers, kind: dir, src: reasoning, dest: reasoning/}
    """)
    paths = [target.path for target in plan_for_host(read_manifest(payload).entries, facts())]
    assert paths == ["reasoning/__init__.py", "reasoning/mine_parser.py"]


def test_the_registry_entry_applies_only_where_the_model_is_unregistered(payload):
    write_manifest(payload, """\
        entries:
          - {name: registry, kind: patch, src: patches/registry.patch, dest: registry.py, when: model_unregistered}
    """)
    entries = read_manifest(payload).entries
    assert plan_for_host(entries, facts()) == []
    (target,) = plan_for_host(entries, facts(model_missing=["Qwen3_5ForConditionalGeneration"]))
    assert target.path == "model_executor/models/registry.py"


def test_the_registry_entry_stays_where_only_the_patch_serves_the_model(payload):
    write_manifest(payload, """\
        entries:
          - {name: registry, kind: patch, src: patches/registry.patch, dest: registry.py, when: model_unregistered}
    """)
    patched = facts()
    patched["model"]["missing_in_base"] = ["Qwen3_5ForConditionalGeneration"]
    (target,) = plan_for_host(read_manifest(payload).entries, patched)
    assert target.path == "model_executor/models/registry.py"


@pytest.mark.parametrize("body, message", [
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py, mode: '0644'}\n",
     "manifest entry 'chat': unknown keys mode"),
    ("entries:\n  - {name: chat, kind: copy, src: overlays/serving_chat.py, dest: serving_chat.py}\n",
     "manifest entry 'chat': kind must be one of file, dir, patch"),
    ("entries:\n  - {name: chat, kind: file, dest: serving_chat.py}\n",
     "manifest entry 'chat': missing src"),
    ("entries:\n  - {name: Chat!, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py}\n",
     "manifest entry 1: name must be lowercase"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/nope.py, dest: serving_chat.py}\n",
     "manifest entry 'chat': src overlays/nope.py is not a file"),
    ("entries:\n  - {name: chat, kind: file, src: ../etc/passwd, dest: serving_chat.py}\n",
     "manifest entry 'chat': src must be a path inside files/serving"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: ../../site.py}\n",
     "manifest entry 'chat': dest ../../site.py escapes the vllm package"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: /usr/lib/x.py}\n",
     "manifest entry 'chat': dest must be relative to the vllm package root"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py, when: always}\n",
     "manifest entry 'chat': when must be one of model_unregistered"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py, base_sha256: abc}\n",
     "manifest entry 'chat': base_sha256 must be 64 lowercase hex digits"),
    ("entries:\n  - {name: parsers, kind: dir, src: reasoning, dest: reasoning}\n",
     "manifest entry 'parsers': a dir entry's dest must end with '/'"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py}\n"
     "  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: protocol.py}\n",
     "the manifest: name chat is claimed by more than one entry"),
    ("files: []\n", "expected a mapping of 'entries'"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py,\n"
     "     mapping: {why: speed}}\n",
     "manifest entry 'chat': mapping has unknown keys why"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py,\n"
     "     mapping: {idea: a, source: b}}\n",
     "manifest entry 'chat': mapping gives both source and idea"),
    ("entries:\n  - {name: chat, kind: file, src: overlays/serving_chat.py, dest: serving_chat.py,\n"
     "     mapping: {source: a, proven_by: [N Two]}}\n",
     "manifest entry 'chat': mapping proven_by must name probes"),
    ("entries: []\nfailure_points:\n  - {name: n-above, failure: OOM, fixed_by: n-within}\n",
     "failure point 1: missing proven_by"),
    ("entries: []\nfailure_points:\n  - {name: n-above, failure: OOM, fixed_by: n-within, proven_by: []}\n",
     "failure point 1 (n-above): proven_by names no check"),
    ("entries: []\nplanned:\n  - {source: ConsumeTile, place: serving_chat.py}\n",
     "planned mapping 1 must be a mapping of exactly source, place, change"),
])
def test_a_malformed_manifest_is_refused_naming_the_entry(payload, body, message):
    write_manifest(payload, body)
    with pytest.raises(PayloadError) as error:
        read_manifest(payload).entries
    assert message in str(error.value)


def test_a_protected_target_is_refused(payload):
    message = refused(payload, """\
        entries:
          - {name: sampler, kind: file, src: overlays/serving_chat.py, dest: model_executor/layers/sampler.py}
    """)
    assert message == ("manifest entry 'sampler': model_executor/layers/sampler.py is a protected "
                       "model-layer file; the payload never touches it")


def test_an_inventory_protected_path_is_refused_too(payload):
    write_manifest(payload, """\
        entries:
          - {name: mine, kind: file, src: overlays/serving_chat.py, dest: entrypoints/openai/mine.py}
    """)
    with pytest.raises(PayloadError, match="entrypoints/openai/mine.py is a protected"):
        plan_for_host(read_manifest(payload).entries, facts(), ["entrypoints/openai/mine.py"])


def test_a_target_outside_the_serving_layer_is_refused(payload):
    message = refused(payload, """\
        entries:
          - {name: worker, kind: file, src: overlays/serving_chat.py, dest: worker/worker.py}
    """)
    assert message.startswith("manifest entry 'worker': worker/worker.py is outside the serving layer")


def test_the_registry_without_its_condition_is_refused(payload):
    message = refused(payload, """\
        entries:
          - {name: registry, kind: patch, src: patches/registry.patch, dest: registry.py}
    """)
    assert "may only be deployed with 'when: model_unregistered'" in message


def test_a_brief_name_absent_in_the_layout_is_refused_with_its_equivalent(payload):
    message = refused(payload, """\
        entries:
          - {name: tools, kind: file, src: overlays/serving_chat.py, dest: qwen3coder_tool_parser.py}
    """)
    assert "qwen3coder_tool_parser.py does not exist in this host's vLLM 0.10.1.1 (layout v0)" in message
    assert "tool_parsers/qwen3_engine_tool_parser.py" in message


def test_two_entries_on_one_destination_are_refused(payload):
    message = refused(payload, CHAT + """\
      - name: chat-again
        kind: file
        src: overlays/serving_chat.py
        dest: entrypoints/openai/serving_chat.py
    """)
    assert message == ("the payload: destination entrypoints/openai/serving_chat.py is claimed by "
                       "more than one entry")


def test_a_symlink_in_the_payload_is_refused(payload):
    (payload / "overlays" / "link.py").symlink_to("/etc/hostname")
    write_manifest(payload, """\
        entries:
          - {name: link, kind: file, src: overlays/link.py, dest: entrypoints/openai/link.py}
    """)
    with pytest.raises(PayloadError, match="overlays/link.py is a symlink"):
        read_manifest(payload).entries


def test_a_symlink_inside_a_dir_entry_is_refused(payload):
    (payload / "reasoning" / "sneaky.py").symlink_to("/etc/shadow")
    write_manifest(payload, """\
        entries:
          - {name: parsers, kind: dir, src: reasoning, dest: reasoning/}
    """)
    with pytest.raises(PayloadError, match="reasoning/sneaky.py is a symlink"):
        read_manifest(payload).entries


PARSERS = """\
    entries:
      - {name: parsers, kind: dir, src: reasoning, dest: reasoning/}
"""


@pytest.mark.parametrize("make, message", [
    (lambda folder: os.mkfifo(folder / "pipe.py"), "manifest entry 'parsers': reasoning/pipe.py is a FIFO"),
    # A character device, made the way a hostile checkout would leave one: a node of /dev/null.
    (lambda folder: os.mknod(folder / "null.py", 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
     "manifest entry 'parsers': reasoning/null.py is a character device"),
    (lambda folder: os.link(folder / "mine_parser.py", folder / "twin_parser.py"),
     "manifest entry 'parsers': reasoning/mine_parser.py is a hard link (2 names"),
    (lambda folder: (folder / os.fsdecode(b"caf\xe9_parser.py")).write_text("X = 2\n"),
     "manifest entry 'parsers': b'reasoning/caf\\xe9_parser.py' has a name that is not UTF-8"),
], ids=["fifo", "character-device", "hard-link", "name-not-utf8"])
def test_only_plain_files_with_utf8_names_travel(payload, make, message):
    make(payload / "reasoning")
    write_manifest(payload, PARSERS)
    with pytest.raises(PayloadError) as error:
        read_manifest(payload).entries
    assert message in str(error.value)


def test_a_file_entry_that_is_a_hard_link_is_refused(payload):
    os.link(payload / "overlays" / "serving_chat.py", payload / "chat-twin.py")
    write_manifest(payload, CHAT)
    with pytest.raises(PayloadError, match="overlays/serving_chat.py is a hard link"):
        read_manifest(payload).entries


def test_the_payload_digest_covers_paths_and_contents(payload):
    write_manifest(payload, CHAT)
    targets = plan_for_host(read_manifest(payload).entries, facts())
    one = payload_digest(targets, {targets[0].path: b"a"})
    assert one == payload_digest(targets, {targets[0].path: b"a"})
    assert one != payload_digest(targets, {targets[0].path: b"b"})
    expected_line = targets[0].path.encode() + b"\0" + hashlib.sha256(b"a").hexdigest().encode() + b"\n"
    assert one == hashlib.sha256(expected_line).hexdigest()


def test_a_mapping_reads_idea_as_source_and_the_manifest_its_failure_points_and_plans(payload):
    write_manifest(payload, """\
        entries:
          - name: chat
            kind: file
            src: overlays/serving_chat.py
            dest: serving_chat.py
            mapping: {idea: fast path, place: serving_chat.py, change: overlay, proven_by: n-two}
        failure_points:
          - {name: n-above, failure: n above max_num_seqs, fixed_by: chat, proven_by: [n-above-max-num-seqs, guard]}
        planned:
          - {source: agent_reduce_by_key ConsumeTile, place: serving_chat.py, change: fast path / safe path split}
    """)

    manifest = read_manifest(payload)

    assert manifest.entries[0].mapping == {"source": "fast path", "place": "serving_chat.py", "change": "overlay",
                                           "proven_by": ["n-two"]}
    assert manifest.failure_points == [{"name": "n-above", "failure": "n above max_num_seqs", "fixed_by": "chat",
                                        "proven_by": ["n-above-max-num-seqs", "guard"]}]
    assert manifest.planned == [{"source": "agent_reduce_by_key ConsumeTile", "place": "serving_chat.py",
                                 "change": "fast path / safe path split"}]
