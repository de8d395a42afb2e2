# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's on-host state, and how it is written so that nothing is ever half-written.

Runs on the host: standard library only, Python 3.8.

    <state_dir>/lock                          held for a whole run; names its holder
    <state_dir>/baseline/protected.json       first-contact sha256 of every protected file
    <state_dir>/base/<package path>           pristine vendor copy of every file ever overlaid
    <state_dir>/releases/<id>/release.json    one deployment: status, files, digests
    <state_dir>/releases/<id>/files/<path>    its staged content
    <state_dir>/current -> releases/<id>      switched atomically

Every file is written to a temporary file in its own directory, fsynced and renamed over its
name, then the directory is fsynced: a reader (or a run interrupted at any instant) sees the
old content or the new, never a part.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time

DEFAULT_STATE_DIR = "/var/lib/biv100-serving"
# How every time the collection records is written: UTC, to the second (ISO 8601).
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
LOCK_NAME = "lock"
CURRENT_LINK = "current"


class StateDir(object):
    """Paths of the state store rooted at `root`."""

    def __init__(self, root=DEFAULT_STATE_DIR):
        self.root = root

    @property
    def lock(self):
        return os.path.join(self.root, LOCK_NAME)

    @property
    def baseline(self):
        return os.path.join(self.root, "baseline", "protected.json")

    @property
    def quality_baseline(self):
        """{release, score}: the first good release's quality score."""
        return os.path.join(self.root, "baseline", "quality.json")

    @property
    def base_quality(self):
        """{release: base, score, ...}: the vendor's base scored on the quality set, once, before
        the first payload went in."""
        return os.path.join(self.root, "baseline", "quality-base.json")

    def base_copy(self, package_path):
        return os.path.join(self.root, "base", package_path)

    def release_dir(self, release_id):
        return os.path.join(self.root, "releases", release_id)

    def release_record(self, release_id):
        return os.path.join(self.release_dir(release_id), "release.json")

    def release_file(self, release_id, package_path):
        return os.path.join(self.release_dir(release_id), "files", package_path)

    @property
    def base_index(self):
        """{package path: sha256 of the vendor's file, or None where the vendor has none}."""
        return os.path.join(self.root, "base", "index.json")

    @property
    def current(self):
        return os.path.join(self.root, CURRENT_LINK)

    def current_release(self):
        """The id `current` points at, or None before the first release."""
        try:
            return os.path.basename(os.readlink(self.current))
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.EINVAL):
                return None
            raise


def utc_timestamp():
    return time.strftime(TIMESTAMP_FORMAT, time.gmtime())


def mark_status(record, status, reason, **details):
    """Set a release record's status and append it, with when and why, to its history."""
    record["status"] = status
    record.setdefault("history", []).append(
        dict(status=status, at=utc_timestamp(), reason=reason, **details)
    )


def first_good(release, record_of):
    """The first `good` release from `release` back along each record's predecessor, or None.

    `record_of(id)` returns a release's record or None; file times never decide the order.
    """
    seen = set()
    while release and release not in seen:
        seen.add(release)
        record = record_of(release)
        if record is None:
            return None
        if record.get("status") == "good":
            return release
        release = record.get("previous")
    return None


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data, mode=0o644):
    """Replace the file at path with the bytes `data`, whole or not at all.

    The bytes go to a temporary file in the same folder (a rename never crosses filesystems),
    which gets `mode`, is fsynced and renamed over path; then the folder is fsynced, so that
    the rename itself outlives a crash. A failure before the rename leaves path as it was and
    no temporary file. Missing folders on the way are made.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staged, path)
    except BaseException:
        try:
            os.unlink(staged)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)


def write_json(path, document):
    atomic_write(path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def read_json(path, default=None):
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return default
        raise


def switch_symlink(link, target):
    """Point link at target in one rename: it never dangles nor is missing in between."""
    directory = os.path.dirname(link)
    staged = os.path.join(directory, ".%s.%d" % (os.path.basename(link), os.getpid()))
    if os.path.lexists(staged):
        os.unlink(staged)
    os.symlink(target, staged)
    os.replace(staged, link)
    fsync_dir(directory)
