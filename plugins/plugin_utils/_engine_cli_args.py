# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""engine_cli_args: one dict of engine arguments, rendered as vLLM's OpenAI-server command line
and checked before anything on a host changes."""

from __future__ import annotations

import difflib
import json
from typing import Callable, NamedTuple

# Every option of `python -m vllm.entrypoints.openai.api_server` in vLLM 0.10.1.1, as argument
# names: the `add_argument` long options of engine/arg_utils.py and entrypoints/openai/cli_args.py
# plus the FrontendArgs fields that cli_args.py turns into options. The unit tests re-extract it
# from the real release, so an edit here that drifts from 0.10.1.1 fails them.
VLLM_0_10_1_1_ARGUMENTS = frozenset("""
    additional_config allow_credentials allowed_headers allowed_local_media_path
    allowed_methods allowed_origins api_key api_server_count async_scheduling block_size
    calculate_kv_scales chat_template chat_template_content_format code_revision
    collect_detailed_traces compilation_config config config_format convert cpu_offload_gb
    cuda_graph_sizes data_parallel_address data_parallel_backend data_parallel_hybrid_lb
    data_parallel_rank data_parallel_rpc_port data_parallel_size data_parallel_size_local
    data_parallel_start_rank default_mm_loras disable_async_output_proc disable_cascade_attn
    disable_chunked_mm_input disable_custom_all_reduce disable_fastapi_docs
    disable_frontend_multiprocessing disable_hybrid_kv_cache_manager disable_log_requests
    disable_log_stats disable_mm_preprocessor_cache disable_sliding_window
    disable_uvicorn_access_log distributed_executor_backend download_dir dtype
    enable_auto_tool_choice enable_chunked_prefill enable_eplb enable_expert_parallel
    enable_force_include_usage enable_log_outputs enable_log_requests enable_lora
    enable_lora_bias enable_multimodal_encoder_data_parallel enable_prefix_caching
    enable_prompt_adapter enable_prompt_embeds enable_prompt_tokens_details
    enable_request_id_headers enable_server_load_tracking enable_sleep_mode
    enable_ssl_refresh enable_tokenizer_info_endpoint enforce_eager eplb_log_balancedness
    eplb_step_interval eplb_window_size exclude_tools_when_tool_choice_none
    fully_sharded_loras generation_config gpu_memory_utilization guided_decoding_backend
    guided_decoding_disable_additional_properties guided_decoding_disable_any_whitespace
    guided_decoding_disable_fallback h11_max_header_count h11_max_incomplete_event_size
    headless hf_config_path hf_overrides hf_token host ignore_patterns interleave_mm_strings
    kv_cache_dtype kv_events_config kv_sharing_fast_prefill kv_transfer_config
    limit_mm_per_prompt load_format log_config_file logits_processor_pattern
    logits_processors logprobs_mode long_prefill_token_threshold lora_dtype
    lora_extra_vocab_size lora_modules mamba_cache_dtype mamba_ssm_cache_dtype max_cpu_loras
    max_log_len max_logprobs max_long_partial_prefills max_lora_rank max_loras max_model_len
    max_num_batched_tokens max_num_partial_prefills max_num_seqs
    max_parallel_loading_workers max_seq_len_to_capture media_io_kwargs middleware
    mm_processor_cache_gb mm_processor_kwargs model model_impl model_loader_extra_config
    num_gpu_blocks_override num_lookahead_slots num_redundant_experts otlp_traces_endpoint
    override_attention_dtype override_generation_config override_neuron_config
    override_pooler_config pipeline_parallel_size port preemption_mode
    prefix_caching_hash_algo pt_load_map_location quantization ray_workers_use_nsight
    reasoning_parser response_role return_tokens_as_token_ids revision root_path
    rope_scaling rope_theta runner scheduler_cls scheduler_delay_factor scheduling_policy
    seed served_model_name show_hidden_metrics_for_version skip_mm_profiling
    skip_tokenizer_init speculative_config ssl_ca_certs ssl_cert_reqs ssl_certfile
    ssl_keyfile swap_space task tensor_parallel_size tokenizer tokenizer_mode
    tokenizer_revision tool_call_parser tool_parser_plugin tool_server trust_remote_code uds
    use_tqdm_on_load uvicorn_log_level worker_cls worker_extension_cls
""".split())

# Booleans whose 0.10.1.1 default is not false (None lets the engine decide, or true): false
# changes something only when spelled `--no-<flag>`. Every other boolean defaults to false, so
# false is rendered as nothing, which means false on every vLLM version, including V0-era forks
# whose store_true flags (enforce_eager among them) have no `--no-` form to accept.
SPELLED_OUT_WHEN_FALSE = frozenset(
    {"enable_chunked_prefill", "enable_prefix_caching", "use_tqdm_on_load"}
)

# List-valued arguments that argparse reads differently from the usual `nargs="+"` form.
REPEATED_FLAG_ARGUMENTS = frozenset({"middleware"})  # action="append": one flag per item
JSON_LIST_ARGUMENTS = frozenset({"allowed_origins", "allowed_methods", "allowed_headers"})

DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")


class ValueKind(NamedTuple):
    description: str  # completes "it must be ..."
    accepts: Callable[[object], bool]


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # true is not a count


def _is_number(value) -> bool:
    return isinstance(value, float) or _is_integer(value)


def _is_names(value) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(item, str) for item in value)
    )


# The kind of value each argument the deployment is expected to set must have; the values of
# other arguments pass through as given, for vLLM to judge.
_KINDS_OF_ARGUMENTS = {
    ValueKind("an integer", _is_integer): """
        max_model_len max_num_seqs max_num_batched_tokens tensor_parallel_size
        pipeline_parallel_size port seed max_log_len""",
    ValueKind("a number", _is_number): "gpu_memory_utilization swap_space cpu_offload_gb",
    ValueKind("true or false", lambda value: isinstance(value, bool)): """
        enable_chunked_prefill enforce_eager enable_prefix_caching trust_remote_code
        enable_auto_tool_choice disable_log_stats enable_log_requests""",
    ValueKind("a string", lambda value: isinstance(value, str)): """
        model dtype host tool_call_parser reasoning_parser tokenizer chat_template
        kv_cache_dtype quantization""",
    ValueKind("a string or a list of strings", _is_names): "served_model_name api_key",
}
ARGUMENT_KINDS = {
    name: kind for kind, names in _KINDS_OF_ARGUMENTS.items() for name in names.split()
}


def engine_cli_args(args: dict) -> list[str]:
    """Render the arguments as command-line tokens: --model first, then the others by name.

    The order depends on the names only, so the same dict always gives the same command line,
    whatever order the inventory merged it in (the engine restarts when the line changes).
    """
    names = sorted(args, key=lambda name: (name != "model", name))
    return [token for name in names for token in _tokens(name, args[name])]


def _tokens(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):
        return _boolean_tokens(name, flag, value)
    if isinstance(value, dict):
        return [flag, json.dumps(value, separators=(",", ":"))]  # vLLM parses dicts as JSON
    if isinstance(value, list):
        return _list_tokens(name, flag, value)
    return [flag, str(value)]


def _boolean_tokens(name: str, flag: str, value: bool) -> list[str]:
    if value:
        return [flag]
    return [f"--no-{flag[2:]}"] if name in SPELLED_OUT_WHEN_FALSE else []


def _list_tokens(name: str, flag: str, items: list) -> list[str]:
    if not items:
        return []  # nargs="+" refuses a flag without values; an empty list asks for nothing
    if name in REPEATED_FLAG_ARGUMENTS:
        return [token for item in items for token in (flag, str(item))]
    if name in JSON_LIST_ARGUMENTS:
        return [flag, json.dumps(items)]
    return [flag, *map(str, items)]


def engine_args_problems(
    args: dict,
    *,
    gpus_free: int | None,
    max_position_embeddings: int | None,
    allow_long_max_model_len: bool = False,
    known_flags: list[str] | None = None,
) -> list[str]:
    """Return every problem of the arguments, one sentence each (empty = launchable).

    known_flags is the host's own CLI (names as `max_num_seqs` or `--max-num-seqs`); without
    it the names are checked against vLLM 0.10.1.1's OpenAI server. gpus_free None: the GPUs
    were not read, and tensor_parallel_size is not judged.
    """
    well_typed = {name: value for name, value in args.items() if _has_expected_type(name, value)}
    return [
        *_unknown_name_problems(args, known_flags),
        *_type_problems(args),
        *_tensor_parallel_problems(well_typed, gpus_free),
        *_memory_utilization_problems(well_typed),
        *_dtype_problems(well_typed),
        *_batched_tokens_problems(well_typed),
        *_context_length_problems(well_typed, max_position_embeddings, allow_long_max_model_len),
        *_max_num_seqs_problems(well_typed),
    ]


def _has_expected_type(name: str, value) -> bool:
    kind = ARGUMENT_KINDS.get(name)
    return value is None or kind is None or kind.accepts(value)


def _unknown_name_problems(args: dict, known_flags: list[str] | None) -> list[str]:
    known, cli = _known_arguments(known_flags)
    return [
        f"engine_args.{name} is not an argument of {cli}{_suggestion(name, known)}"
        for name in args
        if name not in known
    ]


def _known_arguments(known_flags: list[str] | None) -> tuple[frozenset, str]:
    """The argument names to accept, and how to call the command line they come from."""
    if known_flags is None:
        return VLLM_0_10_1_1_ARGUMENTS, "vLLM 0.10.1.1's OpenAI server"
    names = frozenset(flag.lstrip("-").replace("-", "_") for flag in known_flags)
    return names, "the host's vLLM OpenAI server"


def _suggestion(name: str, known) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _type_problems(args: dict) -> list[str]:
    return [
        f"engine_args.{name} is {value!r}: it must be {ARGUMENT_KINDS[name].description}"
        for name, value in args.items()
        if not _has_expected_type(name, value)
    ]


def _tensor_parallel_problems(args: dict, gpus_free: int | None) -> list[str]:
    size = args.get("tensor_parallel_size")
    if size is None or gpus_free is None or size <= gpus_free:
        return []
    return [
        f"engine_args.tensor_parallel_size is {size} but the host has {gpus_free} free "
        f"GPU{'' if gpus_free == 1 else 's'}"
    ]


def _memory_utilization_problems(args: dict) -> list[str]:
    fraction = args.get("gpu_memory_utilization")
    if fraction is None or 0 < fraction <= 1:
        return []
    return [f"engine_args.gpu_memory_utilization is {fraction}: it must be in (0, 1]"]


def _dtype_problems(args: dict) -> list[str]:
    dtype = args.get("dtype")
    if dtype is None or dtype in DTYPE_CHOICES:
        return []
    return [f"engine_args.dtype is {dtype!r}: vLLM accepts {', '.join(DTYPE_CHOICES)}"]


def _batched_tokens_problems(args: dict) -> list[str]:
    batched, max_len = args.get("max_num_batched_tokens"), args.get("max_model_len")
    if (
        batched is None
        or max_len is None
        or batched >= max_len
        or args.get("enable_chunked_prefill")
    ):
        return []
    # Without chunked prefill a prompt is scheduled whole, so one of max_model_len tokens would
    # never fit in a batch; vLLM's SchedulerConfig refuses the combination at start-up.
    return [
        f"engine_args.max_num_batched_tokens is {batched}, smaller than engine_args.max_model_len "
        f"{max_len}: set engine_args.enable_chunked_prefill to true or raise max_num_batched_tokens"
    ]


def _context_length_problems(
    args: dict, max_position_embeddings: int | None, allowed: bool
) -> list[str]:
    max_len = args.get("max_model_len")
    if (
        max_len is None
        or max_position_embeddings is None
        or allowed
        or max_len <= max_position_embeddings
    ):
        return []
    return [
        f"engine_args.max_model_len is {max_len}, above the model's max_position_embeddings "
        f"{max_position_embeddings}: lower it, or allow it explicitly (vLLM then also needs "
        f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the environment)"
    ]


def _max_num_seqs_problems(args: dict) -> list[str]:
    seqs = args.get("max_num_seqs")
    if seqs is None or seqs >= 1:
        return []
    return [f"engine_args.max_num_seqs is {seqs}: it must be at least 1"]
