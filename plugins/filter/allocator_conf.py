# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""allocator_conf: PYTORCH_CUDA_ALLOC_CONF rendered from a dict of PyTorch's allocator options."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._allocator_conf import allocator_conf


class FilterModule:
    def filters(self):
        return {"allocator_conf": allocator_conf}
