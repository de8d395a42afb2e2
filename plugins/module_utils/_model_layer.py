# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model layer of an installed vllm package as model_guard sees it: what the guard's scope
takes in (the whole package less the serving trees, byte code caches and the ignored patterns),
the state of each file (a sha256, a link's target, or what else it is), and the comparison of a
walk with a baseline.

Runs on the host: standard library only, Python 3.8. Links are recorded, never followed.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import posixpath
import stat

from ansible_collections.biv100.serving.plugins.module_utils._no_follow import staged_for
from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import REGISTRY, in_serving_trees
from ansible_collections.biv100.serving.plugins.module_utils._state_store import utc_timestamp
from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import PROTECTED_FILES, sha256_file


# The baseline's `scope`: it covers the whole model layer. A document without it is not one of
# the guard's baselines.
MODEL_LAYER = "model-layer"
# Byte code caches are written by the interpreter whenever a source is newer than its cache,
# so they appear with the engine's first start; they are left out. A hand-made .pyc whose
# header matches its source would run unseen: that limit is in the module's notes.
SKIPPED_FOLDERS = ("__pycache__",)
SYMLINK = "symlink:"
FILE_TYPES = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)
SHA256_LENGTH = 64
HEX_DIGITS = frozenset("0123456789abcdef")
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
    for is_type, name in FILE_TYPES:
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
        mode = lstat_mode(folder)
        if mode is None or not stat.S_ISDIR(mode):
            return None
    full = os.path.join(package_root, path)
    mode = lstat_mode(full)
    return None if mode is None else state_of(full, mode)


def lstat_mode(path):
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
        if stat.S_ISDIR(lstat_mode(os.path.join(package_root, posixpath.normpath(path))) or 0)
    )


def is_digest(state):
    return len(state) == SHA256_LENGTH and HEX_DIGITS.issuperset(state)
