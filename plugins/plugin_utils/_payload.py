# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The payload: files/serving/manifest.yml and the files it names, validated strictly.

Controller side. The manifest is checked on its own first (read_manifest: keys, kinds, names,
sources inside the payload and free of symlinks); then, per host, against what the host has
(plan_for_host: each destination resolved for the host's vLLM layout, inside the serving
allowlist, off the protected list, and claimed by one entry only). Every error names the entry,
and both run before anything is sent to a host.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import REGISTRY, SERVING_TREES, in_serving_trees
from ansible_collections.biv100.serving.plugins.plugin_utils._mapping import MappingError, entry_mapping, failure_points, planned

KINDS = ("file", "dir", "patch")
ENTRY_KEYS = {"name", "kind", "src", "dest", "when", "base_sha256", "mapping"}
# The manifest's keys: the entries, and what it declares besides them (_mapping.py).
MANIFEST_KEYS = {"entries", "failure_points", "planned"}
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]*$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")

# The only condition an entry can carry: the served model's architecture is missing from the
# host's registry (and so must be registered by the payload).
MODEL_UNREGISTERED = "model_unregistered"
CONDITIONS = (MODEL_UNREGISTERED,)


class PayloadError(Exception):
    """The payload cannot be deployed; the message names the entry (and the host's path)."""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    src: Path
    dest: str
    when: str | None = None
    base_sha256: str | None = None
    mapping: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """One file the payload puts at `path` (relative to the package root) on one host."""

    path: str
    entry: Entry
    source: Path  # the overlay file, or the patch for kind patch


@dataclass(frozen=True)
class Manifest:
    """The payload's entries, the failure points it fixes and the mappings it plans."""

    entries: list
    failure_points: list
    planned: list


def read_manifest(payload_dir: Path) -> Manifest:
    manifest_path = payload_dir / "manifest.yml"
    try:
        document = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PayloadError(f"{manifest_path}: {error}") from error
    if not isinstance(document, dict) or "entries" not in document or set(document) - MANIFEST_KEYS:
        raise PayloadError(f"{manifest_path}: expected a mapping of 'entries' (and optionally "
                           "'failure_points' and 'planned')")
    raw_entries = document["entries"] or []
    if not isinstance(raw_entries, list):
        raise PayloadError(f"{manifest_path}: 'entries' must be a list")
    entries = [_entry(payload_dir, position, raw) for position, raw in enumerate(raw_entries, 1)]
    _refuse_duplicates("name", [entry.name for entry in entries])
    try:
        return Manifest(entries, failure_points(document.get("failure_points"), str(manifest_path)),
                        planned(document.get("planned"), str(manifest_path)))
    except MappingError as error:
        raise PayloadError(str(error)) from None


def _entry(payload_dir: Path, position: int, raw) -> Entry:
    label = f"manifest entry {position}"
    if not isinstance(raw, dict):
        raise PayloadError(f"{label}: expected a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise PayloadError(f"{label}: name must be lowercase letters, digits and '-', got {name!r}")
    label = f"manifest entry {name!r}"
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise PayloadError(f"{label}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(ENTRY_KEYS))})")
    missing = sorted(key for key in ("kind", "src", "dest") if not raw.get(key))
    if missing:
        raise PayloadError(f"{label}: missing {', '.join(missing)}")
    kind = raw["kind"]
    if kind not in KINDS:
        raise PayloadError(f"{label}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    entry = Entry(
        name=name,
        kind=kind,
        src=_source(payload_dir, label, kind, raw["src"]),
        dest=_destination(label, kind, raw["dest"]),
        when=_condition(label, raw.get("when")),
        base_sha256=_pin(label, kind, raw.get("base_sha256")),
        mapping=_mapping(label, raw.get("mapping")),
    )
    return entry


def _source(payload_dir: Path, label: str, kind: str, src) -> Path:
    if not isinstance(src, str) or posixpath.isabs(src) or ".." in src.split("/"):
        raise PayloadError(f"{label}: src must be a path inside files/serving, got {src!r}")
    path = payload_dir / src
    _refuse_symlinks(payload_dir, path, label)
    if kind == "dir":
        if not path.is_dir():
            raise PayloadError(f"{label}: src {src} is not a directory")
        for inner in sorted(path.rglob("*")):
            _refuse_symlinks(payload_dir, inner, label)
            _refuse_special(payload_dir, inner, label)
    elif not path.is_file():
        raise PayloadError(f"{label}: src {src} is not a file in {payload_dir}")
    else:
        _refuse_special(payload_dir, path, label)
    return path


def _refuse_symlinks(payload_dir: Path, path: Path, label: str) -> None:
    """A symlink in the payload could make a deploy read (and ship) any controller file."""
    relative = path.relative_to(payload_dir)
    for depth in range(1, len(relative.parts) + 1):
        step = payload_dir.joinpath(*relative.parts[:depth])
        if step.is_symlink():
            raise PayloadError(f"{label}: {step.relative_to(payload_dir)} is a symlink; the payload holds only plain files")


def _refuse_special(payload_dir: Path, path: Path, label: str) -> None:
    """Only plain files with UTF-8 names travel: a FIFO would hang the read, a device would ship
    whatever it yields, a hard link shares its bytes with a file that may lie outside the
    payload, and a name that is not UTF-8 cannot be named on the host the same way."""
    relative = path.relative_to(payload_dir)
    try:
        str(relative).encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError(
            f"{label}: {os.fsencode(relative)!r} has a name that is not UTF-8; rename it"
        ) from None
    info = path.lstat()
    if stat.S_ISDIR(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        raise PayloadError(f"{label}: {relative} is {_special_kind(info.st_mode)}; the payload holds only plain files")
    if info.st_nlink > 1:
        raise PayloadError(
            f"{label}: {relative} is a hard link ({info.st_nlink} names share its content, some may "
            "lie outside the payload); the payload holds only plain files: copy it"
        )


def _special_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _destination(label: str, kind: str, dest) -> str:
    if not isinstance(dest, str) or posixpath.isabs(dest) or "\\" in dest:
        raise PayloadError(f"{label}: dest must be relative to the vllm package root, got {dest!r}")
    if ".." in dest.split("/"):
        raise PayloadError(f"{label}: dest {dest} escapes the vllm package ('..')")
    is_folder = dest.endswith("/")
    if (kind == "dir") != is_folder:
        raise PayloadError(f"{label}: a {kind} entry's dest {'must' if kind == 'dir' else 'must not'} end with '/'")
    normalized = posixpath.normpath(dest) + ("/" if is_folder else "")
    if normalized in ("./", "."):
        raise PayloadError(f"{label}: dest must name a file or folder of the package")
    return normalized


def _condition(label: str, when) -> str | None:
    if when is not None and when not in CONDITIONS:
        raise PayloadError(f"{label}: when must be one of {', '.join(CONDITIONS)}, got {when!r}")
    return when


def _pin(label: str, kind: str, base_sha256) -> str | None:
    if base_sha256 is None:
        return None
    if kind != "file":
        raise PayloadError(f"{label}: base_sha256 pins a whole-file overlay; a {kind} entry cannot carry it")
    if not isinstance(base_sha256, str) or not SHA256_PATTERN.match(base_sha256):
        raise PayloadError(f"{label}: base_sha256 must be 64 lowercase hex digits")
    return base_sha256


def _mapping(label: str, mapping) -> dict:
    try:
        return entry_mapping(mapping, label)
    except MappingError as error:
        raise PayloadError(str(error)) from None


def _refuse_duplicates(what: str, values: list[str], where: str = "the manifest") -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise PayloadError(f"{where}: {what} {value} is claimed by more than one entry")
        seen.add(value)


# --- per host -------------------------------------------------------------------------------


def applies(entry: Entry, vllm_facts: dict) -> bool:
    if entry.when == MODEL_UNREGISTERED:
        # Decided on the vendor's registry: once patched, the installed one serves the model,
        # yet the patch is what keeps it served.
        model = vllm_facts.get("model") or {}
        return bool(model.get("missing_in_base", model.get("missing")))
    return True


def plan_for_host(entries: list[Entry], vllm_facts: dict, protected_extra: list[str] = ()) -> list[Target]:
    """The files the payload puts on this host, each checked against the guard's lists."""
    protected = _protected_paths(vllm_facts, protected_extra)
    targets = []
    for entry in entries:
        if not applies(entry, vllm_facts):
            continue
        dest = _resolve_dest(entry, vllm_facts)
        for target in _expand(entry, dest):
            _check_allowed(target, protected)
            targets.append(target)
    _refuse_duplicates("destination", [target.path for target in targets], "the payload")
    return targets


def _resolve_dest(entry: Entry, vllm_facts: dict) -> str:
    """A file name of the brief (protocol.py, reasoning/, ...) resolves through the facts."""
    brief = vllm_facts["files"]["serving"].get(entry.dest)
    if brief is None:
        return entry.dest
    if not brief["exists"]:
        equivalent = f" (its role is played by {brief['equivalent']})" if brief.get("equivalent") else ""
        raise PayloadError(
            f"manifest entry {entry.name!r}: {entry.dest} does not exist in this host's vLLM "
            f"{vllm_facts['version']} (layout {vllm_facts['layout']}){equivalent}"
        )
    return brief["path"]


def _expand(entry: Entry, dest: str) -> list[Target]:
    if entry.kind != "dir":
        return [Target(dest, entry, entry.src)]
    return [
        Target(posixpath.join(dest, path.relative_to(entry.src).as_posix()), entry, path)
        for path in sorted(entry.src.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]


def _protected_paths(vllm_facts: dict, extra) -> set[str]:
    resolved = {entry["path"] for entry in vllm_facts["files"]["protected"].values() if entry["path"]}
    return resolved | {posixpath.normpath(path) for path in extra}


def _check_allowed(target: Target, protected: set[str]) -> None:
    label = f"manifest entry {target.entry.name!r}"
    if target.path in protected:
        raise PayloadError(f"{label}: {target.path} is a protected model-layer file; the payload never touches it")
    if target.path == REGISTRY:
        if target.entry.when != MODEL_UNREGISTERED:
            raise PayloadError(
                f"{label}: {REGISTRY} may only be deployed with 'when: {MODEL_UNREGISTERED}' "
                "(where the base lacks the model's architecture)"
            )
        return
    if not in_serving_trees(target.path):
        raise PayloadError(
            f"{label}: {target.path} is outside the serving layer "
            f"({', '.join(SERVING_TREES)} and {REGISTRY})"
        )


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def payload_digest(targets: list[Target], contents: dict[str, bytes]) -> str:
    """One digest for what a host receives: every destination path with its content."""
    digest = hashlib.sha256()
    for target in sorted(targets, key=lambda target: target.path):
        digest.update(target.path.encode() + b"\0" + sha256_bytes(contents[target.path]).encode() + b"\n")
    return digest.hexdigest()
