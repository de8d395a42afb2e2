"""docs/reliability.md names real tests: a renamed or removed test fails here, not silently."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def fault_rows() -> list[list[str]]:
    rows = [line.strip().strip("|").split(" | ") for line in DOC.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| fault |")]
    return [row for row in rows if not set(row[0]) <= set("- ")]


def test_every_fault_names_what_the_user_sees_what_is_guaranteed_and_a_test():
    rows = fault_rows()
    assert len(rows) >= 10
    for fault, sees, guaranteed, proof in rows:
        assert sees and guaranteed, fault
        assert TEST_REFERENCE.search(proof), f"{fault}: no test named"


def test_every_test_the_table_names_exists():
    named = [match.groups() for row in fault_rows() for match in TEST_REFERENCE.finditer(row[3])]
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\(", (REPO / path).read_text(), re.MULTILINE)]
    assert missing == []
