# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """What every action that works on the controller alone supports (plugin_utils/_controller_action.py):
    no connection, no async, no become, no delegation, any host. Each module says its check mode
    and diff mode itself.

    Listed first in a module's extends_documentation_fragment: of the fragments that set an
    attribute, the first one wins, and ansible.builtin.action_common_attributes says N/A."""

    DOCUMENTATION = r"""
attributes:
  action:
    support: full
    details: The action of the same name does all the work on the controller.
  async:
    support: none
  become:
    support: none
  bypass_host_loop:
    support: none
  connection:
    support: none
  delegation:
    support: none
  platform:
    support: full
    platforms: all
    details: Runs on the controller whatever the host is.
"""
