# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""setting_mappings and mapping_problems: the engine settings' mappings a deploy records
(plugins/plugin_utils/_mapping.py checks them)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.biv100.serving.plugins.plugin_utils._mapping import MappingError, declared_settings, mapping_problems


def setting_mappings(inventory, proposal=None) -> list[dict]:
    try:
        return declared_settings(inventory, proposal)
    except MappingError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self):
        return {"setting_mappings": setting_mappings, "mapping_problems": mapping_problems}
