# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The state store of a module whose writes the host's run lock fences (module_utils/_run_lock.py)."""

    DOCUMENTATION = r"""
options:
  state_dir:
    description:
      - Where the collection keeps its state on the host (C(lock), C(baseline/), C(base/),
        C(releases/), C(current)); the run lock there fences what this module writes (see the
        notes). The same for every module of a deployment; the roles pass C(serving_state_dir).
    type: path
    default: /var/lib/biv100-serving
notes:
  - Fenced by the host's run lock. When its environment names a run in C(BIV100_SERVING_RUN), as
    every lock-taking play of the collection's playbooks sets it, the module changes the host only
    while C(<state_dir>/lock) names that run, checked under the same C(flock) of O(state_dir) that
    M(biv100.serving.serving_lock) takes to change the lock. A run whose lock was taken over or
    broken since it took it is refused, naming the lock's holder, and nothing changes on the host.
    Outside such a play (no C(BIV100_SERVING_RUN)) nothing is fenced.
"""
