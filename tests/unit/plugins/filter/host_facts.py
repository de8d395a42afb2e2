"""Facts shaped as vllm_facts and gpu_facts return them, for the filters' tests."""

from __future__ import annotations

import copy

VLLM = {
    "version": "0.10.1.1+corex.4.3.0",
    "layout": "v0",
    "python_version": "3.11.2",
    "interpreter": "/usr/local/corex/python3/bin/python3",
    "package_root": "/usr/local/corex/python3/lib/python3.11/site-packages/vllm",
    "registry": {
        "path": "model_executor/models/registry.py",
        "architectures": {
            "Qwen3ForCausalLM": ["qwen3", "Qwen3ForCausalLM"],
            "Qwen3_5ForConditionalGeneration": ["qwen3_5", "Qwen3_5ForConditionalGeneration"],
        },
        "has_qwen3_5": True,
        "error": None,
    },
    "files": {
        "serving": {"api_server.py": {"path": "entrypoints/openai/api_server.py", "exists": True}},
        "protected": {
            "sampler.py": {"path": "model_executor/layers/sampler.py", "exists": True},
            "mamba_cache.py": {"path": None, "exists": False},
        },
    },
    "model": {
        "path": "/opt/models/qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "served": True,
        "missing": [],
        "registrable": {},
        "error": None,
    },
}

GPUS = {
    "ixsmi": "/usr/local/corex/bin/ixsmi",
    "count": 4,
    "gpus": [
        {"index": i, "name": "Iluvatar BI-V100", "memory_total_mib": 32768, "processes": []}
        for i in range(4)
    ],
    "free": [0, 1, 2, 3],
}


def vllm(**model_changes) -> dict:
    facts = copy.deepcopy(VLLM)
    facts["model"].update(model_changes)
    return facts


def unregistered(registrable: bool) -> dict:
    """A base whose registry lacks the model's architecture, with or without its model file."""
    arch = "Qwen3_5ForConditionalGeneration"
    return vllm(served=False, missing=[arch], registrable={arch: registrable})


def gpus(count: int) -> dict:
    facts = copy.deepcopy(GPUS)
    facts["gpus"] = facts["gpus"][:count]
    facts["count"] = count
    facts["free"] = list(range(count))
    return facts
