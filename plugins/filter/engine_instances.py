# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""engine_instances: the host's engine instances, each one complete value (plugin_utils/_engine_instances.py)."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._engine_instances import (
    engine_instance_problems,
    engine_instances,
    engine_start_order,
    instance_record,
    instance_with,
    recorded_instance,
    restored_instances,
)


class FilterModule:
    def filters(self):
        return {"engine_instances": engine_instances, "engine_instance_problems": engine_instance_problems,
                "engine_start_order": engine_start_order,
                "instance_record": instance_record, "recorded_instance": recorded_instance,
                "instance_with": instance_with, "restored_instances": restored_instances}
