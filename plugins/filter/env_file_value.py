# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""env_file_value: a value written into the engine's env file so that it is read back as it is."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.biv100.serving.plugins.module_utils import _env_file


def env_file_value(value) -> str:
    """The right-hand side of NAME=value that the env file's reader (systemd's grammar) reads
    as `value`; the grammar and its reader are _env_file's."""
    try:
        return _env_file.env_file_value(value)
    except ValueError as error:
        raise AnsibleFilterError(f"env_file_value: {error}") from None


class FilterModule:
    def filters(self):
        return {"env_file_value": env_file_value}
