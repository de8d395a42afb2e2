# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""engine_cli_args: one dict of engine arguments, rendered as vLLM's OpenAI-server command line."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import engine_cli_args


class FilterModule:
    def filters(self):
        return {"engine_cli_args": engine_cli_args}
