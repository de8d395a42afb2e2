# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where the serving layer ends inside the vllm package, and so where the model layer begins.

Runs on the host: standard library only, Python 3.8. One definition for both sides of the
collection: the controller refuses a payload entry outside the serving layer
(plugin_utils/_payload.py), and the guard on the host treats everything outside it as the model
layer (modules/model_guard.py). Paths are relative to the package root and use "/".
"""

from __future__ import annotations

# Where serving-layer changes may land: the OpenAI entrypoints (protocol, chat serving, message
# pre-processing, CLI args, API server, tool parsers), the reasoning parsers, and the tool
# parsers' newer home.
SERVING_TREES = ("entrypoints/", "reasoning/", "tool_parsers/")
# The one file outside them: the model registry, and only where the base lacks the model.
REGISTRY = "model_executor/models/registry.py"


def in_serving_trees(path):
    """Whether a package path (a file, or a folder without its trailing "/") is in one of them."""
    return (path + "/").startswith(SERVING_TREES)


def in_serving_layer(path):
    """Whether a package path is one a serving-layer change may write: in the serving trees, or
    the model registry."""
    return in_serving_trees(path) or path == REGISTRY
