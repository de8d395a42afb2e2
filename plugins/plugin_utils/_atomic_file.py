# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Files the controller writes (probe results, the ledger's table, the report), whole or not at
all, with the guarantees of the host's state store (module_utils/_state_store.atomic_write):
a temporary file in the same folder, fsynced, renamed over the name, the folder fsynced."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o644) -> None:
    """Replace the file at path with `data` (text is written as UTF-8), mode `mode`.

    A reader sees the old content or the new, never a part, and after a crash the file holds
    one of them: the bytes are fsynced before the rename, and the folder after it. A failure
    before the rename leaves path as it was and no temporary file. Missing folders are made.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staged, target)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
