# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""biv100.serving.serving_submission: write a release's platform submission bundle on the controller.

plugins/plugin_utils/_submission.py decides what the bundle holds from the hosts' exports; this
action puts it at <dest>/<release>/ and <dest>/<release>.tar.gz. Nothing runs on a host.

Only what differs is written, each file through a temporary file in its own folder and a rename
(plugins/module_utils/_no_follow.py, which walks every path one folder at a time without
following a link), so that a rebuild of an unchanged release touches no file and reports
changed=false; files of an earlier build that the bundle no longer holds are removed. The
folder is generated: a symlink or anything but files and folders in it is refused rather than
followed or removed, and so is a <dest>/<release> that is not a real folder.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from ansible import constants as C
from ansible.errors import AnsibleActionFail

from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import project_root
from ansible_collections.biv100.serving.plugins.plugin_utils._submission import (
    FILE_MODE,
    SubmissionError,
    archive,
    build,
)

# build/submissions at the project root, beside build/report and the probes' results.
SUBMISSIONS_FOLDER = ("build", "submissions")

ARGUMENT_SPEC = {
    "release": {"type": "str", "required": True},
    "hosts": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "name": {"type": "str", "required": True},
            "interpreter": {"type": "str", "required": True},
            "export": {"type": "dict"},
        },
    },
    "reference": {"type": "str"},
    "force": {"type": "bool", "default": False},
    "dest": {"type": "path"},
}


def existing_entries(folder: Path) -> dict[str, tuple[str, int]]:
    """{relative path: ("file" | "folder", mode)} of everything under folder, read without
    following a link; a symlink or a special file is refused, naming it."""
    found = {}

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                relative = prefix + entry.name
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    found[relative] = ("folder", stat.S_IMODE(info.st_mode))
                    walk(Path(entry.path), relative + "/")
                elif stat.S_ISREG(info.st_mode):
                    found[relative] = ("file", stat.S_IMODE(info.st_mode))
                else:
                    what = f"a symlink to {os.readlink(entry.path)}" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                    raise AnsibleActionFail(
                        f"{folder / relative} is {what}: the submission folder holds only what the build "
                        "writes; remove it and run again (nothing was written)")

    walk(folder, "")
    return found


def refuse_odd_targets(folder: Path, archive_path: Path) -> bool:
    """Whether the bundle's folder exists; refuses a folder or an archive that is a symlink or
    of another kind, before anything is written."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        exists = False
    else:
        if not stat.S_ISDIR(info.st_mode):
            what = f"a symlink to {os.readlink(folder)}" if stat.S_ISLNK(info.st_mode) else "not a folder"
            raise AnsibleActionFail(f"{folder} is {what}: refusing to write a submission through it "
                                    "(nothing was written)")
        exists = True
    try:
        info = os.lstat(archive_path)
    except FileNotFoundError:
        return exists
    if not stat.S_ISREG(info.st_mode):
        what = f"a symlink to {os.readlink(archive_path)}" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise AnsibleActionFail(f"{archive_path} is {what}: refusing to write the archive through it "
                                "(nothing was written)")
    return exists


def text_or_none(data: bytes | None) -> str | None:
    if data is None:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def file_diff(name: str, before: bytes | None, after: bytes | None) -> dict:
    """One entry of the task's diff: the text, or the sha256 of bytes that are not text."""
    old, new = text_or_none(before), text_or_none(after)
    if old is None or new is None:
        old = f"sha256 {hashlib.sha256(before).hexdigest()}\n" if before is not None else ""
        new = f"sha256 {hashlib.sha256(after).hexdigest()}\n" if after is not None else ""
    return {"before_header": name if before is not None else "(absent)",
            "after_header": name if after is not None else "(absent)",
            "before": old, "after": new}


class Plan:
    """What writing a bundle would change at dest: files to write, entries to remove."""

    def __init__(self, dest: Path, release: str, files: dict[str, bytes], modes: dict[str, int],
                 archive_bytes: bytes):
        self.dest, self.release = dest, release
        self.folder = dest / release
        self.archive_name = f"{release}.tar.gz"
        folder_exists = refuse_odd_targets(self.folder, dest / self.archive_name)
        present = existing_entries(self.folder) if folder_exists else {}
        folder_tree = Tree(str(self.folder))
        self.writes: dict[str, tuple[bytes, int, bytes | None]] = {}  # path under dest -> (bytes, mode, old)
        for path, data in files.items():
            kind, mode = present.get(path, (None, None))
            old = folder_tree.read(path) if kind == "file" else None
            if old != data or mode != modes[path]:
                self.writes[f"{release}/{path}"] = (data, modes[path], old)
        needed_folders = {"/".join(path.split("/")[:depth]) for path in files for depth in range(1, path.count("/") + 1)}
        self.stale_files = sorted((path for path, (kind, _mode) in present.items()
                                   if kind == "file" and path not in files), key=lambda path: path.encode())
        self.stale_folders = sorted((path for path, (kind, _mode) in present.items()
                                     if kind == "folder" and path not in needed_folders),
                                    key=lambda path: (-path.count("/"), path.encode()))
        self.removed_contents = {path: folder_tree.read(path) for path in self.stale_files}
        old_archive = Tree(str(dest)).read(self.archive_name) if dest.is_dir() else None
        archive_mode = stat.S_IMODE(os.lstat(dest / self.archive_name).st_mode) if old_archive is not None else None
        if old_archive != archive_bytes or archive_mode != FILE_MODE:
            self.writes[self.archive_name] = (archive_bytes, FILE_MODE, old_archive)

    @property
    def changed(self) -> list[str]:
        """Every path under dest written or removed, sorted."""
        removed = [f"{self.release}/{path}" for path in self.stale_files + self.stale_folders]
        return sorted([*self.writes, *removed], key=lambda path: path.encode())

    def diff(self) -> list[dict]:
        entries = [file_diff(name, old, data) for name, (data, _mode, old) in sorted(self.writes.items())]
        entries += [file_diff(f"{self.release}/{path}", self.removed_contents[path], None)
                    for path in self.stale_files]
        return entries

    def apply(self) -> None:
        """Remove what an earlier build left, then write what differs. Removal first: a stale
        file may stand where the bundle now needs a folder, and the other way round."""
        self.dest.mkdir(parents=True, exist_ok=True)
        folder_tree = Tree(str(self.folder))
        for path in self.stale_files:
            folder_tree.remove(path)
        for path in self.stale_folders:
            # rmdir never follows a link: a folder swapped for one since the listing fails here.
            os.rmdir(self.folder / path)
        dest_tree = Tree(str(self.dest))
        for name, (data, mode, _old) in sorted(self.writes.items()):
            # Written from dest, a path through the bundle's folder: the folder itself is
            # checked to be no link at every write, like every folder below it.
            dest_tree.write(name, data, mode=mode)


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args: dict, task_vars: dict) -> dict:
        result = {}
        dest = (Path(args["dest"]) if args["dest"] else project_root(C.CONFIG_FILE).joinpath(*SUBMISSIONS_FOLDER)).absolute()

        try:
            bundle = build(args["release"], args["hosts"], reference=args["reference"], force=args["force"])
        except SubmissionError as error:
            raise AnsibleActionFail(f"submission {args['release']}: {error}") from None
        archive_bytes = archive(bundle)
        modes = {path: bundle.mode(path) for path in bundle.files}
        try:
            plan = Plan(dest, bundle.release, bundle.files, modes, archive_bytes)
            if plan.changed and not self._task.check_mode:
                plan.apply()
        except UnsafePath as error:
            raise AnsibleActionFail(f"refusing to write the submission under {dest} through a link or a "
                                    f"non-regular file: {error}") from None
        except OSError as error:
            raise AnsibleActionFail(f"the submission could not be written to {dest}: "
                                    f"{error.filename or dest}: {os.strerror(error.errno or errno.EIO)}") from None

        warnings = [f"{item.host} is left out of submission {bundle.release}: {item.reason}"
                    for item in bundle.left_out]
        if bundle.forced:
            warnings.append(f"submission {bundle.release} is built with force: the release is not good on "
                            + ", ".join(f"{host} ({status})" for host, status in bundle.forced))
        changed = plan.changed
        result.update(
            changed=bool(changed),
            bundle=str(plan.folder),
            archive=str(dest / plan.archive_name),
            archive_sha256=hashlib.sha256(archive_bytes).hexdigest(),
            reference=bundle.reference,
            variants=[variant.summary() for variant in bundle.variants],
            left_out=[{"host": item.host, "reason": item.reason} for item in bundle.left_out],
            written=changed,
            msg=(f"submission {bundle.release}: {len(bundle.variants)} variant(s) from "
                 f"{sum(len(variant.hosts) for variant in bundle.variants)} host(s), "
                 f"{len(changed)} path(s) {'would change' if self._task.check_mode else 'written or removed'}: "
                 f"{plan.folder}"),
        )
        if warnings:
            result["warnings"] = warnings
        if self._task.diff and changed:
            result["diff"] = plan.diff()
        return result
