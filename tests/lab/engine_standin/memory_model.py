"""The simulated engine's GPU memory: what a BI-V100 holds at start, and the allocator's
fragmentation under long prompts.

The rules, their constants and why they are what they are: speed_model.py's docstring, which is
the reference of the whole simulated performance ("Memory at start", "Fragmentation").
"""

import math
import re

GIB = 1 << 30
MIB = 1 << 20
# A BI-V100 as ixsmi reports it (32768 MiB).
GPU_MEMORY_BYTES = 32 * GIB
# The CUDA context and the CoreX runtime of each worker: taken before vLLM's first memory
# snapshot, so outside the share gpu_memory_utilization gives the engine.
RUNTIME_RESERVED_BYTES = 1 * GIB
# What the profile run adds outside PyTorch's allocator (NCCL and the runtime's buffers).
NON_TORCH_BYTES = 3 * GIB // 4
# The profile run's activation peak per token of max_num_batched_tokens (eager mode, attention
# without a flash kernel).
ACTIVATION_BYTES_PER_TOKEN = MIB // 2
# Tokens per KV cache block (vLLM's default block_size on CUDA), and the CPU swap space's size
# (--swap-space's default, 4 GiB).
BLOCK_SIZE = 16
SWAP_SPACE_BYTES = 4 * GIB

# The lab's checkpoints have no weight files: every model counts as this much bfloat16.
CHECKPOINT_BYTES = 40 * GIB
CHECKPOINT_DTYPE_BYTES = 2
# The lab's Qwen3.5: every layer full attention. A config.json without num_hidden_layers gets
# all of it.
LAB_QWEN3_5_GEOMETRY = {"num_hidden_layers": 64, "num_attention_heads": 64,
                        "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120}
# The config.json the lab writes for it under /opt/models/qwen3_5 (tests/lab/host_tree.py).
LAB_QWEN3_5_CONFIG = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": dict({"model_type": "qwen3_5_text", "max_position_embeddings": 262144},
                        **LAB_QWEN3_5_GEOMETRY),
    "torch_dtype": "bfloat16",
}
DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}
# An unrecognised --kv-cache-dtype cannot reach here: argparse refuses it.
FP8_PREFIX = "fp8"

# Fragmentation: a long prompt, the block its prefill asks for, and the largest
# max_split_size_mb that keeps such blocks whole.
FRAGMENTATION_PROMPT_TOKENS = 1024
FRAGMENTATION_BLOCK_GIB = 1.95
FRAGMENTATION_MAX_SPLIT_MB = 1024
# The share of the profile run's activation peak that the caching allocator holds besides it,
# reserved and not allocated, at the peak: a quarter with fixed segments that it splits, an eighth
# when max_split_size_mb keeps the large ones whole, none with expandable segments.
START_FRAGMENTATION_SPLIT = 0.25
START_FRAGMENTATION_UNSPLIT = 0.125


class ModelShape:
    """A checkpoint's attention geometry: what its KV cache holds per token."""

    def __init__(self, attention_layers, kv_heads, head_dim):
        self.attention_layers = attention_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim

    @classmethod
    def from_config(cls, model_config):
        """The geometry as vLLM reads it from config.json (the top level, else text_config);
        the lab's Qwen3.5 for a config that does not give num_hidden_layers."""
        text = dict(model_config.get("text_config") or {})
        text.update({key: value for key, value in model_config.items() if key != "text_config"})
        if "num_hidden_layers" not in text:
            text.update(LAB_QWEN3_5_GEOMETRY)
        heads = text.get("num_attention_heads") or LAB_QWEN3_5_GEOMETRY["num_attention_heads"]
        layer_types = text.get("layer_types")
        if layer_types:
            # Linear-attention layers keep a fixed state per sequence, no KV cache.
            attention_layers = sum(1 for kind in layer_types if kind == "full_attention")
        else:
            attention_layers = text["num_hidden_layers"]
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
        return cls(attention_layers, text.get("num_key_value_heads") or heads, head_dim)

    def kv_bytes_per_token(self, kv_dtype_bytes, tensor_parallel_size):
        """Key and value of every attention layer, for one GPU's share of the KV heads
        (ModelConfig.get_num_kv_heads: at least one head per GPU)."""
        heads_per_gpu = max(1, self.kv_heads // tensor_parallel_size)
        return 2 * heads_per_gpu * self.head_dim * kv_dtype_bytes * self.attention_layers


def dtype_bytes(dtype):
    """--dtype: "auto" is the checkpoint's 16 bits (vLLM also casts a float32 checkpoint down)."""
    return DTYPE_BYTES.get(dtype or "auto", CHECKPOINT_DTYPE_BYTES)


def kv_dtype_bytes(kv_cache_dtype, model_dtype_bytes):
    if kv_cache_dtype and kv_cache_dtype.startswith(FP8_PREFIX):
        return 1
    return model_dtype_bytes


class StartFailure(Exception):
    """A start the memory does not allow, with the line the real engine ends on."""


class MemoryPlan:
    """One GPU's memory at start, in bytes, as vLLM 0.10.1.1's V0 worker accounts for it
    (Worker.determine_num_available_blocks, then initialize_cache)."""

    def __init__(self, shape, settings):
        self.settings = settings
        model_bytes = dtype_bytes(settings.dtype)
        self.budget = settings.gpu_memory_utilization * GPU_MEMORY_BYTES
        self.weights = (CHECKPOINT_BYTES * model_bytes // CHECKPOINT_DTYPE_BYTES
                        // settings.tensor_parallel_size)
        self.non_torch = NON_TORCH_BYTES
        # The profile run's peak: the activation, and what the allocator fragments beside it.
        self.activation = int(ACTIVATION_BYTES_PER_TOKEN * settings.max_num_batched_tokens
                              * (1 + start_fragmentation(settings.allocator_conf)))
        self.attention_layers = shape.attention_layers
        self.kv_per_token = shape.kv_bytes_per_token(
            kv_dtype_bytes(settings.kv_cache_dtype, model_bytes), settings.tensor_parallel_size)
        self.kv_cache = self.budget - self.weights - self.non_torch - self.activation
        self.blocks = max(0, int(self.kv_cache // (BLOCK_SIZE * self.kv_per_token)))
        self.kv_tokens = self.blocks * BLOCK_SIZE
        self.cpu_blocks = int(SWAP_SPACE_BYTES // (BLOCK_SIZE * self.kv_per_token))

    @property
    def max_concurrency(self):
        """Sequences of max_model_len the KV cache holds, as vLLM logs it."""
        return self.kv_tokens / self.settings.max_model_len

    def profile_line(self):
        """The V0 worker's log of its memory profile."""
        return ("Memory profiling takes 0.00 seconds (simulated)\n"
                f"the current vLLM instance can use total_gpu_memory "
                f"({GPU_MEMORY_BYTES / GIB:.2f}GiB) x gpu_memory_utilization "
                f"({self.settings.gpu_memory_utilization:.2f}) = {self.budget / GIB:.2f}GiB\n"
                f"model weights take {self.weights / GIB:.2f}GiB; non_torch_memory takes "
                f"{self.non_torch / GIB:.2f}GiB; PyTorch activation peak memory takes "
                f"{self.activation / GIB:.2f}GiB; the rest of the memory reserved for KV Cache "
                f"is {self.kv_cache / GIB:.2f}GiB.")

    def check(self):
        """Raise StartFailure where the real start fails: loading the weights, the profile run,
        too few cache blocks for one sequence of max_model_len, allocating the cache."""
        free = GPU_MEMORY_BYTES - RUNTIME_RESERVED_BYTES
        if self.weights > free:
            raise StartFailure(out_of_memory(self.weights, free, "loading the model weights"))
        free -= self.weights + self.non_torch
        if self.activation > free:
            raise StartFailure(out_of_memory(self.activation, free, "the memory profile run"))
        if self.blocks <= 0:
            # worker.py raise_if_cache_size_invalid; V1's check_enough_kv_cache_memory says
            # the same.
            raise StartFailure("ValueError: No available memory for the cache blocks. Try "
                               "increasing `gpu_memory_utilization` when initializing the "
                               "engine.")
        max_model_len = self.settings.max_model_len
        if max_model_len > self.kv_tokens:
            raise StartFailure(
                f"ValueError: The model's max seq len ({max_model_len}) is larger than the "
                f"maximum number of tokens that can be stored in KV cache ({self.kv_tokens}). "
                "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine.")
        if self.budget + RUNTIME_RESERVED_BYTES > GPU_MEMORY_BYTES:
            # One tensor per layer, beside the activation every forward pass needs again: the
            # last layer's no longer fits.
            layer = self.kv_tokens * self.kv_per_token / self.attention_layers
            left = GPU_MEMORY_BYTES - RUNTIME_RESERVED_BYTES - self.budget + layer
            raise StartFailure(out_of_memory(layer, left, "allocating the KV cache"))


def out_of_memory(requested, free, during):
    """PyTorch's out-of-memory line, shortened, and what the stand-in was simulating."""
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{_gib_text(requested)}. GPU 0 has a total capacity of "
            f"{GPU_MEMORY_BYTES / GIB:.2f} GiB of which {_gib_text(max(free, 0))} is free. "
            f"(simulated: {during})")


def _gib_text(size):
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{math.ceil(size / MIB)} MiB"


# ---- fragmentation ----------------------------------------------------------------------

def _allocator_options(allocator_conf):
    """(expandable segments, large blocks kept whole) of PYTORCH_CUDA_ALLOC_CONF, already
    checked by startup.check_allocator_config."""
    options = dict(re.findall(r"(?:^|,)(expandable_segments|max_split_size_mb):([^,\[\]]+)",
                              (allocator_conf or "").replace(" ", "")))
    split = options.get("max_split_size_mb")
    return (options.get("expandable_segments") == "True",
            split is not None and split.isdigit() and int(split) <= FRAGMENTATION_MAX_SPLIT_MB)


def allocator_fragments(allocator_conf):
    """Whether the caching allocator splits the large blocks a long prefill needs."""
    expandable, whole = _allocator_options(allocator_conf)
    return not (expandable or whole)


def start_fragmentation(allocator_conf):
    """The share of the profile run's activation peak the allocator holds besides it."""
    expandable, whole = _allocator_options(allocator_conf)
    if expandable:
        return 0.0
    return START_FRAGMENTATION_UNSPLIT if whole else START_FRAGMENTATION_SPLIT


def is_long_prompt(prompt_tokens):
    return prompt_tokens > FRAGMENTATION_PROMPT_TOKENS


def fragmentation_message():
    return f"CUDA out of memory. Tried to allocate {FRAGMENTATION_BLOCK_GIB:.2f} GiB"
