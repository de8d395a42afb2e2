"""The strict unified-diff applier: synthetic patches, and difflib patches of real vLLM files."""

from __future__ import annotations

import difflib
import textwrap

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._unified_diff import (
    PatchError,
    _parse_patch,
    _replacement,
    apply_patch,
)

# Twenty numbered lines: every line is unique, so a hunk can only match in one place.
NUMBERED = "".join(f"line {number}\n" for number in range(1, 21))


def unified_diff(before: str, after: str, context: int = 3) -> str:
    """What `diff -u` would write for one file, made with difflib."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        "a/file.py",
        "b/file.py",
        n=context,
    )
    return "".join(_with_no_newline_markers(lines))


def _with_no_newline_markers(lines):
    """difflib leaves an unterminated last line as it is; diff -u ends it and adds a marker."""
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n"
            yield "\\ No newline at end of file\n"


def patch(body: str) -> str:
    return "--- a/file.py\n+++ b/file.py\n" + textwrap.dedent(body)


def test_a_clean_patch_applies_at_its_stated_line():
    after = NUMBERED.replace("line 10\n", "line ten\nline ten and a half\n")
    assert apply_patch(NUMBERED, unified_diff(NUMBERED, after), filename="f.py") == after


def test_a_hunk_is_found_at_an_offset_when_lines_moved():
    after = NUMBERED.replace("line 10\n", "line ten\n")
    moved = "header 1\nheader 2\nheader 3\n" + NUMBERED
    patched = apply_patch(moved, unified_diff(NUMBERED, after), filename="f.py")
    assert patched == "header 1\nheader 2\nheader 3\n" + after


def test_the_offset_found_for_one_hunk_carries_over_to_the_next():
    after = NUMBERED.replace("line 2\n", "line two\n").replace("line 19\n", "line nineteen\n")
    grown = NUMBERED.replace("line 5\n", "line 5\n" + "inserted\n" * 4)
    expected = after.replace("line 5\n", "line 5\n" + "inserted\n" * 4)
    assert apply_patch(grown, unified_diff(NUMBERED, after), filename="f.py") == expected


def test_a_mismatch_names_the_file_the_hunk_and_the_line():
    diff = patch("""\
        @@ -2,3 +2,3 @@
         line 2
        -line 3
        +line three
         line 4
        @@ -10,3 +10,4 @@
         line 10
        -line eleven
        +line 11a
        +line 11b
         line 12
        """)
    with pytest.raises(PatchError) as raised:
        apply_patch(NUMBERED, diff, filename="registry.py")
    assert str(raised.value) == (
        "registry.py: hunk 2 (@@ -10,3 +10,4 @@) does not apply: expected line 11 "
        "'line eleven', found 'line 11', and it matches at no other offset"
    )


def test_no_fuzz_a_whitespace_difference_is_a_mismatch():
    diff = patch("""\
        @@ -1,2 +1,2 @@
         line 1
        -line  2
        +line two
        """)
    with pytest.raises(PatchError, match=r"hunk 1 .* expected line 2 'line  2', found 'line 2'"):
        apply_patch(NUMBERED, diff, filename="f.py")


def test_hunks_must_not_overlap():
    diff = patch("""\
        @@ -1,2 +1,2 @@
         line 1
        -line 2
        +line two
        @@ -2,1 +2,1 @@
        -line 2
        +line 2 again
        """)
    with pytest.raises(PatchError) as raised:
        apply_patch(NUMBERED, diff, filename="f.py")
    assert str(raised.value) == (
        "f.py: hunk 2 (@@ -2,1 +2,1 @@) does not apply: its place, line 2, lies inside the "
        "previous hunk"
    )


def test_several_hunks_apply_in_one_pass():
    after = (
        NUMBERED.replace("line 1\n", "line one\n")
        .replace("line 10\n", "")
        .replace("line 20\n", "line 20\nline 21\n")
    )
    diff = unified_diff(NUMBERED, after, context=2)
    assert diff.count("\n@@ -") == 3
    assert apply_patch(NUMBERED, diff, filename="f.py") == after


def test_lines_can_be_added_at_the_end_of_the_file():
    after = NUMBERED + "line 21\nline 22\n"
    assert apply_patch(NUMBERED, unified_diff(NUMBERED, after), filename="f.py") == after


def test_a_pure_insertion_hunk_goes_after_the_line_it_states():
    diff = patch("""\
        @@ -3,0 +4,1 @@
        +line 3.5
        """)
    expected = NUMBERED.replace("line 3\n", "line 3\nline 3.5\n")
    assert apply_patch(NUMBERED, diff, filename="f.py") == expected


def test_an_empty_file_can_be_given_content():
    diff = patch("""\
        @@ -0,0 +1,2 @@
        +first
        +second
        """)
    assert apply_patch("", diff, filename="f.py") == "first\nsecond\n"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("a\nb\nc", "a\nb\nc\nd"),  # the last line gains a newline and a successor
        ("a\nb\nc\n", "a\nb\nC"),  # the new last line has none
        ("a\nb\nc", "a\nB\nc"),  # an untouched last line without newline is context
    ],
)
def test_no_newline_at_end_of_file_is_honoured_on_both_sides(before, after):
    diff = unified_diff(before, after)
    assert "\n\\ No newline at end of file\n" in diff
    assert apply_patch(before, diff, filename="f.py") == after


def test_a_patch_for_a_file_ending_without_newline_refuses_one_that_has_it():
    diff = patch("""\
        @@ -1,2 +1,2 @@
         a
        -b
        \\ No newline at end of file
        +B
        \\ No newline at end of file
        """)
    assert apply_patch("a\nb", diff, filename="f.py") == "a\nB"
    with pytest.raises(PatchError, match=r"expected line 2 'b' \(no newline at end of file\)"):
        apply_patch("a\nb\n", diff, filename="f.py")


def test_crlf_line_endings_of_the_original_are_kept():
    original = NUMBERED.replace("\n", "\r\n")
    after = NUMBERED.replace("line 10\n", "line ten\nline ten and a half\n")
    patched = apply_patch(original, unified_diff(NUMBERED, after), filename="f.py")
    assert patched == after.replace("\n", "\r\n")


def test_only_newline_ends_a_line():
    original = "a\x0cb\nc\rd\n"  # a form feed and a lone carriage return are content
    diff = patch("""\
        @@ -1,2 +1,2 @@
         a\x0cb
        -c\rd
        +cd
        """)
    assert apply_patch(original, diff, filename="f.py") == "a\x0cb\ncd\n"


def test_an_empty_line_in_a_hunk_is_an_empty_context_line():
    original = "a\n\nb\n"
    diff = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n"
    assert apply_patch(original, diff, filename="f.py") == "a\n\nB\n"


def test_a_preamble_before_the_file_header_is_ignored():
    after = NUMBERED.replace("line 4\n", "line four\n")
    diff = "diff --git a/file.py b/file.py\nindex 1234..5678 100644\n" + unified_diff(
        NUMBERED, after
    )
    assert apply_patch(NUMBERED, diff, filename="f.py") == after


def test_a_patch_touching_two_files_is_refused():
    after = NUMBERED.replace("line 4\n", "line four\n")
    one_file = unified_diff(NUMBERED, after)
    with pytest.raises(PatchError, match=r"f\.py: the patch touches more than one file"):
        apply_patch(NUMBERED, one_file + one_file, filename="f.py")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("this is not a patch\n", r"not a unified diff"),
        ("", r"not a unified diff"),
        ("--- a/f\n+++ b/f\n", r"the patch has no hunks"),
        ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n line 1\n", r"hunk 1 .* is truncated"),
        ("--- a/f\n+++ b/f\n@@ -1 +1,2 @@\n-line 1\n-line 2\n+a\n+b\n", r"hunk 1 .* one more"),
        ("--- a/f\n+++ b/f\n@@ -1 +1 @@\n*line 1\n", r"hunk 1 .* not a context, removed"),
        ("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-line 1\n+one\n+two\n", r"patch line 6 '\+two' is nei"),
        ("--- a/f\n+++ b/f\n@@ -1 +1 @@\n\\ No newline at end of file\n", r"stray"),
        (
            "--- a/f\n+++ b/f\n@@ -1,2 +1,1 @@\n-a\n\\ No newline at end of file\n-b\n+c\n",
            r"followed by more lines",
        ),
    ],
)
def test_garbage_is_refused_with_a_reason(text, message):
    with pytest.raises(PatchError, match=message):
        apply_patch(NUMBERED, text, filename="f.py")


def test_a_hunk_given_fewer_original_lines_than_it_matched_is_a_patch_error():
    # apply_patch hands each hunk exactly the lines its old side matched; were it ever to hand
    # fewer, the replacement must fail as a PatchError naming the hunk, not run out of lines
    # inside a generator (which Python turns into "RuntimeError: generator raised StopIteration").
    hunk = _parse_patch(patch("""\
        @@ -2,3 +2,3 @@
         line 2
        -line 3
        +line three
         line 4
        """), "f.py")[0]
    with pytest.raises(PatchError, match=r"hunk 1 \(@@ -2,3 \+2,3 @@\) has 3 context and removed lines, but 2"):
        list(_replacement(hunk, ["line 2\n", "line 3\n"], "\n"))


# --- round trip over real files -------------------------------------------------------------

REAL_FILES = [
    "model_executor/models/registry.py",
    "entrypoints/openai/protocol.py",
    "entrypoints/openai/serving_chat.py",
    "entrypoints/chat_utils.py",
]


def _edited(source: str) -> str:
    """A spread of edits over a real file: a line changed, one removed, two added, at the end."""
    lines = source.splitlines(keepends=True)
    third = len(lines) // 3
    lines[third] = lines[third].rstrip("\n") + "  # changed\n"
    del lines[2 * third]
    lines[len(lines) // 2 : len(lines) // 2] = ["# added one\n", "# added two\n"]
    return "".join(lines) + "# appended at the end\n"


@pytest.mark.parametrize("relative_path", REAL_FILES)
def test_difflib_patches_of_real_vllm_files_apply_back_exactly(vllm_trees, relative_path):
    original = (vllm_trees["0.10.1.1"] / relative_path).read_text(encoding="utf-8")
    # splitlines() (used by difflib) and the applier agree on lines only without these.
    assert not any(separator in original for separator in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028")
    edited = _edited(original)
    diff = unified_diff(original, edited)
    assert diff.count("\n@@ ") >= 3
    assert apply_patch(original, diff, filename=relative_path) == edited
    assert apply_patch(edited, unified_diff(edited, original), filename=relative_path) == original
