# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a playbook run's time goes, task by task: the benchmarks enable it to say which task of
a deploy costs what (stage_vs_naive.py --profile). Not part of the collection."""

from __future__ import annotations

import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_times
type: aggregate
short_description: Seconds from each task's start to the next's, written to a file
description:
  - Appends to the file BIV100_TASK_TIMES names one line per task - seconds, then its name - in
    the order they ran, with the run's total first.
requirements: [enabled by the benchmark]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._began = time.perf_counter()
        self._current = None
        self._rows = []

    def _next(self, name):
        now = time.perf_counter()
        if self._current is not None:
            self._rows.append((now - self._current[1], self._current[0]))
        self._current = (name, now)

    def v2_playbook_on_play_start(self, play):
        self._next(f"PLAY {play.get_name()}")

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._next(task.get_name())

    def v2_playbook_on_handler_task_start(self, task):
        self._next(task.get_name())

    def v2_playbook_on_stats(self, stats):
        self._next(None)
        with open(os.environ["BIV100_TASK_TIMES"], "a", encoding="utf-8") as out:
            out.write(f"total {time.perf_counter() - self._began:.2f}\n")
            out.writelines(f"{seconds:6.2f}  {name}\n" for seconds, name in self._rows)
