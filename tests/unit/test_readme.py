"""README.md stays a page a new user reads, and every command it shows works.

Each `make` command names a target of the Makefile; each playbook command passes
`ansible-playbook --syntax-check` with the same arguments, and its extra variables reach
Ansible whole (its key=value parsing keeps every word, as it did not for an unquoted reason);
every page of the manual is linked from it and every link in the manual leads somewhere.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.parsing.splitter import parse_kv

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_LINES = 250
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# ansible-playbook from the Python running the tests: .venv's, or .venv-2.21's on that line.
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def readme_commands() -> list[str]:
    """Every command of the README's shell blocks, continuation lines joined, comments cut."""
    commands = []
    for block in SHELL_BLOCK.findall(README.read_text()):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*?)(?<!\\)$", makefile, re.MULTILINE | re.DOTALL)
                .group(1).replace("\\\n", " ").split())
    defined = set(re.findall(r"^([\w.-]+):", makefile, re.MULTILINE))
    return phony & defined


COMMANDS = readme_commands()


def test_the_readme_is_a_first_page_not_the_manual():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md is {len(lines)} lines; the manual belongs in docs/"
    first_block = SHELL_BLOCK.search(README.read_text())
    assert first_block.start() < len("\n".join(lines[:12])), "the first screen's two commands moved"
    assert [shlex.split(c)[:2] for c in COMMANDS[:2]] == [["make", "deploy"], ["make", "test"]]


def test_the_readme_shows_the_everyday_commands():
    shown = {Path(shlex.split(c)[1]).stem for c in COMMANDS if c.startswith(".venv/bin/ansible-playbook")}
    assert {"deploy", "verify", "rollback", "tune", "report"} <= shown


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("make ")])
def test_each_make_command_names_a_target(command):
    targets = shlex.split(command)[1:]
    assert targets and set(targets) <= make_targets(), f"{command}: not a target of the Makefile"


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.startswith("make ")])
def test_each_playbook_command_passes_a_syntax_check(command):
    words = shlex.split(command)
    assert words[0] == ".venv/bin/ansible-playbook", f"{command}: no check knows this command"
    for flag, value in zip(words, words[1:]):
        if flag == "-e" and not value.startswith(("@", "{")):
            assert "_raw_params" not in parse_kv(value), f"{command}: Ansible cuts {value!r} short"
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), "--syntax-check", *words[1:]], cwd=REPO,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{command}:\n{result.stdout}{result.stderr}"


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


def test_every_page_of_the_manual_is_linked_from_the_readme():
    linked = {(REPO / target.split("#")[0]).resolve() for target in LINK.findall(README.read_text())}
    assert sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked) == []


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, anchor = (target.split("#", 1) + [""])[:2]
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in heading_anchors(linked)):
            broken.append(target)
    assert broken == []
