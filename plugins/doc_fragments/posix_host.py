# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Where the collection's host modules run: any POSIX host with Python 3.8 or later.

    Listed first in a module's extends_documentation_fragment: of the fragments that set an
    attribute, the first one wins, and ansible.builtin.action_common_attributes says N/A."""

    DOCUMENTATION = r"""
attributes:
  platform:
    support: full
    platforms: posix
"""
