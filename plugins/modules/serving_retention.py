#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_retention
short_description: Remove old releases from a host's store, keeping what rollback and post-mortems need
version_added: 0.1.0
description:
  - Keeps the O(keep_good) newest releases that were proven good (C(good), or C(rolled_back)
    since a named rollback may still want one), every C(failed) release younger than
    O(keep_failed_days) for its post-mortem, and always the current release and the last good
    one; removes the other releases. Age and order come from the release records, never from
    file times.
  - A release is removed by renaming its folder out of C(releases/) first, so an interrupted run
    leaves it whole or gone; leftovers of such a rename are removed by the next run.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  keep_good:
    description: How many releases proven good are kept (at least 1).
    type: int
    default: 5
  keep_failed_days:
    description: Failed releases younger than this many days are kept.
    type: int
    default: 14
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - biv100.serving.state_store
attributes:
  check_mode:
    support: full
    details:
      - Reports what it would remove.
  diff_mode:
    support: none
seealso:
  - module: biv100.serving.serving_rollback
"""

EXAMPLES = r"""
- name: Keep the three newest good releases and a week of failed ones
  biv100.serving.serving_retention:
    keep_good: 3
    keep_failed_days: 7
"""

RETURN = r"""
removed:
  description: The releases removed (or that would be).
  returned: always
  type: list
  elements: str
  sample: [sub101, sub102]
kept:
  description: The releases kept, newest first.
  returned: always
  type: list
  elements: str
  sample: [sub510, sub509]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._release_retention import prune
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR, StateDir


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            keep_good=dict(type="int", default=5),
            keep_failed_days=dict(type="int", default=14),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["keep_good"] < 1:
        module.fail_json(msg="keep_good must be at least 1, got %d" % params["keep_good"])
    store = StateDir(params["state_dir"])
    kept, removed, changed = prune(store, params["keep_good"], params["keep_failed_days"], module.check_mode)
    module.exit_json(
        changed=changed,
        removed=removed,
        kept=kept,
        msg="kept %d release(s), removed %d" % (len(kept), len(removed)),
    )


if __name__ == "__main__":
    main()
