#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# Apache License 2.0 (see LICENSE)

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
  state_dir:
    description: The collection's state store.
    type: path
    default: /var/lib/biv100-serving
  keep_good:
    description: How many releases proven good are kept (at least 1).
    type: int
    default: 5
  keep_failed_days:
    description: Failed releases younger than this many days are kept.
    type: int
    default: 14
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what it would remove.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
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

import calendar
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    StateDir,
    fsync_dir,
    read_json,
)

DAY_SECONDS = 86400
TRASH_PREFIX = ".removing-"
PROVEN = ("good", "rolled_back")


def created(record):
    """Seconds since the epoch of the record's created_at; 0 when it has none."""
    try:
        return calendar.timegm(time.strptime(record.get("created_at", ""), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0


def last_good(store, records, current):
    release = current
    seen = set()
    while release and release in records and release not in seen:
        seen.add(release)
        if records[release].get("status") == "good":
            return release
        release = records[release].get("previous")
    return None


def plan(store, keep_good, keep_failed_days, now):
    """(kept, removed): release ids, newest first."""
    folder = os.path.join(store.root, "releases")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    records = {}
    for name in names:
        if name.startswith("."):
            continue
        record = read_json(store.release_record(name))
        # A release without its record is an interrupted staging: nothing can roll back to it.
        records[name] = record if record is not None else {"status": "incomplete"}
    current = store.current_release()
    always = {current, last_good(store, records, current)}
    newest_first = sorted(records, key=lambda name: (created(records[name]), name), reverse=True)
    proven = [name for name in newest_first if records[name].get("status") in PROVEN]
    kept = []
    for name in newest_first:
        status = records[name].get("status")
        young = now - created(records[name]) < keep_failed_days * DAY_SECONDS
        if (name in always or (status in PROVEN and proven.index(name) < keep_good)
                or (status in ("failed", "pending", "incomplete") and young)):
            kept.append(name)
    return kept, [name for name in newest_first if name not in kept]


def remove(store, name):
    folder = os.path.join(store.root, "releases")
    trash = os.path.join(folder, TRASH_PREFIX + name)
    os.rename(os.path.join(folder, name), trash)
    fsync_dir(folder)
    shutil.rmtree(trash)


def leftovers(store):
    folder = os.path.join(store.root, "releases")
    if not os.path.isdir(folder):
        return []
    return [name for name in os.listdir(folder) if name.startswith(TRASH_PREFIX)]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default="/var/lib/biv100-serving"),
            keep_good=dict(type="int", default=5),
            keep_failed_days=dict(type="int", default=14),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["keep_good"] < 1:
        module.fail_json(msg="keep_good must be at least 1, got %d" % params["keep_good"])
    store = StateDir(params["state_dir"])
    kept, removed = plan(store, params["keep_good"], params["keep_failed_days"], time.time())
    trash = leftovers(store)
    if not module.check_mode:
        for name in trash:
            shutil.rmtree(os.path.join(store.root, "releases", name))
        for name in removed:
            remove(store, name)
    module.exit_json(
        changed=bool(removed or trash),
        removed=removed,
        kept=kept,
        msg="kept %d release(s), removed %d" % (len(kept), len(removed)),
    )


if __name__ == "__main__":
    main()
