"""The launch settings the simulated engine's speed and memory respond to, resolved from its
arguments as vLLM 0.10.1.1's V0 engine resolves them (EngineArgs, SchedulerConfig)."""

from . import cli, startup

# EngineArgs fields whose default vLLM resolves later; the stand-in needs their values.
RESOLVED_DEFAULTS = {"port": 8000, "tensor_parallel_size": 1, "max_num_seqs": 256}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # CacheConfig
# vllm.utils: SchedulerConfig's max_num_batched_tokens when it is not given.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS = 5120
ALLOCATOR_VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"


def apply_resolved_defaults(args):
    for name, value in RESOLVED_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


class EngineSettings:
    """What one engine runs with, every default resolved."""

    def __init__(self, max_model_len, max_num_seqs, max_num_batched_tokens, chunked_prefill,
                 gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION, dtype="auto",
                 kv_cache_dtype="auto", tensor_parallel_size=1, allocator_conf=""):
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.gpu_memory_utilization = gpu_memory_utilization
        self.dtype = dtype
        self.kv_cache_dtype = kv_cache_dtype
        self.tensor_parallel_size = tensor_parallel_size
        self.allocator_conf = allocator_conf

    @classmethod
    def from_args(cls, args, model_config, max_model_len, environ):
        chunked = startup.chunked_prefill(args, model_config, max_model_len)
        batched = args.max_num_batched_tokens
        if batched is None:
            # SchedulerConfig.__post_init__: without chunking a whole prompt is one step.
            batched = (DEFAULT_MAX_NUM_BATCHED_TOKENS if chunked
                       else max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS))
            if startup.is_multimodal(model_config):
                batched = max(batched, MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS)
            batched = min(args.max_num_seqs * max_model_len, batched)
        utilization = args.gpu_memory_utilization
        return cls(max_model_len, args.max_num_seqs, batched, chunked,
                   DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization,
                   args.dtype or "auto", args.kv_cache_dtype or "auto",
                   args.tensor_parallel_size, environ.get(ALLOCATOR_VARIABLE) or "")

    def __repr__(self):
        return (f"EngineSettings(max_model_len={self.max_model_len}, "
                f"max_num_seqs={self.max_num_seqs}, "
                f"max_num_batched_tokens={self.max_num_batched_tokens}, "
                f"chunked_prefill={self.chunked_prefill}, "
                f"gpu_memory_utilization={self.gpu_memory_utilization:g}, dtype={self.dtype}, "
                f"kv_cache_dtype={self.kv_cache_dtype}, "
                f"tensor_parallel_size={self.tensor_parallel_size}, "
                f"allocator_conf={self.allocator_conf!r})")


def from_engine_args(engine_args, model_config, environ=None):
    """The settings of an engine_args mapping (snake_case names and values, as the engine role
    takes them), after the checks the engine makes at start on them; startup.StartupError with
    the engine's message for what it refuses. `environ` is the engine's environment
    (PYTORCH_CUDA_ALLOC_CONF, VLLM_ALLOW_LONG_MAX_MODEL_LEN)."""
    environ = environ or {}
    args = cli.parse_args([])
    for name, value in engine_args.items():
        if not hasattr(args, name):
            raise startup.StartupError(f"{name} is not an argument of vLLM 0.10.1.1's server")
        setattr(args, name, value)
    apply_resolved_defaults(args)
    max_model_len = startup.resolve_max_model_len(args.max_model_len, model_config, environ)
    startup.check_engine_limits(args, model_config, max_model_len)
    startup.check_allocator_config(environ.get(ALLOCATOR_VARIABLE))
    return EngineSettings.from_args(args, model_config, max_model_len, environ)
