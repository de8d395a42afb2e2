# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""preflight_problems: every reason a host cannot take the deployment, one sentence each."""

from __future__ import annotations


def preflight_problems(vllm: dict, gpus: dict | None, tensor_parallel_size: int) -> list[str]:
    """Return the problems found in the facts of vllm_facts and gpu_facts (empty = fit). No GPU
    facts (a run that skips the engine phase does not read them) means no GPU problems."""
    return [
        *_registry_problems(vllm),
        *_gpu_problems(gpus, tensor_parallel_size),
        *_model_problems(vllm),
    ]


def _registry_problems(vllm: dict) -> list[str]:
    registry = vllm["registry"]
    if registry.get("error"):
        # The error names the file relative to the package root (even when it is missing).
        return [f"the model registry of {vllm['package_root']} is unusable: {registry['error']}"]
    return []


def _gpu_problems(gpus: dict | None, tensor_parallel_size: int) -> list[str]:
    if gpus is None:
        return []
    if gpus["count"] < tensor_parallel_size:
        return [
            f"tensor_parallel_size is {tensor_parallel_size} but {gpus['ixsmi']} reports "
            f"{gpus['count']} GPU{'s' if gpus['count'] != 1 else ''}"
        ]
    if len(gpus["free"]) < tensor_parallel_size:
        # The collection's own engine is not in the way (it is restarted in place); anything
        # else holding a GPU is someone else's work, which a deploy must not kill.
        holders = [
            f"GPU {process['gpu_index']} by pid {process['pid']} ({process['name']})"
            for process in gpus["processes"]
            if not process.get("own")
        ]
        return [
            f"tensor_parallel_size is {tensor_parallel_size} but only {len(gpus['free'])} of "
            f"{gpus['count']} GPUs are free; held: {', '.join(holders)}"
        ]
    return []


def _model_problems(vllm: dict) -> list[str]:
    model = vllm.get("model")
    if not model:
        return []
    if model.get("error"):
        return [f"model {model['path']} is unusable: {model['error']}"]
    if vllm["registry"].get("error"):
        return []  # already reported; whether the model is served cannot be known
    stranded = [arch for arch in model["missing"] if not model["registrable"].get(arch)]
    return [
        f"model {model['path']} declares {arch}, which {vllm['registry']['path']} does not register "
        f"and no file under model_executor/models defines, so it cannot be registered either"
        for arch in stranded
    ]


class FilterModule:
    def filters(self):
        return {"preflight_problems": preflight_problems}
