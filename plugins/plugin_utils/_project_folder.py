# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The project folder and the fleet of a run: where the controller's own files go.

The project folder is the folder of the ansible.cfg in use (the playbook project's root, as
kubespray's is), so that the ledger, the report and the submission bundles land beside the
inventory they are about, and never inside the collection, which may be installed read-only
from Galaxy or an execution environment. The fleet is named after the run's inventory folder
(`biv100` for `-i inventory/biv100`), so that each fleet keeps files of its own.

Controller side only: standard library.
"""

from __future__ import annotations

from pathlib import Path

# The fleet of a run whose inventory is only a host list (-i 'h1,h2,').
HOST_LIST_FLEET = "default"
# Configuration files that belong to no project: with one of them (or none) in use, the
# current folder is the project root.
SHARED_CONFIGS = ("/etc/ansible/ansible.cfg", "~/.ansible.cfg")


def project_root(config_file: str | None) -> Path:
    """The folder of the project's ansible.cfg; the current folder without one."""
    if config_file:
        config = Path(config_file).expanduser().absolute()
        if config not in {Path(shared).expanduser() for shared in SHARED_CONFIGS}:
            return config.parent
    return Path.cwd()


def inventory_folders(sources) -> list[Path]:
    """The folder of each inventory source that is a path (itself, or the one holding the file),
    in order and once each; a host list (`-i h1,h2,`) has none."""
    folders: list[Path] = []
    for source in sources or ():
        if "," in source:
            continue
        path = Path(source).expanduser().absolute()
        folder = path if path.is_dir() else path.parent
        if folder not in folders:
            folders.append(folder)
    return folders


def fleet(sources) -> str:
    """The fleet a run's inventory names: its first inventory folder's name."""
    folders = inventory_folders(sources)
    return folders[0].name if folders else HOST_LIST_FLEET


def inventory_argument(sources, config_file: str | None = None) -> str:
    """What a command for this run's inventory passes as -i: each source, relative to the
    project folder when it lies inside it (as the team types it); "<inventory>" when a source
    is a host list (-i 'h1,h2,') or there is none."""
    root = project_root(config_file)
    shown = []
    for source in sources or ():
        if "," in source:
            return "<inventory>"
        path = Path(source).expanduser().absolute()
        shown.append(str(path.relative_to(root)) if path.is_relative_to(root) else str(path))
    return " -i ".join(shown) or "<inventory>"
