# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where an installed vllm package keeps the files this collection cares about.

Runs on the host: standard library only, Python 3.8. Nothing here imports vllm; the package is
read as files. Paths are relative to the package root (the `vllm/` folder) and use "/";
a trailing "/" names a folder.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import os

# The first marker present in the package names its layout (vllm-layouts.md, checked against the
# 0.8.5, 0.10.1.1, 0.11.0 and 0.33.0 source releases):
#   v0        0.8 to 0.10: the V0 engine's worker is still shipped, beside v1/
#   v1-split  0.33: the OpenAI entrypoints are split into one folder per endpoint
#   v1        0.11: V0 is gone, the OpenAI entrypoints are still one flat folder
LAYOUT_MARKERS = (
    ("v0", "worker/model_runner.py"),
    ("v1-split", "entrypoints/openai/chat_completion/"),
    ("v1", "v1/engine/core.py"),
)
UNKNOWN_LAYOUT = "unknown"

# Where each file of the product brief may live, oldest location first; the first one present
# is the file. The vendor base is a V0-era fork, so where a release ships a V0 file beside its
# V1 counterpart (scheduler, sampler, xformers, model_runner) the V0 one, which its engine runs,
# comes first. Every candidate carries the file's own name: a file that took over the role under
# another name is an equivalent (below), never a candidate.
SERVING_FILES = {
    "protocol.py": (
        "entrypoints/openai/protocol.py",
        "entrypoints/openai/chat_completion/protocol.py",
    ),
    "serving_chat.py": ("entrypoints/openai/serving_chat.py",),
    "qwen3coder_tool_parser.py": (
        "entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py",
        # Tool parsers moved to vllm/tool_parsers/, where upstream kept this name for a while.
        "tool_parsers/qwen3coder_tool_parser.py",
    ),
    "reasoning/": ("reasoning/",),
    # Not entrypoints/api_server.py: that is the demo /generate server.
    "api_server.py": ("entrypoints/openai/api_server.py",),
    "chat_utils.py": ("entrypoints/chat_utils.py",),
    "cli_args.py": (
        "entrypoints/openai/cli_args.py",
        "entrypoints/common/cli_args.py",
    ),
    # The model registry; the other registry.py files register inputs, tokenizers, templates.
    "registry.py": ("model_executor/models/registry.py",),
}

PROTECTED_FILES = {
    "qwen3_5.py": ("model_executor/models/qwen3_5.py",),
    "model_runner.py": (
        "worker/model_runner.py",
        "v1/worker/gpu/model_runner.py",
    ),
    "_custom_ops.py": ("_custom_ops.py",),
    "sampler.py": (
        "model_executor/layers/sampler.py",
        "v1/sample/sampler.py",
    ),
    # Not config/scheduler.py: that is the SchedulerConfig dataclass.
    "scheduler.py": (
        "core/scheduler.py",
        "v1/core/sched/scheduler.py",
    ),
    "sequence.py": ("sequence.py",),
    "xformers.py": (
        "attention/backends/xformers.py",
        "v1/attention/backends/xformers.py",
    ),
    "paged_attn.py": (
        "attention/ops/paged_attn.py",
        "v1/attention/ops/paged_attn.py",
    ),
    "prefix_prefill.py": (
        "attention/ops/prefix_prefill.py",
        "v1/attention/ops/prefix_prefill.py",
    ),
    # Not lora/layers/logits_processor.py: that wraps this one for LoRA.
    "logits_processor.py": ("model_executor/layers/logits_processor.py",),
    "mamba_cache.py": ("model_executor/models/mamba_cache.py",),
    "arg_utils.py": ("engine/arg_utils.py",),
}
# Every location any of them may have, whatever the layout: what a payload or a submission bundle
# must never name.
PROTECTED_LOCATIONS = frozenset(path for paths in PROTECTED_FILES.values() for path in paths)

# Files that took over the role of an absent name under another name (vllm-layouts.md,
# "Equivalents"). Reported beside the absent name so a payload can be retargeted knowingly.
EQUIVALENTS = {
    "serving_chat.py": ("entrypoints/openai/chat_completion/serving.py",),
    "chat_utils.py": ("renderers/chat_utils/",),
    "qwen3coder_tool_parser.py": ("tool_parsers/qwen3_engine_tool_parser.py",),
}

# Version files, in the order vllm itself reads them (version.py imports _version.py).
VERSION_FILES = ("_version.py", "version.py")

_HASH_CHUNK = 1024 * 1024
# Byte code caches change on every import; they are not part of a package's content.
_IGNORED_FOLDERS = ("__pycache__",)


def detect_layout(package_root):
    """Name the layout of the vllm package at package_root (see LAYOUT_MARKERS)."""
    for layout, marker in LAYOUT_MARKERS:
        if _present(package_root, marker):
            return layout
    return UNKNOWN_LAYOUT


def resolve_files(package_root, table):
    """Report where each name of `table` (SERVING_FILES, PROTECTED_FILES) is, with its sha256.

    Every entry has `path` (None when absent), `exists`, `sha256` and `equivalent`; a folder
    entry also has `files`, the sha256 of each file in it by path, and for `sha256` the
    listing_digest of those.
    """
    return {name: _resolve(package_root, name, candidates) for name, candidates in table.items()}


def _resolve(package_root, name, candidates):
    path = _first_present(package_root, candidates)
    entry = {
        "path": path,
        "exists": path is not None,
        "equivalent": None if path else _first_present(package_root, EQUIVALENTS.get(name, ())),
    }
    digest = _folder_digest if name.endswith("/") else _file_digest
    entry.update(digest(package_root, path))
    return entry


def _file_digest(package_root, path):
    return {"sha256": sha256_file(os.path.join(package_root, path)) if path else None}


def _folder_digest(package_root, folder):
    files = folder_digests(package_root, folder) if folder else {}
    return {"sha256": listing_digest(files) if folder else None, "files": files}


def _first_present(package_root, candidates):
    for candidate in candidates:
        if _present(package_root, candidate):
            return candidate
    return None


def _present(package_root, relative_path):
    path = os.path.join(package_root, relative_path)
    return os.path.isdir(path) if relative_path.endswith("/") else os.path.isfile(path)


def sha256_file(path, follow_symlinks=True):
    """The sha256 of a file, read in chunks so a large file never sits in memory whole.

    With follow_symlinks=False a final name that is a link is not opened (ELOOP).
    """
    flags = os.O_RDONLY | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_fd(fd):
    """The sha256 of what is left to read from an open file descriptor."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: os.read(fd, _HASH_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def folder_digests(package_root, folder):
    """The sha256 of every file under `folder` (relative, ending in "/"), by relative path."""
    digests = {}
    for directory, subdirectories, files in os.walk(os.path.join(package_root, folder)):
        subdirectories[:] = [name for name in subdirectories if name not in _IGNORED_FOLDERS]
        for name in files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, package_root).replace(os.sep, "/")
            digests[relative] = sha256_file(path)
    return dict(sorted(digests.items()))


def listing_digest(digests):
    """One sha256 for a set of files: that of their `sha256sum` listing, sorted by path.

    `cd vllm && find reasoning -type f ! -path '*/__pycache__/*' | LC_ALL=C sort
    | xargs sha256sum | sha256sum` gives the same value.
    """
    listing = "".join("%s  %s\n" % (digests[path], path) for path in sorted(digests))
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()


def package_version(package_root):
    """The version of the vllm package at package_root, or None when nothing states one.

    The installer's metadata beside the package comes first, as importlib.metadata would
    report it; a tree without one (a source checkout, a vendor copy) states it in its
    version files.
    """
    return _dist_info_version(package_root) or _version_file_version(package_root)


def _dist_info_version(package_root):
    pattern = os.path.join(os.path.dirname(package_root), "vllm-*.dist-info", "METADATA")
    for metadata in sorted(glob.glob(pattern)):
        version = _metadata_version(metadata)
        if version:
            return version
    return None


def _metadata_version(metadata):
    """The Version header of a core metadata file (RFC 822 headers end at the first blank line)."""
    try:
        with open(metadata, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if not line.strip():
                    break
                field, _colon, value = line.partition(":")
                if field == "Version":
                    return value.strip()
    except OSError:
        pass
    return None


def _version_file_version(package_root):
    for name in VERSION_FILES:
        version = _assigned_version(os.path.join(package_root, name))
        if version:
            return version
    return None


def _assigned_version(path):
    """The string a module-level `__version__ = ...` assigns in a Python file, read with ast.

    Only module-level statements count: version.py assigns a "dev" fallback inside an
    `except` block that must not be taken for the version.
    """
    try:
        with open(path, "rb") as stream:
            tree = ast.parse(stream.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for statement in tree.body:
        if _assigns_name(statement, "__version__") and _is_string(statement.value):
            return statement.value.value
    return None


def _assigns_name(statement, name):
    return isinstance(statement, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == name for target in statement.targets
    )


def _is_string(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str)
