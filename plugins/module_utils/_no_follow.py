# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading and writing files under a root without ever following a symlink below it.

Runs on the host: standard library only, Python 3.8.

The host's own vllm tree is untrusted input, like the payload: a vendor image may link one
folder into another, and a path that names the serving layer could then lead into the model
layer. Checking a path's name proves nothing about where it leads, and checking it with
`lstat` before writing leaves a window in which a folder can be swapped for a link. So every
operation here walks the path one component at a time, opening each folder with O_NOFOLLOW
relative to the one before (openat), and acts on the final name relative to the last folder's
descriptor: what was checked is what is written, and a link anywhere between the root and the
file stops the operation with UnsafePath, naming the link and where it points.

The root itself is the anchor (the package root vllm_facts found, the state store): links
above it are the host's business, such as /usr/local/corex -> /usr/local/corex-4.3.0.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat

from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import sha256_fd

_HASH_CHUNK = 1024 * 1024
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


# A write's temporary file beside its final name: .<name>.<pid>.<8 hex digits>.
_STAGED = re.compile(r"^\.(.+)\.([0-9]+)\.[0-9a-f]{8}$")


def staged_for(path):
    """The path whose write a temporary file at `path` belongs to, or None if it is none."""
    folder, _slash, name = path.rpartition("/")
    match = _STAGED.match(name)
    return folder + "/" * bool(folder) + match.group(1) if match else None


class UnsafePath(Exception):
    """A path that leads somewhere its name does not say; the message names the culprit."""

    def __init__(self, relative, culprit, why):
        self.relative = relative
        self.culprit = culprit  # the offending component, relative to the root
        self.why = why
        Exception.__init__(self, "%s: %s %s" % (relative, culprit, why))


def _kind(mode):
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def parts_of(relative):
    """The components of a relative path; refuses what could leave the root."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if relative.startswith("/") or ".." in parts or not parts:
        raise UnsafePath(relative, relative, "is not a path inside the root")
    return parts


class Tree(object):
    """The files under `root`, reached without following any link below it."""

    def __init__(self, root):
        self.root = root

    # --- looking -----------------------------------------------------------------------

    def inspect(self, relative):
        """What is at `relative`, without changing anything.

        Returns {"kind": "file"|"absent", "missing": [folders, relative to the root, that a
        write would create]}; raises UnsafePath for a link or a non-folder on the way, or a
        final name that is not a regular file.
        """
        parts = parts_of(relative)
        fd = self._open_root(create=False)
        if fd is None:
            return {"kind": "absent", "missing": self._prefixes(parts, 0)}
        try:
            for depth in range(len(parts) - 1):
                child = self._open_folder(fd, parts, depth, create=False)
                os.close(fd)
                fd = child
                if fd is None:
                    return {"kind": "absent", "missing": self._prefixes(parts, depth)}
            return {"kind": "file" if self._final(fd, parts) else "absent", "missing": []}
        finally:
            if fd is not None:
                os.close(fd)

    def digest(self, relative):
        """The sha256 of the regular file at `relative`, None when there is none."""
        return self.read(relative, hashed=True)

    def read(self, relative, hashed=False):
        """The bytes of the regular file at `relative` (its sha256 if hashed), None if absent."""
        parts = parts_of(relative)
        with self._named(relative), self._folder(parts, create=False) as fd:
            if fd is None or not self._final(fd, parts):
                return None
            try:
                stream = os.open(parts[-1], _READ, dir_fd=fd)
            except OSError as error:
                if error.errno == errno.ELOOP:  # swapped for a link since the lstat
                    raise self._unsafe(fd, parts, len(parts) - 1)
                raise
            try:
                if not stat.S_ISREG(os.fstat(stream).st_mode):  # swapped since the lstat
                    raise self._unsafe(fd, parts, len(parts) - 1)
                return sha256_fd(stream) if hashed else _read_fd(stream)
            finally:
                os.close(stream)

    # --- changing ----------------------------------------------------------------------

    def write(self, relative, data, mode=None):
        """Replace `relative` with `data` atomically: a temporary file beside it, fsynced and
        renamed within the same opened folder, then the folder fsynced. Missing folders are
        created (0755). An existing file keeps its mode and, where we may, its owner."""
        parts = parts_of(relative)
        with self._named(relative), self._folder(parts, create=True) as fd:
            existing = self._final(fd, parts)
            if mode is None:
                mode = stat.S_IMODE(existing.st_mode) if existing else 0o644
            staged = self._staged_name(parts[-1])
            out = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(out, view):]
                    os.fchmod(out, mode)
                    if existing and os.geteuid() == 0:
                        os.fchown(out, existing.st_uid, existing.st_gid)
                    os.fsync(out)
                finally:
                    os.close(out)
                os.replace(staged, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                _unlink_quietly(staged, fd)
                raise
            self._sweep_stale(fd, parts[-1])
            os.fsync(fd)

    def remove(self, relative):
        """Remove the regular file at `relative`; True when there was one."""
        parts = parts_of(relative)
        with self._named(relative), self._folder(parts, create=False) as fd:
            if fd is None or not self._final(fd, parts):
                return False
            os.unlink(parts[-1], dir_fd=fd)
            os.fsync(fd)
            return True

    @contextlib.contextmanager
    def _named(self, relative):
        """An OSError names the path it was about, not the component or temporary name a
        call relative to a folder's descriptor gives it (or none, as ENOSPC from a write)."""
        try:
            yield
        except OSError as error:
            error.filename = os.path.join(self.root, relative)
            raise

    # --- the walk ----------------------------------------------------------------------

    def _open_root(self, create):
        """The root's descriptor (followed if a link: it is the anchor); None when absent."""
        if create and not os.path.isdir(self.root):
            os.makedirs(self.root, 0o755)
        try:
            return os.open(self.root, _DIRECTORY & ~os.O_NOFOLLOW)
        except OSError as error:
            if error.errno == errno.ENOENT and not create:
                return None
            raise

    def _folder(self, parts, create):
        return _FolderOf(self, parts, create)

    def _open_folder(self, fd, parts, depth, create):
        """The descriptor of parts[depth] inside fd; None when absent (and not created)."""
        name = parts[depth]
        while True:
            try:
                return os.open(name, _DIRECTORY, dir_fd=fd)
            except OSError as error:
                if error.errno == errno.ENOENT and create:
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                    except OSError as mkdir_error:
                        if mkdir_error.errno != errno.EEXIST:
                            raise
                    continue
                if error.errno == errno.ENOENT:
                    return None
                if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise self._unsafe(fd, parts, depth)
                raise

    def _final(self, fd, parts):
        """The lstat of the final name when it is a regular file, None when absent."""
        try:
            info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError as error:
            if error.errno == errno.ENOENT:
                return None
            raise
        if not stat.S_ISREG(info.st_mode):
            raise self._unsafe(fd, parts, len(parts) - 1, info)
        # A hard link is harmless here: a write renames a new file over this name, so the
        # other names keep their content.
        return info

    def _unsafe(self, fd, parts, depth, info=None):
        culprit = "/".join(parts[:depth + 1])
        if info is None:
            info = os.stat(parts[depth], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(parts[depth], dir_fd=fd)
            return UnsafePath("/".join(parts), culprit, "is a symlink to %s" % target)
        return UnsafePath("/".join(parts), culprit, "is %s, not %s" % (
            _kind(info.st_mode), "a regular file" if depth == len(parts) - 1 else "a folder"))

    @staticmethod
    def _prefixes(parts, depth):
        return ["/".join(parts[:index + 1]) + "/" for index in range(depth, len(parts) - 1)]

    @staticmethod
    def _staged_name(name):
        return ".%s.%d.%s" % (name, os.getpid(), os.urandom(4).hex())

    @staticmethod
    def _sweep_stale(fd, name):
        """Remove the temporary files of earlier writes of `name` whose process is gone (a run
        killed between creating one and renaming it), so that a re-run leaves none behind."""
        for entry in os.listdir(fd):
            staged = _STAGED.match(entry)
            if staged and staged.group(1) == name and not _running(int(staged.group(2))):
                _unlink_quietly(entry, fd)


class _FolderOf(object):
    """The opened folder holding a path's final name (None when absent), closed on exit."""

    def __init__(self, tree, parts, create):
        self.tree, self.parts, self.create, self.fd = tree, parts, create, None

    def __enter__(self):
        fd = self.tree._open_root(self.create)
        if fd is None:
            return None
        for depth in range(len(self.parts) - 1):
            try:
                child = self.tree._open_folder(fd, self.parts, depth, self.create)
            finally:
                os.close(fd)
            if child is None:
                return None
            fd = child
        self.fd = fd
        return fd

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
        return False


def _read_fd(fd):
    chunks = []
    while True:
        chunk = os.read(fd, _HASH_CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _unlink_quietly(name, fd):
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass
