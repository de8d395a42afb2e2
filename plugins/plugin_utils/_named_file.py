# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A data file given by the name of one the collection ships (files/<kind>/<name>.yml) or by a
path: the one lookup of the bench workloads and the tuning spaces. Controller side only."""

from __future__ import annotations

from pathlib import Path


def named_file(value: str, folder: Path, what: str, error: type[Exception], find=None) -> Path:
    """files/<kind>/<value>.yml when value is a plain name (no slash, no .yml), else the path;
    `find` resolves a relative path (an action finds it beside the playbook). A name not shipped
    or a file that is not there raises `error`, naming `what` it was meant to be."""
    if "/" not in value and not value.endswith((".yml", ".yaml")):
        path = folder / f"{value}.yml"
        if not path.is_file():
            known = ", ".join(sorted(item.stem for item in folder.glob("*.yml")))
            raise error(f"{what} {value!r} is not one of files/{folder.name} ({known}) nor a path")
        return path
    path = Path(find(value) if find else value)
    if not path.is_file():
        raise error(f"{what} file {path} does not exist")
    return path
