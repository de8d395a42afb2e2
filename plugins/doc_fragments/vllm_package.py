# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The installed vllm package, which the modules that read or write its files work under."""

    DOCUMENTATION = r"""
options:
  package_root:
    description:
      - The installed C(vllm) package directory, as M(biv100.serving.vllm_facts) reports it
        (C(ansible_facts.vllm_facts.package_root)).
      - Every package path the module reads, writes or returns is relative to it, and is reached
        from it one folder at a time without following a link.
    type: path
    required: true
"""
