# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""patch_ops.sh, the platform's installer of a submission bundle, rendered from its template.

Controller side (Python 3.11, standard library only). The script carries the collection's own
definitions of where the serving layer ends and where the brief's protected files live (the
module_utils the hosts run), so the platform refuses exactly what the fleet's deploy refuses.
"""

from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import REGISTRY, SERVING_TREES
from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import PROTECTED_LOCATIONS

TEMPLATE = Path(__file__).resolve().parents[2] / "files" / "submission" / "patch_ops.sh.in"
# What a release id and an interpreter path may hold to be written into the script unquoted.
_RELEASE = re.compile(r"[A-Za-z0-9._-]+")
_INTERPRETER = re.compile(r"/[A-Za-z0-9._+/-]*")


def serving_patterns() -> str:
    """The serving layer as `case` patterns joined by "|"."""
    return "|".join([tree + "*" for tree in SERVING_TREES] + [REGISTRY])


def protected_patterns() -> str:
    """Every location of the brief's protected files, joined by "|"."""
    return "|".join(sorted(PROTECTED_LOCATIONS))


def render(release: str, interpreters: list[str] | tuple[str, ...] = ()) -> str:
    """The script for one bundle. Refuses values that would need quoting: a release id or an
    interpreter path that is not a plain name could change what the script runs."""
    if not _RELEASE.fullmatch(release or ""):
        raise ValueError(f"release {release!r}: a bundle's release id is letters, digits, '.', '_' and '-'")
    for interpreter in interpreters:
        if not _INTERPRETER.fullmatch(interpreter):
            raise ValueError(f"interpreter {interpreter!r}: an absolute path of letters, digits and ._+-/ only")
    values = {
        "@RELEASE@": release,
        "@INTERPRETERS@": " ".join(dict.fromkeys(interpreters)),
        "@SERVING_PATTERNS@": serving_patterns(),
        "@PROTECTED_PATTERNS@": protected_patterns(),
    }
    text = TEMPLATE.read_text(encoding="utf-8")
    for placeholder, value in values.items():
        if placeholder not in text:
            raise ValueError(f"{TEMPLATE}: placeholder {placeholder} is missing")
        text = text.replace(placeholder, value)
    return text
