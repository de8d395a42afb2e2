"""Layout detection, file resolution, digests and versions over the real vLLM releases."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from ansible_collections.biv100.serving.plugins.module_utils import _vllm_layout as layout
from vllm_sources import LAYOUT_VERSIONS

# vllm-layouts.md, one column per release of LAYOUT_VERSIONS: the relevant file of each name
# (the bold one where a name occurs several times, the V0 one where both are bold, the GPU one
# of 0.33's model runners, the V1 sampler of 0.33), relative to the package; None where the
# table has '—'.
EXPECTED_PATHS = {
    "protocol.py": (
        "entrypoints/openai/protocol.py",
        "entrypoints/openai/protocol.py",
        "entrypoints/openai/protocol.py",
        "entrypoints/openai/chat_completion/protocol.py",
    ),
    "serving_chat.py": (
        "entrypoints/openai/serving_chat.py",
        "entrypoints/openai/serving_chat.py",
        "entrypoints/openai/serving_chat.py",
        None,
    ),
    "qwen3coder_tool_parser.py": (
        None,
        "entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py",
        "entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py",
        None,
    ),
    "reasoning/": ("reasoning/", "reasoning/", "reasoning/", "reasoning/"),
    "api_server.py": (
        "entrypoints/openai/api_server.py",
        "entrypoints/openai/api_server.py",
        "entrypoints/openai/api_server.py",
        "entrypoints/openai/api_server.py",
    ),
    "chat_utils.py": (
        "entrypoints/chat_utils.py",
        "entrypoints/chat_utils.py",
        "entrypoints/chat_utils.py",
        None,
    ),
    "cli_args.py": (
        "entrypoints/openai/cli_args.py",
        "entrypoints/openai/cli_args.py",
        "entrypoints/openai/cli_args.py",
        "entrypoints/common/cli_args.py",
    ),
    "registry.py": (
        "model_executor/models/registry.py",
        "model_executor/models/registry.py",
        "model_executor/models/registry.py",
        "model_executor/models/registry.py",
    ),
    "qwen3_5.py": (None, None, None, "model_executor/models/qwen3_5.py"),
    "model_runner.py": (
        "worker/model_runner.py",
        "worker/model_runner.py",
        None,
        "v1/worker/gpu/model_runner.py",
    ),
    "_custom_ops.py": ("_custom_ops.py", "_custom_ops.py", "_custom_ops.py", "_custom_ops.py"),
    "sampler.py": (
        "model_executor/layers/sampler.py",
        "model_executor/layers/sampler.py",
        "v1/sample/sampler.py",
        "v1/sample/sampler.py",
    ),
    "scheduler.py": (
        "core/scheduler.py",
        "core/scheduler.py",
        "v1/core/sched/scheduler.py",
        "v1/core/sched/scheduler.py",
    ),
    "sequence.py": ("sequence.py", "sequence.py", "sequence.py", "sequence.py"),
    "xformers.py": (
        "attention/backends/xformers.py",
        "attention/backends/xformers.py",
        "v1/attention/backends/xformers.py",
        None,
    ),
    "paged_attn.py": (
        "attention/ops/paged_attn.py",
        "attention/ops/paged_attn.py",
        "attention/ops/paged_attn.py",
        "v1/attention/ops/paged_attn.py",
    ),
    "prefix_prefill.py": (
        "attention/ops/prefix_prefill.py",
        "attention/ops/prefix_prefill.py",
        "attention/ops/prefix_prefill.py",
        "v1/attention/ops/prefix_prefill.py",
    ),
    "logits_processor.py": (
        "model_executor/layers/logits_processor.py",
        "model_executor/layers/logits_processor.py",
        "model_executor/layers/logits_processor.py",
        "model_executor/layers/logits_processor.py",
    ),
    "mamba_cache.py": (
        "model_executor/models/mamba_cache.py",
        "model_executor/models/mamba_cache.py",
        None,
        None,
    ),
    "arg_utils.py": (
        "engine/arg_utils.py",
        "engine/arg_utils.py",
        "engine/arg_utils.py",
        "engine/arg_utils.py",
    ),
}

# vllm-layouts.md, "Equivalents where a name is absent".
EXPECTED_EQUIVALENTS = {
    "0.33.0": {
        "serving_chat.py": "entrypoints/openai/chat_completion/serving.py",
        "chat_utils.py": "renderers/chat_utils/",
        "qwen3coder_tool_parser.py": "tool_parsers/qwen3_engine_tool_parser.py",
    },
}

# vllm-layouts.md, row "reasoning/ (package)", 0.8.5 and 0.10.1.1.
EXPECTED_REASONING_FILES = {
    "0.8.5": [
        "__init__.py",
        "abs_reasoning_parsers.py",
        "deepseek_r1_reasoning_parser.py",
        "granite_reasoning_parser.py",
    ],
    "0.10.1.1": [
        "__init__.py",
        "abs_reasoning_parsers.py",
        "deepseek_r1_reasoning_parser.py",
        "glm4_moe_reasoning_parser.py",
        "gptoss_reasoning_parser.py",
        "granite_reasoning_parser.py",
        "hunyuan_a13b_reasoning_parser.py",
        "mistral_reasoning_parser.py",
        "qwen3_reasoning_parser.py",
        "step3_reasoning_parser.py",
    ],
}

EXPECTED_LAYOUTS = {"0.8.5": "v0", "0.10.1.1": "v0", "0.11.0": "v1", "0.33.0": "v1-split"}

BRIEF_TABLE = dict(layout.SERVING_FILES, **layout.PROTECTED_FILES)


def test_the_expected_table_covers_every_name_of_the_brief():
    assert sorted(EXPECTED_PATHS) == sorted(BRIEF_TABLE)
    assert len(layout.SERVING_FILES) == 8 and len(layout.PROTECTED_FILES) == 12


@pytest.fixture(scope="module")
def resolved(vllm_trees):
    return {
        version: dict(
            layout.resolve_files(root, layout.SERVING_FILES),
            **layout.resolve_files(root, layout.PROTECTED_FILES),
        )
        for version, root in vllm_trees.items()
    }


@pytest.mark.parametrize("version", LAYOUT_VERSIONS)
@pytest.mark.parametrize("name", sorted(EXPECTED_PATHS))
def test_each_name_resolves_to_the_file_vllm_layouts_names(resolved, version, name):
    expected = EXPECTED_PATHS[name][LAYOUT_VERSIONS.index(version)]
    entry = resolved[version][name]
    assert entry["path"] == expected
    assert entry["exists"] is (expected is not None)
    assert entry["equivalent"] == EXPECTED_EQUIVALENTS.get(version, {}).get(name)


@pytest.mark.parametrize("version", LAYOUT_VERSIONS)
def test_sha256_is_the_file_digest_or_null_when_absent(resolved, vllm_trees, version):
    for name, entry in resolved[version].items():
        if name.endswith("/"):
            continue
        expected = (
            hashlib.sha256((vllm_trees[version] / entry["path"]).read_bytes()).hexdigest()
            if entry["exists"]
            else None
        )
        assert entry["sha256"] == expected, name


@pytest.mark.parametrize("version", sorted(EXPECTED_REASONING_FILES))
def test_reasoning_package_reports_each_file_with_its_digest(resolved, vllm_trees, version):
    reasoning = resolved[version]["reasoning/"]
    expected = ["reasoning/" + name for name in EXPECTED_REASONING_FILES[version]]
    assert list(reasoning["files"]) == expected
    for path, digest in reasoning["files"].items():
        assert digest == hashlib.sha256((vllm_trees[version] / path).read_bytes()).hexdigest()


def test_package_digest_is_the_sha256sum_listing_the_docstring_gives(resolved, vllm_trees):
    command = (
        "find reasoning -type f ! -path '*/__pycache__/*' | LC_ALL=C sort"
        " | xargs sha256sum | sha256sum"
    )
    shell = subprocess.run(
        command, shell=True, cwd=vllm_trees["0.33.0"], capture_output=True, text=True, check=True
    )
    assert resolved["0.33.0"]["reasoning/"]["sha256"] == shell.stdout.split()[0]


def test_folder_digests_leave_byte_code_caches_out(tmp_path):
    (tmp_path / "reasoning" / "__pycache__").mkdir(parents=True)
    (tmp_path / "reasoning" / "__init__.py").write_text("")
    (tmp_path / "reasoning" / "__pycache__" / "__init__.cpython-310.pyc").write_bytes(b"\0")
    assert list(layout.folder_digests(str(tmp_path), "reasoning/")) == ["reasoning/__init__.py"]


def test_absent_package_has_no_files(tmp_path):
    entry = layout.resolve_files(str(tmp_path), {"reasoning/": ("reasoning/",)})["reasoning/"]
    assert entry == {"path": None, "exists": False, "equivalent": None, "sha256": None, "files": {}}


@pytest.mark.parametrize("version", LAYOUT_VERSIONS)
def test_layout_is_named_by_its_markers(vllm_trees, version):
    assert layout.detect_layout(vllm_trees[version]) == EXPECTED_LAYOUTS[version]


def test_a_folder_without_markers_has_an_unknown_layout(tmp_path):
    assert layout.detect_layout(tmp_path) == "unknown"


@pytest.mark.parametrize("version", LAYOUT_VERSIONS)
def test_version_of_a_source_tree_comes_from_its_version_file(vllm_trees, version):
    assert layout.package_version(str(vllm_trees[version])) == version


def test_installed_metadata_beside_the_package_comes_first(tmp_path):
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "_version.py").write_text("__version__ = version = '0.10.1.1'\n")
    dist_info = tmp_path / "vllm-0.10.1.1+corex.4.3.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.1.1+corex.4.3.0\n"
        "\nVersion: the description, not a header\n"
    )
    assert layout.package_version(str(package)) == "0.10.1.1+corex.4.3.0"


def test_a_version_assigned_only_as_a_fallback_is_not_the_version(tmp_path):
    # vllm's version.py assigns "dev" in an `except` block when _version.py cannot be imported.
    (tmp_path / "version.py").write_text(
        "try:\n    from ._version import __version__\nexcept Exception:\n    __version__ = 'dev'\n"
    )
    assert layout.package_version(str(tmp_path)) is None
    (tmp_path / "version.py").write_text("__version__ = '0.8.5+corex'\n")
    assert layout.package_version(str(tmp_path)) == "0.8.5+corex"
