"""The engine's env file is read as systemd's EnvironmentFile= reads it, and every value the
role writes into it is read back as it was."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._env_file import (
    env_file_value,
    parse_env_text,
    read_env_file,
)

# What systemd's EnvironmentFile= makes of each text (its env-file grammar, src/basic/env-file.c).
SYSTEMD_READINGS = [
    ("the role's lines", "# Written by biv100.serving\nCUDA_VISIBLE_DEVICES=0,1,2,3\n"
     "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8,max_split_size_mb:512\n",
     {"CUDA_VISIBLE_DEVICES": "0,1,2,3",
      "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8,max_split_size_mb:512"}),
    ("comments with # and ;, blank lines, indentation", "\n  # one\n; two\n\t A=1\n\n", {"A": "1"}),
    ("whitespace around = and after the value", "A = 1 \t\nB=  x y  \n", {"A": "1", "B": "x y"}),
    ("an empty value", "A=\nB=''\n", {"A": "", "B": ""}),
    ("single quotes keep everything", "A='x \\\" $y #z'\n", {"A": 'x \\" $y #z'}),
    ("double quotes unescape \" \\ ` $ only", 'A="q\\"b\\\\t\\`d\\$e\\nf"\n', {"A": 'q"b\\t`d$e\\nf'}),
    ("quoted text is joined with what follows", "A=\"x\" 'y' z\n", {"A": "xyz"}),
    ("quotes inside an unquoted value are characters", "A=a'b'\"c\"\n", {"A": "a'b'\"c\""}),
    ("a backslash takes the next character", "A=a\\ \\\\b\\#\n", {"A": "a \\b#"}),
    ("a backslash before a line break joins the lines", "A=one\\\ntwo\nB=\"x\\\ny\"\n",
     {"A": "onetwo", "B": "xy"}),
    ("a quoted value may span lines", "A='first\nsecond'\nB=2\n", {"A": "first\nsecond", "B": "2"}),
    ("# and ; inside a value are characters", "A=x #y;z\n", {"A": "x #y;z"}),
    ("CRLF line ends", "A=1\r\nB=2\r\n", {"A": "1", "B": "2"}),
    ("the last line needs no line break", "A=1\nB=2", {"A": "1", "B": "2"}),
    ("the last value given wins", "A=1\nA=2\n", {"A": "2"}),
    ("an unterminated quote runs to the end", "A=\"open\n", {"A": "open\n"}),
]


@pytest.mark.parametrize("text, variables", [case[1:] for case in SYSTEMD_READINGS],
                         ids=[case[0] for case in SYSTEMD_READINGS])
def test_the_file_is_read_as_systemd_reads_it(text, variables):
    assert parse_env_text(text, "engine.env") == variables


NOT_A_NAME = " does not start with a variable name (letters, digits and _, not starting with a digit) and ="


@pytest.mark.parametrize("text, message", [
    ("A=1\nexpandable_segments:True\n", "engine.env line 2 is not KEY=VALUE: it has no ="),
    ("A=1\n\nB", "engine.env line 3 is not KEY=VALUE: it has no ="),
    ("export A=1\n", "engine.env line 1" + NOT_A_NAME),
    ("A=1\n2B=x\n", "engine.env line 2" + NOT_A_NAME),
    ("A-B=x\n", "engine.env line 1" + NOT_A_NAME),
])
def test_a_line_systemd_would_skip_fails_naming_the_file_and_the_line(text, message):
    with pytest.raises(ValueError) as refused:
        parse_env_text(text, "engine.env")
    assert str(refused.value) == message


def test_a_refused_line_is_not_quoted_since_it_may_hold_the_key():
    for text in ("VLLM_API_KEY sk-biv100-0a1b\n", "VLLM_API_KEY sk-biv100-0a1b=c\n"):
        with pytest.raises(ValueError) as refused:
            parse_env_text(text, "engine.env")
        assert "sk-biv100" not in str(refused.value)


def test_a_file_is_read_as_utf_8(tmp_path):
    path = tmp_path / "engine.env"
    path.write_bytes("GREETING='grüß dich'\n".encode("utf-8"))
    assert read_env_file(str(path)) == {"GREETING": "grüß dich"}
    path.write_bytes(b"A=\xff\n")
    with pytest.raises(UnicodeDecodeError):
        read_env_file(str(path))


ROUND_TRIPS = [
    "", "0,1,2,3", "expandable_segments:True,max_split_size_mb:512", "sk-biv100-0a1b",
    " leading", "trailing ", "\ttab", "'single'", '"double"', 'in "the" middle', "it's",
    "back\\slash", "\\", "ends with \\", "line\nbreak", "carriage\rreturn", "$HOME and `cmd`",
    "#not a comment", ";nor this", "=", "a=b", "ünïcödé", "'", '"', " ",
]


@pytest.mark.parametrize("value", ROUND_TRIPS)
def test_every_value_written_is_read_back_as_it_was(value):
    written = "A=%s\nB=next\n" % env_file_value(value)
    assert parse_env_text(written, "engine.env") == {"A": value, "B": "next"}


def test_a_value_the_grammar_reads_unchanged_is_written_as_it_is():
    assert env_file_value("expandable_segments:True") == "expandable_segments:True"
    assert env_file_value('in "the" middle') == 'in "the" middle'
    assert env_file_value(512) == "512" and env_file_value(True) == "True"
    assert env_file_value(" x") == '" x"' and env_file_value('a\\"b') == '"a\\\\\\"b"'


def test_a_nul_cannot_be_written():
    with pytest.raises(ValueError, match="cannot hold a NUL character"):
        env_file_value("a\0b")
