# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The collection's on-host state store, which the modules that remember anything share."""

    DOCUMENTATION = r"""
options:
  state_dir:
    description:
      - The collection's state store on the host - the run lock, the model layer's first-contact
        digests (C(baseline/)), the vendor's copies of overlaid files (C(base/)), the releases
        (C(releases/)) and C(current).
      - Every module of a deployment must be given the same one; the roles pass
        C(serving_state_dir).
    type: path
    default: /var/lib/biv100-serving
"""
