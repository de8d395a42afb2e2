# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The engine's env file: NAME=value lines, read as systemd's EnvironmentFile= reads them.

Runs on the host: standard library only, Python 3.8.

Under systemd the engine gets what systemd makes of the file; under supervisord and the
collection's own launcher it gets what this reader makes of it, and engine_process compares
the running engine's environment with it. The two readings must be one, so this is systemd's
grammar (src/basic/env-file.c), character for character:

- Leading whitespace and blank lines are skipped; a line whose first other character is `#`
  or `;` is a comment.
- The name ends at `=`, whitespace around it dropped; whitespace after `=` is skipped.
- Unquoted, a value runs to the end of its line, trailing whitespace dropped; a backslash
  takes the next character as it is (a backslash before a newline joins the next line);
  quotes inside it are plain characters.
- A value may start with quotes: within '...' every character is itself; within "..." a
  backslash before `"`, `\\`, `` ` `` or `$` stands for that character, before a newline it
  joins the lines, before anything else it stays; quoted text may span lines. After the
  closing quote, whitespace is skipped and more quoted or unquoted text is appended.
- A name given twice takes the last value.

Where systemd skips a line with a warning (no `=`, a name that is not a shell variable's),
this reader fails naming the file and the line, never quoting it, since the file holds the
clients' key: the engine must never start with a different environment than the one written.

env_file_value() writes a value back in a form this grammar reads as that very value.
"""

from __future__ import annotations

import re

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

WHITESPACE = " \t\n\r"
NEWLINE = "\n\r"
COMMENTS = "#;"
# What a backslash escapes inside double quotes, as in a POSIX shell.
DOUBLE_QUOTE_ESCAPES = "\"\\`$"

# A value that needs no quoting: it starts with no whitespace, quote or backslash, holds no
# backslash or line break, and does not end in whitespace.
PLAIN_VALUE = re.compile(r"^(?:[^ \t\n\r'\"\\](?:[^\\\n\r]*[^ \t\n\r\\])?)?$")


def read_env_file(path):
    """The variables of the env file at path; ValueError naming a line that is no NAME=value."""
    with open(path, encoding="utf-8") as stream:
        return parse_env_text(stream.read(), path)


def parse_env_text(text, source):
    """The variables of env-file text, in the order first given; `source` names it in errors."""
    parser = _Parser(source)
    for character in text:
        parser.feed(character)
    parser.end()
    return parser.variables


def env_file_value(value):
    """`value` as the right-hand side of NAME=value: as it is when the grammar reads it
    unchanged, else in double quotes with `"` and `\\` escaped. ValueError for a NUL, which
    no environment variable can hold."""
    value = value if isinstance(value, str) else str(value)
    if "\0" in value:
        raise ValueError("an environment variable's value cannot hold a NUL character")
    if PLAIN_VALUE.match(value):
        return value
    return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')


class _Parser(object):
    """systemd's state machine over the text, one character at a time."""

    def __init__(self, source):
        self.source = source
        self.variables = {}
        self.state = self.pre_key
        self.line = 1
        self.key_line = 1
        self.key = []
        self.key_trim = None
        self.value = []
        self.value_trim = None

    def feed(self, character):
        self.state(character)
        if character == "\n":
            self.line += 1

    def end(self):
        if self.state == self.key_state:
            self.refuse()
        if self.state not in (self.pre_key, self.comment):
            self.push()

    # --- the states -----------------------------------------------------------------------

    def pre_key(self, character):
        if character in COMMENTS:
            self.state = self.comment
        elif character not in WHITESPACE:
            self.key, self.key_trim, self.key_line = [character], None, self.line
            self.state = self.key_state

    def key_state(self, character):
        if character in NEWLINE:
            self.refuse()
        elif character == "=":
            self.value, self.value_trim = [], None
            self.state = self.pre_value
        else:
            if character not in WHITESPACE:
                self.key_trim = None
            elif self.key_trim is None:
                self.key_trim = len(self.key)
            self.key.append(character)

    def pre_value(self, character):
        if character in NEWLINE:
            self.push()
        elif character == "'":
            self.state = self.single_quoted
        elif character == '"':
            self.state = self.double_quoted
        elif character == "\\":
            self.state = self.escaped
        elif character not in WHITESPACE:
            self.value.append(character)
            self.state = self.unquoted

    def unquoted(self, character):
        if character in NEWLINE:
            self.push()
        elif character == "\\":
            self.value_trim = None
            self.state = self.escaped
        else:
            if character not in WHITESPACE:
                self.value_trim = None
            elif self.value_trim is None:
                self.value_trim = len(self.value)
            self.value.append(character)

    def escaped(self, character):
        if character not in NEWLINE:
            self.value.append(character)
        self.state = self.unquoted

    def single_quoted(self, character):
        if character == "'":
            self.state = self.pre_value
        else:
            self.value.append(character)

    def double_quoted(self, character):
        if character == '"':
            self.state = self.pre_value
        elif character == "\\":
            self.state = self.double_quoted_escaped
        else:
            self.value.append(character)

    def double_quoted_escaped(self, character):
        if character in DOUBLE_QUOTE_ESCAPES:
            self.value.append(character)
        elif character != "\n":
            self.value.extend(("\\", character))
        self.state = self.double_quoted

    def comment(self, character):
        if character in NEWLINE:
            self.state = self.pre_key

    # --- the results ----------------------------------------------------------------------

    def push(self):
        """One assignment read: its name checked, its value's trailing whitespace dropped
        when it ended unquoted."""
        key = self.key[:self.key_trim] if self.key_trim is not None else self.key
        name = "".join(key)
        if not ENV_NAME.match(name):
            raise ValueError("%s line %d does not start with a variable name (letters, digits "
                             "and _, not starting with a digit) and =" % (self.source, self.key_line))
        value = self.value
        if self.state == self.unquoted and self.value_trim is not None:
            value = value[:self.value_trim]
        self.variables[name] = "".join(value)
        self.state = self.pre_key

    def refuse(self):
        """A line without =. Its text is not quoted: the file holds the clients' key."""
        raise ValueError("%s line %d is not KEY=VALUE: it has no =" % (self.source, self.key_line))
