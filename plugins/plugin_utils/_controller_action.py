# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The base of the actions whose work is all on the controller (the canary's judge, the run
record, the report, the submission bundle, the tuning search): no connection is opened and no
file is sent, the arguments are checked against the action's ARGUMENT_SPEC, and act() returns
what the task's result holds."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    TRANSFERS_FILES = False
    # No host is contacted: what the action needs came with the task, or is on the controller.
    _requires_connection = False
    _supports_check_mode = True
    # The action's arguments, as a module's argument_spec.
    ARGUMENT_SPEC: dict = {}

    def run(self, tmp=None, task_vars=None):
        _valid, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        result = super().run(tmp, task_vars)
        result.update(self.act(args, task_vars or {}))
        return result

    def act(self, args: dict, task_vars: dict) -> dict:
        """What the task's result holds besides what ansible-core puts in it."""
        raise NotImplementedError
