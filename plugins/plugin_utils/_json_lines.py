# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The JSON Lines files the controller keeps (the fleet's ledger, a tuning run's candidates):
lines appended whole and on disk before the call returns, and read back in the order written.

Only its newline ends a line. The last line a killed writer left without one is cut off by the
next append, so that the new line stands alone, and left out by a reader, which names it to
warn(message). Any other line that is not JSON is an error naming the file and the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# How much of a torn line a warning shows.
FRAGMENT_CHARS = 80
# How far back from the end an append looks for the newline before a torn line, per read.
_BLOCK = 65536


class JsonLinesError(ValueError):
    """Lines that cannot be written, or a file that cannot be read: the message names the file,
    `reason` says what is wrong."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.reason = reason


def append(path: str | os.PathLike, documents: list, sort_keys: bool = False) -> None:
    """Append each document as one line (one write), flushed and fsynced, the folder too when the
    file is new; missing folders are made. Nothing is written when one is not JSON."""
    path = Path(path)
    try:
        data = "".join(json.dumps(document, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys) + "\n"
                       for document in documents).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise JsonLinesError(path, f"not JSON: {error}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    with open(path, "a+b") as stream:
        _cut_torn_line(stream)
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    if created:
        _fsync_folder(path.parent)


def read(path: str | os.PathLike, warn=None, torn_means: str = "") -> list[tuple[int, object]]:
    """[(line number, document)] of every line, in order; [] when the file does not exist.
    A torn last line is left out and named to warn, with `torn_means` (what leaving it out means)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as error:
        raise JsonLinesError(path, f"cannot be read: {error}") from None
    lines = text.split("\n")
    torn = lines.pop()  # after the last newline: empty unless the last line was cut short
    if torn and warn is not None:
        shown = torn if len(torn) <= FRAGMENT_CHARS else torn[:FRAGMENT_CHARS] + "..."
        warn(f"{path}: line {len(lines) + 1} was cut short (the run stopped while writing it) and is left "
             f"out{'; ' + torn_means if torn_means else ''}: {shown}")
    documents = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            documents.append((number, json.loads(line)))
        except ValueError as error:
            raise JsonLinesError(path, f"line {number}: not JSON: {error}") from None
    return documents


def _cut_torn_line(stream) -> None:
    """Truncate the file after its last newline (opened for append: writes go to its end)."""
    end = stream.seek(0, os.SEEK_END)
    position = end
    while position > 0:
        start = max(0, position - _BLOCK)
        stream.seek(start)
        block = stream.read(position - start)
        if position == end and block.endswith(b"\n"):
            return
        newline = block.rfind(b"\n")
        if newline >= 0:
            stream.truncate(start + newline + 1)
            return
        position = start
    if end:
        stream.truncate(0)


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
