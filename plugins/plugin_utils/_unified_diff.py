# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Apply a single-file unified diff strictly, hunk by hunk.

Controller side (Python 3.11, standard library only). The payload's `patch` entries are applied
here to each host's pristine base file before anything is written to the host, so a patch that
does not fit a host's base must fail loudly, naming the file and the hunk, rather than land
somewhere plausible:

- every context and removed line must match the original exactly (no fuzz, no whitespace
  folding); a line's ending is not part of the comparison, only whether it has one;
- a hunk may be found at an offset from the line its header states, nearest offset first and
  carried over to the following hunks, as `patch` does; hunks apply in order without overlap;
- `\\ No newline at end of file` is honoured on both sides;
- lines end at "\\n" only (a "\\r" or form feed inside a line is content), and lines the patch
  adds take the original's dominant line ending, so a CRLF file stays CRLF.

The `---`/`+++` headers may name any path (the caller knows which file it is patching), and
text before them (a `diff --git` line, a description) is ignored. A patch for several files,
or anything after the last hunk, is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE_MARKER = "\\"
_CONTEXT, _REMOVED, _ADDED = " ", "-", "+"


class PatchError(ValueError):
    """The patch is malformed or does not apply; the message names the file and the hunk."""


@dataclass
class _HunkLine:
    kind: str  # _CONTEXT, _REMOVED or _ADDED
    text: str  # without its line ending
    ends_with_newline: bool = True  # False once `\ No newline at end of file` follows it


@dataclass
class _Hunk:
    number: int  # 1-based position in the patch, for messages
    header: str  # "@@ -120,6 +120,8 @@"
    old_index: int  # 0-based index of the original line the hunk starts at
    lines: list[_HunkLine] = field(default_factory=list)

    @property
    def old_lines(self) -> list[_HunkLine]:
        return [line for line in self.lines if line.kind != _ADDED]

    @property
    def new_lines(self) -> list[_HunkLine]:
        return [line for line in self.lines if line.kind != _REMOVED]

    def label(self, filename: str) -> str:
        return f"{filename}: hunk {self.number} ({self.header})"


def apply_patch(original: str, patch_text: str, *, filename: str) -> str:
    """Return `original` with the single-file unified diff `patch_text` applied.

    `filename` only names the file in messages. Raises PatchError when the patch is not a
    single-file unified diff or a hunk does not match the original.
    """
    hunks = _parse_patch(patch_text, filename)
    original_lines = _split_lines(original)
    newline = _dominant_newline(original_lines)
    patched: list[str] = []
    copied_up_to = 0  # original lines before this index are in `patched` or replaced
    offset = 0
    for hunk in hunks:
        start = _locate(hunk, original_lines, hunk.old_index + offset, copied_up_to, filename)
        patched.extend(original_lines[copied_up_to:start])
        copied_up_to = start + len(hunk.old_lines)
        patched.extend(_replacement(hunk, original_lines[start:copied_up_to], newline))
        offset = start - hunk.old_index
    patched.extend(original_lines[copied_up_to:])
    return "".join(patched)


# --- reading the patch ----------------------------------------------------------------------


def _parse_patch(patch_text: str, filename: str) -> list[_Hunk]:
    lines = [_strip_ending(line) for line in _split_lines(patch_text)]
    index = _skip_file_header(lines, filename)
    hunks: list[_Hunk] = []
    while index < len(lines):
        if not _HUNK_HEADER.match(lines[index]):
            raise _unexpected_line(lines, index, filename)
        hunk, index = _read_hunk(lines, index, len(hunks) + 1, filename)
        hunks.append(hunk)
    if not hunks:
        raise PatchError(f"{filename}: the patch has no hunks")
    return hunks


def _skip_file_header(lines: list[str], filename: str) -> int:
    """The index just past the `---`/`+++` pair; what comes before it is a free preamble."""
    for index in range(len(lines) - 1):
        if _is_file_header(lines, index):
            return index + 2
    raise PatchError(f"{filename}: not a unified diff (no '---' and '+++' file header)")


def _is_file_header(lines: list[str], index: int) -> bool:
    return (
        index + 1 < len(lines)
        and lines[index].startswith("--- ")
        and lines[index + 1].startswith("+++ ")
    )


def _unexpected_line(lines: list[str], index: int, filename: str) -> PatchError:
    if _is_file_header(lines, index) or lines[index].startswith("diff "):
        return PatchError(
            f"{filename}: the patch touches more than one file (second file at patch line "
            f"{index + 1}: {lines[index]!r}); give each file a patch of its own"
        )
    return PatchError(
        f"{filename}: patch line {index + 1} {lines[index]!r} is neither part of the hunk "
        "before it (by that hunk's '@@' line counts) nor a hunk header"
    )


def _read_hunk(lines: list[str], index: int, number: int, filename: str) -> tuple[_Hunk, int]:
    """The hunk whose header is lines[index], and the index of the line after it."""
    header = _HUNK_HEADER.match(lines[index])
    old_start, old_count, _new_start, new_count = (
        int(value) if value is not None else 1 for value in header.groups()
    )
    # An empty old side states the line *after which* the new lines go.
    old_index = old_start if old_count == 0 else old_start - 1
    hunk = _Hunk(number, header.group(0), old_index)
    old_left, new_left = old_count, new_count
    index += 1
    while old_left or new_left or _is_marker(lines, index):
        if index >= len(lines):
            raise PatchError(f"{hunk.label(filename)} is truncated: the patch ends inside it")
        if _is_marker(lines, index):
            _mark_no_newline(hunk, index, filename)
        else:
            line = _body_line(lines[index], hunk, index, filename)
            if line.kind != _ADDED:
                old_left -= 1
            if line.kind != _REMOVED:
                new_left -= 1
            if old_left < 0 or new_left < 0:
                raise PatchError(
                    f"{hunk.label(filename)} is malformed: patch line {index + 1} is one more "
                    "line than its header counts"
                )
            hunk.lines.append(line)
        index += 1
    _check_newline_markers(hunk, filename)
    return hunk, index


def _is_marker(lines: list[str], index: int) -> bool:
    return index < len(lines) and lines[index].startswith(_NO_NEWLINE_MARKER)


def _mark_no_newline(hunk: _Hunk, index: int, filename: str) -> None:
    """Apply a `\\ No newline at end of file` marker to the hunk line before it."""
    if not hunk.lines or not hunk.lines[-1].ends_with_newline:
        raise PatchError(
            f"{hunk.label(filename)} is malformed: stray '\\ No newline' marker at patch "
            f"line {index + 1}"
        )
    hunk.lines[-1].ends_with_newline = False


def _body_line(text: str, hunk: _Hunk, index: int, filename: str) -> _HunkLine:
    if not text:
        # Editors strip the lone space of an empty context line; patch(1) reads it back too.
        return _HunkLine(_CONTEXT, "")
    if text[0] not in (_CONTEXT, _REMOVED, _ADDED):
        raise PatchError(
            f"{hunk.label(filename)} is malformed: patch line {index + 1} is not a context, "
            f"removed or added line: {text!r}"
        )
    return _HunkLine(text[0], text[1:])


def _check_newline_markers(hunk: _Hunk, filename: str) -> None:
    """Only the last line of a side can lack a newline: the file ends there."""
    for side in (hunk.old_lines, hunk.new_lines):
        if any(not line.ends_with_newline for line in side[:-1]):
            raise PatchError(
                f"{hunk.label(filename)} is malformed: a line marked '\\ No newline at end of "
                "file' is followed by more lines"
            )


# --- applying it ----------------------------------------------------------------------------


def _locate(hunk: _Hunk, lines: list[str], expected: int, lowest: int, filename: str) -> int:
    """The index where the hunk's old lines match, nearest to `expected` and not before
    `lowest` (the end of the previous hunk)."""
    old_lines = hunk.old_lines
    for start in _candidate_starts(expected, lowest, len(lines) - len(old_lines), old_lines):
        if _first_mismatch(old_lines, lines, start) is None:
            return start
    raise PatchError(
        f"{hunk.label(filename)} does not apply: {_why(old_lines, lines, expected, lowest)}"
    )


def _candidate_starts(
    expected: int, lowest: int, highest: int, old_lines: list[_HunkLine]
) -> Iterator[int]:
    if not old_lines:
        # Nothing to match against: an offset could not be told from a wrong place.
        if lowest <= expected <= highest:
            yield expected
        return
    for distance in range(max(expected - lowest, highest - expected) + 1):
        # dict.fromkeys keeps the order and makes distance 0 one candidate, not two.
        for start in dict.fromkeys((expected + distance, expected - distance)):
            if lowest <= start <= highest:
                yield start


def _first_mismatch(old_lines: list[_HunkLine], lines: list[str], start: int) -> int | None:
    """The position in old_lines of the first line that differs at `start`; None if none."""
    for position, expected in enumerate(old_lines):
        index = start + position
        if not 0 <= index < len(lines) or not _same_line(expected, lines[index]):
            return position
    return None


def _same_line(expected: _HunkLine, actual: str) -> bool:
    return (
        _strip_ending(actual) == expected.text and _has_ending(actual) == expected.ends_with_newline
    )


def _why(old_lines: list[_HunkLine], lines: list[str], expected: int, lowest: int) -> str:
    """What stands in the way at the place the header (plus the running offset) states."""
    position = _first_mismatch(old_lines, lines, expected)
    if position is None:
        if expected < lowest:
            return f"its place, line {expected + 1}, lies inside the previous hunk"
        return f"it inserts after line {expected}, past the end of the file ({len(lines)} lines)"
    wanted = old_lines[position]
    index = expected + position
    if 0 <= index < len(lines):
        found = _describe(_strip_ending(lines[index]), _has_ending(lines[index]))
    else:
        found = "end of file"
    return (
        f"expected line {index + 1} {_describe(wanted.text, wanted.ends_with_newline)}, "
        f"found {found}, and it matches at no other offset"
    )


def _describe(text: str, ends_with_newline: bool) -> str:
    return repr(text) if ends_with_newline else f"{text!r} (no newline at end of file)"


def _replacement(hunk: _Hunk, matched: list[str], newline: str) -> list[str]:
    """The hunk's new side: context lines verbatim from the original (their own endings),
    added lines with the file's newline. `matched` holds the original lines the hunk's context
    and removed lines matched, one each."""
    # Checked before any line is taken: running out of `matched` halfway would otherwise end
    # in a StopIteration (a RuntimeError once it leaves a generator) instead of a PatchError.
    if len(matched) != len(hunk.old_lines):
        raise PatchError(
            f"hunk {hunk.number} ({hunk.header}) has {len(hunk.old_lines)} context and removed "
            f"lines, but {len(matched)} original lines were matched for it"
        )
    remaining = iter(matched)
    replacement = []
    for line in hunk.lines:
        if line.kind == _ADDED:
            replacement.append(line.text + (newline if line.ends_with_newline else ""))
            continue
        original = next(remaining)
        if line.kind == _CONTEXT:
            replacement.append(original)
    return replacement


# --- lines ----------------------------------------------------------------------------------


def _split_lines(text: str) -> list[str]:
    """The lines of text with their endings; only "\\n" ends a line, as for patch and git."""
    lines = text.split("\n")
    last = lines.pop()
    return [line + "\n" for line in lines] + ([last] if last else [])


def _strip_ending(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    return line[:-1] if line.endswith("\n") else line


def _has_ending(line: str) -> bool:
    return line.endswith("\n")


def _dominant_newline(lines: list[str]) -> str:
    crlf = sum(line.endswith("\r\n") for line in lines)
    lf = sum(_has_ending(line) for line in lines) - crlf
    return "\r\n" if crlf > lf else "\n"
