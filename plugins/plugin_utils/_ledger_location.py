# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a fleet's deployment ledger is: the ledger callback writes it there and the
serving_report action reads it from there.

By default ledger/<fleet> at the project root (ledger/biv100 for -i inventory/biv100), outside
the inventory folder: Ansible reads every file of an inventory folder as an inventory source.
The variable serving_ledger_dir, BIV100_LEDGER_DIR or ansible.cfg's [biv100_ledger] dir name
another folder (the callback's ledger_dir option).

Controller side only: standard library.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import fleet

LEDGER_CALLBACK = "biv100.serving.ledger"
LEDGER_FILE = "ledger.jsonl"
TABLE_FILE = "LEDGER.md"
# The variable that names the ledger folder (the callback option's `vars` entry).
LEDGER_VARIABLE = "serving_ledger_dir"
# The folder, at the project root, that holds each fleet's ledger.
LEDGER_FOLDER = "ledger"


def ledger_home(root: Path, sources) -> Path:
    """ledger/<fleet> at the project root, the fleet named after the first inventory folder."""
    return root / LEDGER_FOLDER / fleet(sources)
