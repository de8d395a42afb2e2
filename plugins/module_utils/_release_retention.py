# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which releases a host's store keeps, and removing the others whole.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

import calendar
import os
import shutil
import time

from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    TIMESTAMP_FORMAT,
    first_good,
    fsync_dir,
    read_json,
)

DAY_SECONDS = 86400
TRASH_PREFIX = ".removing-"
PROVEN = ("good", "rolled_back")


def created(record):
    """Seconds since the epoch of the record's created_at; 0 when it has none."""
    try:
        return calendar.timegm(time.strptime(record.get("created_at", ""), TIMESTAMP_FORMAT))
    except ValueError:
        return 0


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
    always = {current, first_good(current, records.get)}
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


def prune(store, keep_good, keep_failed_days, check_mode):
    """(kept, removed, changed): what the store keeps and removes (or would, in check mode)."""
    kept, removed = plan(store, keep_good, keep_failed_days, time.time())
    trash = leftovers(store)
    if not check_mode:
        for name in trash:
            shutil.rmtree(os.path.join(store.root, "releases", name))
        for name in removed:
            remove(store, name)
    return kept, removed, bool(removed or trash)
