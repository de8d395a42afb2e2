"""The checks vLLM and PyTorch make before the engine serves, on the host as it is.

Each failure raises StartupError with the message the real stack prints; the engine then exits
with status 1, as an uncaught exception in vLLM does.
"""

import ast
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

DEFAULT_IXSMI = "/usr/local/corex/bin/ixsmi"
LONG_CONTEXT_TOKENS = 32 * 1024
MIN_MAX_SPLIT_SIZE_MB = 20  # kLargeBuffer, in MiB
ALLOCATOR_BACKENDS = ("native", "cudaMallocAsync")
# A registry entry: "Arch": ("module", "Class").
ARCH_KEY = re.compile(r"[A-Za-z0-9_]+")
N_CHECK_METHOD = "_check_n_within_max_num_seqs"
THINKING_OFF_VALIDATOR = "disable_thinking_for_tool_calls"


class StartupError(Exception):
    pass


# ---- GPUs -------------------------------------------------------------------------------

def visible_gpu_count(environ):
    """CUDA_VISIBLE_DEVICES when set (as CUDA honours it), else what ixsmi lists."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([device for device in visible.split(",") if device.strip()])
    ixsmi = environ.get("BIV100_STANDIN_IXSMI", DEFAULT_IXSMI)
    try:
        listing = subprocess.run([ixsmi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return 0  # no driver tool: CUDA sees no device either
    return len([line for line in listing.stdout.splitlines() if line.startswith("GPU ")])


def check_tensor_parallel_size(tensor_parallel_size, environ):
    gpus = visible_gpu_count(environ)
    if tensor_parallel_size > gpus:
        # mp_distributed_executor.py's wording, "less than" included.
        raise StartupError(
            f"RuntimeError: please set tensor_parallel_size ({tensor_parallel_size}) "
            f"to less than max local gpu count ({gpus})")


# ---- PYTORCH_CUDA_ALLOC_CONF --------------------------------------------------------------
# A port of c10/cuda/CUDAAllocatorConfig.cpp's parser (lexArgs, then one parse per key), so
# the messages are PyTorch's. Where releases differ, the stricter rule wins: the vendor's torch
# is older than the newest, and the stand-in must not accept what the base would refuse.

def check_allocator_config(config):
    tokens = _lex_allocator_config(config or "")
    position = 0
    while position < len(tokens):
        key = tokens[position]
        parse = ALLOCATOR_PARSERS.get(key)
        _require(parse is not None, f"Unrecognized CachingAllocator option: {key}")
        position = parse(tokens, _consume(tokens, position + 1, ":") + 1, key)
        if position + 1 < len(tokens):
            position = _consume(tokens, position + 1, ",")
        position += 1


def _lex_allocator_config(config):
    """Words and the separators , : [ ] as separate tokens; spaces dropped."""
    return [token for token in re.split(r"([,:\[\]])", config.replace(" ", "")) if token]


def _consume(tokens, position, separator):
    _require(position < len(tokens) and tokens[position] == separator,
             f"Error parsing CachingAllocator settings, expected {separator}")
    return position


def _value(tokens, position, key):
    _require(position < len(tokens), f"Error, expecting {key} value")
    return tokens[position]


def _parse_size(tokens, position, key):
    size_mb = _integer(_value(tokens, position, key))
    _require(key != "max_split_size_mb" or size_mb > MIN_MAX_SPLIT_SIZE_MB,
             f"CachingAllocator option max_split_size_mb too small, must be > "
             f"{MIN_MAX_SPLIT_SIZE_MB}")
    return position


def _parse_threshold(tokens, position, key):
    threshold = _number(_value(tokens, position, key))
    _require(threshold > 0, "garbage_collect_threshold too small, set it 0.0~1.0")
    _require(threshold < 1.0, "garbage_collect_threshold too big, set it 0.0~1.0")
    return position


def _parse_boolean(tokens, position, key):
    _require(position < len(tokens) and tokens[position] in ("True", "False"),
             f"Expected a single True/False argument for {key}")
    return position


def _parse_backend(tokens, position, key):
    _require(_value(tokens, position, key) in ALLOCATOR_BACKENDS,
             "Unknown allocator backend, options are native and cudaMallocAsync")
    return position


def _parse_register_threads(tokens, position, key):
    _require(_is_power_of_two(_integer(_value(tokens, position, key))),
             "Number of register threads has to be power of 2 ")
    return position


def _parse_roundup_divisions(tokens, position, key):
    """Either one division for all sizes, or `[interval:division,...,>:division]`."""
    if _value(tokens, position, key) != "[":
        _require_power_of_two_division(_integer(tokens[position]))
        return position
    position += 1
    while position < len(tokens) and tokens[position] != "]":
        interval = tokens[position]
        position = _consume(tokens, position + 1, ":") + 1
        _require_power_of_two_division(_integer(_value(tokens, position, key)))
        if interval != ">":
            _require(_is_power_of_two(_integer(interval)),
                     "For roundups, the intervals have to be power of 2 ")
        if position + 1 < len(tokens) and tokens[position + 1] != "]":
            position = _consume(tokens, position + 1, ",")
        position += 1
    _require(position < len(tokens), "Expected closing bracket ] in ConfigTokenizer")
    return position


def _require_power_of_two_division(division):
    # "divisons" is PyTorch's spelling.
    _require(_is_power_of_two(division), "For roundups, the divisons has to be power of 2 ")


def _integer(token):
    # PyTorch reads numbers with std::stoi, which throws on text that is not a number.
    _require(token.isdigit(), f"stoi: no conversion for {token!r}")
    return int(token)


def _number(token):
    try:
        return float(token)
    except ValueError:
        raise StartupError(f"RuntimeError: stod: no conversion for {token!r}") from None


def _is_power_of_two(number):
    return number > 0 and number & (number - 1) == 0


def _require(condition, message):
    if not condition:
        raise StartupError(f"RuntimeError: {message}")


ALLOCATOR_PARSERS = {
    "max_split_size_mb": _parse_size,
    "max_non_split_rounding_mb": _parse_size,
    "garbage_collection_threshold": _parse_threshold,
    "roundup_power2_divisions": _parse_roundup_divisions,
    "backend": _parse_backend,
    "expandable_segments": _parse_boolean,
    "release_lock_on_cudamalloc": _parse_boolean,
    "pinned_use_cuda_host_register": _parse_boolean,
    "pinned_use_background_threads": _parse_boolean,
    "pinned_num_register_threads": _parse_register_threads,
}


# ---- the model ----------------------------------------------------------------------------

def read_model_config(model_path):
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        # The stand-in serves local model folders only; vLLM would try the Hub here.
        raise StartupError(f"OSError: {model_path} does not appear to have a file named "
                           "config.json.")
    return json.loads(config_file.read_text())


def resolve_max_model_len(requested, model_config, environ):
    """ModelConfig's _get_and_verify_max_len, reduced to max_position_embeddings."""
    derived = _text_config_value(model_config, "max_position_embeddings")
    if derived is None:
        raise StartupError("ValueError: the model's config.json has no "
                           "max_position_embeddings, at the top or in text_config")
    if requested is None:
        return derived
    allow_long = environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower()
    if requested > derived and allow_long not in ("1", "true"):
        raise StartupError(
            f"ValueError: User-specified max_model_len ({requested}) is greater than the "
            f"derived max_model_len (max_position_embeddings={derived} or "
            f"model_max_length=None in model's config.json). This may lead to incorrect "
            f"model outputs or CUDA errors. To allow overriding this maximum, set the env "
            f"var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    return requested


def check_engine_limits(args, model_config, max_model_len):
    """The checks of ModelConfig, CacheConfig and SchedulerConfig on the launch parameters."""
    heads = _text_config_value(model_config, "num_attention_heads")
    if heads is not None and heads % args.tensor_parallel_size:
        raise StartupError(
            f"ValueError: Total number of attention heads ({heads}) must be divisible by "
            f"tensor parallel size ({args.tensor_parallel_size}).")
    if args.gpu_memory_utilization is not None and args.gpu_memory_utilization > 1.0:
        raise StartupError(f"ValueError: GPU memory utilization must be less than 1.0. Got "
                           f"{args.gpu_memory_utilization}.")
    batched = args.max_num_batched_tokens
    chunked = chunked_prefill(args, model_config, max_model_len)
    if batched is not None and batched < max_model_len and not chunked:
        raise StartupError(
            f"ValueError: max_num_batched_tokens ({batched}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            "max_num_batched_tokens or decrease max_model_len.")
    if batched is not None and batched < args.max_num_seqs:
        raise StartupError(
            f"ValueError: max_num_batched_tokens ({batched}) must be greater than or equal to "
            f"max_num_seqs ({args.max_num_seqs}).")


def chunked_prefill(args, model_config, max_model_len):
    """Whether prompts are prefilled in chunks of max_num_batched_tokens."""
    # Left unset, the V0 engine turns chunked prefill on for contexts above 32K, except for
    # multimodal models.
    if args.enable_chunked_prefill is not None:
        return args.enable_chunked_prefill
    return max_model_len > LONG_CONTEXT_TOKENS and not is_multimodal(model_config)


def is_multimodal(model_config):
    """The *ForConditionalGeneration architectures."""
    return any(architecture.endswith("ForConditionalGeneration")
               for architecture in model_config.get("architectures") or [])


def _text_config_value(model_config, key):
    return model_config.get(key, (model_config.get("text_config") or {}).get(key))


# ---- the installed vllm package ------------------------------------------------------------

def installed_vllm_root(environ):
    """The vllm package folder of this interpreter, found without importing it."""
    explicit = environ.get("BIV100_STANDIN_VLLM_ROOT")
    if explicit:
        return Path(explicit)
    for folder in [sysconfig.get_paths()["purelib"]] + sys.path:
        candidate = Path(folder or ".") / "vllm" / "__init__.py"
        if candidate.is_file():
            return candidate.parent
    raise StartupError("ModuleNotFoundError: No module named 'vllm'")


def registered_architectures(vllm_root):
    """The keys of every `"Arch": ("module", "Class")` dict literal in registry.py."""
    tree = ast.parse((vllm_root / "model_executor" / "models" / "registry.py").read_text())
    architectures = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            architectures.extend(
                key.value for key, value in zip(node.keys, node.values)
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
                and isinstance(value, ast.Tuple) and ARCH_KEY.fullmatch(key.value))
    return architectures


def check_architecture(model_config, vllm_root):
    architectures = model_config.get("architectures") or []
    supported = registered_architectures(vllm_root)
    if not any(architecture in supported for architecture in architectures):
        raise StartupError(
            f"ValueError: Model architectures {architectures} are not supported for now. "
            f"Supported architectures: {sorted(set(supported))}")


def serving_fixes(vllm_root):
    """Which of the team's serving-layer fixes the installed files carry.

    Read from the files' syntax trees, so a comment or a string naming the fix does not count.
    """
    openai = vllm_root / "entrypoints" / "openai"
    return {
        "n_within_max_num_seqs": _defines_function(openai / "serving_chat.py", N_CHECK_METHOD),
        "thinking_off_for_tools": _defines_function(openai / "protocol.py",
                                                    THINKING_OFF_VALIDATOR),
    }


def _defines_function(path, name):
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               for node in ast.walk(tree))
