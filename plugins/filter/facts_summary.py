# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""facts_summary: the few lines a person reads to know what a host has."""

from __future__ import annotations

from collections import Counter


def facts_summary(vllm: dict, gpus: dict | None) -> list[str]:
    """Summarise the facts of vllm_facts and gpu_facts as readable lines."""
    return [
        f"vLLM {vllm['version']} (layout {vllm['layout']}) for Python {vllm['python_version']}"
        f" at {vllm['package_root']}",
        _registry_line(vllm["registry"]),
        _model_line(vllm.get("model")),
        _files_line("serving", vllm["files"]["serving"]) + "; "
        + _files_line("protected", vllm["files"]["protected"]),
        _gpus_line(gpus),
    ] + _cli_lines(vllm.get("cli"))


def _cli_lines(cli: dict | None) -> list[str]:
    if not cli:
        return []
    if cli["arguments"] is None:
        return [f"OpenAI-server CLI: unread ({cli['error']}); engine_args are checked against "
                "vLLM 0.10.1.1's"]
    return [f"OpenAI-server CLI: {len(cli['arguments'])} arguments in its source, which "
            "engine_args are checked against"]


def _registry_line(registry: dict) -> str:
    if registry.get("error"):
        return f"registry: unusable ({registry['error']})"
    qwen3_5 = "yes" if registry["has_qwen3_5"] else "no"
    return f"registry: {len(registry['architectures'])} architectures, Qwen3_5 registered: {qwen3_5}"


def _model_line(model: dict | None) -> str:
    if not model:
        return "model: none given"
    if model.get("error"):
        return f"model {model['path']}: unusable ({model['error']})"
    architectures = ", ".join(model["architectures"]) or "no architectures declared"
    if model["served"]:
        return f"model {model['path']}: {architectures}, served: yes"
    if all(model["registrable"].get(arch) for arch in model["missing"]):
        verdict = "registrable (the base has its model file)"
    else:
        verdict = "not registrable (no model file in the base)"
    return f"model {model['path']}: {architectures}, served: no, {verdict}"


def _files_line(kind: str, files: dict) -> str:
    absent = sorted(name for name, entry in files.items() if not entry["exists"])
    line = f"{kind} files: {len(files) - len(absent)}/{len(files)} present"
    return line + (f" (absent: {', '.join(absent)})" if absent else "")


def _gpus_line(gpus: dict | None) -> str:
    if gpus is None:
        return "GPUs: not read (the engine phase is skipped)"
    if not gpus["count"]:
        return "GPUs: none"
    kinds = Counter((gpu["name"], gpu["memory_total_mib"]) for gpu in gpus["gpus"])
    described = ", ".join(f"{n} x {name} {mib} MiB" for (name, mib), n in kinds.items())
    return f"GPUs: {described}; free: {len(gpus['free'])}"


class FilterModule:
    def filters(self):
        return {"facts_summary": facts_summary}
