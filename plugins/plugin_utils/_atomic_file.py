# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Files the controller writes (probe results, the bench's figures, the ledger's table, the
report), whole or not at all: the host's state store's write (module_utils/_state_store.py),
so that both sides keep the same guarantees - a temporary file in the same folder, fsynced,
renamed over the name, the folder fsynced."""

from __future__ import annotations

import os

from ansible_collections.biv100.serving.plugins.module_utils._state_store import atomic_write


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o644) -> None:
    """Replace the file at path with `data` (text is written as UTF-8), mode `mode`.

    A reader sees the old content or the new, never a part, and after a crash the file holds
    one of them. A failure before the rename leaves path as it was and no temporary file.
    Missing folders are made.
    """
    atomic_write(os.fspath(path), data.encode("utf-8") if isinstance(data, str) else bytes(data), mode)
