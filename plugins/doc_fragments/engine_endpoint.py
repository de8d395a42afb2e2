# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The running engine's OpenAI-compatible HTTP API, which the modules that ask it share."""

    DOCUMENTATION = r"""
options:
  url:
    description:
      - The engine's base URL as the host reaches it - normally its own loopback address, so
        the engine's port need not be reachable from the controller.
      - The roles make it from C(engine_port).
      - It is contacted directly; C(http_proxy), C(https_proxy) and the other proxy variables
        of the environment are ignored.
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description:
      - The clients' key the engine was started with (its C(VLLM_API_KEY), the roles'
        C(engine_api_key)), sent as the bearer token of the C(Authorization) header.
      - Leave it out when the engine has no key. It is never returned or logged.
    type: str
"""
