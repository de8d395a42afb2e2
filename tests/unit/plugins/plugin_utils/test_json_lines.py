"""The controller's JSON Lines files: lines appended whole, a torn last line cut off by the next
append and left out (named) by a reader, any other bad line an error naming it."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils import _json_lines as json_lines


def test_documents_are_appended_as_lines_and_read_back_in_order_with_their_numbers(tmp_path):
    path = tmp_path / "new" / "folder" / "lines.jsonl"
    json_lines.append(path, [{"b": 1, "a": "é"}])
    json_lines.append(path, [{"n": 2}, [3]], sort_keys=True)
    assert path.read_text(encoding="utf-8") == '{"b": 1, "a": "é"}\n{"n": 2}\n[3]\n'
    assert json_lines.read(path) == [(1, {"b": 1, "a": "é"}), (2, {"n": 2}), (3, [3])]
    assert json_lines.read(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize("torn", ['{"n": 3', '{"n": 3}', "x" * 200_000])
def test_a_torn_last_line_is_left_out_named_and_cut_by_the_next_append(tmp_path, torn):
    path = tmp_path / "lines.jsonl"
    json_lines.append(path, [{"n": 1}, {"n": 2}])
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(torn)  # a writer killed mid-line; only the newline ends a line
    warnings = []
    assert json_lines.read(path, warnings.append, torn_means="it counts as not run") == [(1, {"n": 1}), (2, {"n": 2})]
    (warning,) = warnings
    assert warning.startswith(f"{path}: line 3 was cut short") and "; it counts as not run: " in warning
    assert torn[:json_lines.FRAGMENT_CHARS] in warning and len(warning) < 300
    json_lines.append(path, [{"n": 4}])
    assert path.read_text() == '{"n": 1}\n{"n": 2}\n{"n": 4}\n'


def test_a_file_of_one_torn_line_is_emptied_before_the_append(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_text('{"half')
    json_lines.append(path, [{"n": 1}])
    assert json_lines.read(path) == [(1, {"n": 1})]


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_text('{"n": 1}\n\n{not json\n{"n": 4}\n')
    with pytest.raises(json_lines.JsonLinesError, match=rf"^{path}: line 3: not JSON: ") as raised:
        json_lines.read(path)
    assert raised.value.reason.startswith("line 3: not JSON")


def test_a_document_that_is_not_json_writes_nothing(tmp_path):
    path = tmp_path / "lines.jsonl"
    json_lines.append(path, [{"n": 1}])
    with pytest.raises(json_lines.JsonLinesError, match=rf"^{path}: not JSON: "):
        json_lines.append(path, [{"n": 2}, {"n": float("nan")}])
    with pytest.raises(json_lines.JsonLinesError, match="not JSON"):
        json_lines.append(path, [{"n": object()}])
    assert path.read_text() == '{"n": 1}\n'
