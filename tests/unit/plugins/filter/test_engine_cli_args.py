import ast

import pytest
import vllm_sources

from engine_defaults import SUB168

from ansible_collections.biv100.serving.plugins.filter.engine_cli_args import FilterModule
from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import (
    VLLM_0_10_1_1_ARGUMENTS,
    engine_args_problems,
    engine_cli_args,
)

QWEN3_5_POSITIONS = 262144


def problems(args, **facts):
    facts = {"gpus_free": 4, "max_position_embeddings": QWEN3_5_POSITIONS, **facts}
    return engine_args_problems(args, **facts)


# ---- rendering ----------------------------------------------------------------------------


def test_sub168_renders_as_the_proven_command_line_with_the_model_first():
    assert engine_cli_args({**SUB168, "model": "/opt/models/qwen3_5"}) == [
        "--model", "/opt/models/qwen3_5",
        "--dtype", "half",
        "--enable-chunked-prefill",
        "--enforce-eager",
        "--gpu-memory-utilization", "0.95",
        "--max-model-len", "256000",
        "--max-num-batched-tokens", "4096",
        "--max-num-seqs", "2",
        "--tensor-parallel-size", "4",
    ]  # fmt: skip


def test_the_order_does_not_depend_on_how_the_dict_was_built():
    args = {**SUB168, "model": "/m", "port": 8000}
    assert engine_cli_args(dict(reversed(args.items()))) == engine_cli_args(args)


def test_false_is_spelled_out_only_where_it_differs_from_the_default():
    assert engine_cli_args({"enable_chunked_prefill": False}) == ["--no-enable-chunked-prefill"]
    assert engine_cli_args({"enable_prefix_caching": False}) == ["--no-enable-prefix-caching"]
    assert engine_cli_args({"enforce_eager": False, "trust_remote_code": False}) == []


def test_none_and_empty_lists_are_left_out():
    assert engine_cli_args({"seed": None, "api_key": [], "port": 8000}) == ["--port", "8000"]


def test_lists_follow_the_argparse_form_of_each_argument():
    assert engine_cli_args({"served_model_name": ["qwen", "default"]}) == [
        "--served-model-name", "qwen", "default",
    ]  # fmt: skip
    assert engine_cli_args({"middleware": ["a.b", "c.d"]}) == [
        "--middleware", "a.b", "--middleware", "c.d",
    ]  # fmt: skip
    assert engine_cli_args({"allowed_origins": ["https://x"]}) == [
        "--allowed-origins", '["https://x"]',
    ]  # fmt: skip


def test_dicts_are_passed_as_json_and_values_as_their_exact_text():
    assert engine_cli_args({"hf_overrides": {"rope_theta": 1000000}, "swap_space": 0.5}) == [
        "--hf-overrides", '{"rope_theta":1000000}', "--swap-space", "0.5",
    ]  # fmt: skip


# ---- problems -----------------------------------------------------------------------------


def test_sub168_with_the_launch_arguments_has_no_problem():
    args = {
        **SUB168,
        "model": "/opt/models/qwen3_5",
        "served_model_name": "qwen3_5",
        "host": "0.0.0.0",
        "port": 8000,
        "tool_call_parser": "qwen3_coder",
        "reasoning_parser": "qwen3",
        "enable_auto_tool_choice": True,
    }
    assert problems(args) == []


def test_more_tensor_parallel_ranks_than_free_gpus():
    assert problems(SUB168, gpus_free=2) == [
        "engine_args.tensor_parallel_size is 4 but the host has 2 free GPUs"
    ]
    assert problems(SUB168, gpus_free=1) == [
        "engine_args.tensor_parallel_size is 4 but the host has 1 free GPU"
    ]


@pytest.mark.parametrize("fraction", [0, -0.5, 1.2])
def test_gpu_memory_utilization_outside_zero_to_one(fraction):
    assert problems({**SUB168, "gpu_memory_utilization": fraction}) == [
        f"engine_args.gpu_memory_utilization is {fraction}: it must be in (0, 1]"
    ]


def test_gpu_memory_utilization_of_exactly_one_is_accepted():
    assert problems({**SUB168, "gpu_memory_utilization": 1}) == []


def test_a_dtype_vllm_does_not_offer():
    assert problems({**SUB168, "dtype": "fp16"}) == [
        "engine_args.dtype is 'fp16': vLLM accepts auto, half, float16, bfloat16, float, float32"
    ]


@pytest.mark.parametrize("chunked", [False, None])
def test_batched_tokens_below_the_context_need_chunked_prefill(chunked):
    assert problems({**SUB168, "enable_chunked_prefill": chunked}) == [
        "engine_args.max_num_batched_tokens is 4096, smaller than engine_args.max_model_len "
        "256000: set engine_args.enable_chunked_prefill to true or raise max_num_batched_tokens"
    ]


def test_batched_tokens_covering_the_context_need_no_chunked_prefill():
    args = {**SUB168, "enable_chunked_prefill": False, "max_num_batched_tokens": 256000}
    assert problems(args) == []


def test_a_context_longer_than_the_model_positions_unless_allowed():
    args = {**SUB168, "max_model_len": 300000, "max_num_batched_tokens": 300000}
    assert problems(args) == [
        "engine_args.max_model_len is 300000, above the model's max_position_embeddings 262144: "
        "lower it, or allow it explicitly (vLLM then also needs VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
        "in the environment)"
    ]
    assert problems(args, allow_long_max_model_len=True) == []
    assert problems(args, max_position_embeddings=None) == []


def test_max_num_seqs_below_one():
    assert problems({**SUB168, "max_num_seqs": 0}) == [
        "engine_args.max_num_seqs is 0: it must be at least 1"
    ]


def test_an_unknown_name_is_named_with_the_closest_known_one():
    assert problems({**SUB168, "max_num_seq": 2}) == [
        "engine_args.max_num_seq is not an argument of vLLM 0.10.1.1's OpenAI server "
        "(did you mean max_num_seqs?)"
    ]
    assert problems({"zzz": 1}) == [
        "engine_args.zzz is not an argument of vLLM 0.10.1.1's OpenAI server"
    ]


def test_the_hosts_own_cli_replaces_the_builtin_list_in_either_spelling():
    known = ["--model", "--max-num-seqs", "enable_reasoning"]
    assert problems({"model": "/m", "enable_reasoning": True}, known_flags=known) == []
    assert problems({"max_model_len": 4096}, known_flags=known) == [
        "engine_args.max_model_len is not an argument of the host's vLLM OpenAI server"
    ]


@pytest.mark.parametrize(
    "name, value, kind",
    [
        ("max_num_seqs", "2", "an integer"),
        ("max_model_len", True, "an integer"),
        ("gpu_memory_utilization", "0.95", "a number"),
        ("enforce_eager", "yes", "true or false"),
        ("dtype", 16, "a string"),
        ("served_model_name", ["qwen", 3], "a string or a list of strings"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_once(name, value, kind):
    assert problems({**SUB168, name: value}) == [
        f"engine_args.{name} is {value!r}: it must be {kind}"
    ]


def test_every_problem_is_reported_at_once():
    args = {**SUB168, "dtype": "fp8", "max_num_seqs": 0, "gpu_memory_utilization": 2.0}
    assert len(problems(args, gpus_free=0)) == 4


def test_the_filter_is_exported_under_its_name():
    assert FilterModule().filters() == {"engine_cli_args": engine_cli_args}


# ---- the built-in argument list against the real 0.10.1.1 release -------------------------


def _openai_server_arguments(vllm_root) -> set[str]:
    """Every long option the 0.10.1.1 OpenAI server registers, as an argument name."""
    names = set()
    for relative in ("engine/arg_utils.py", "entrypoints/openai/cli_args.py"):
        tree = ast.parse((vllm_root / relative).read_text())
        for node in ast.walk(tree):
            names |= _long_options(node) | _frontend_fields(node)
    return names


def _long_options(node) -> set[str]:
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
        return set()
    return {
        arg.value[2:].replace("-", "_")
        for arg in node.args
        if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")
    }


def _frontend_fields(node) -> set[str]:
    # cli_args.py registers one option per FrontendArgs field in a loop (--{field}).
    if not (isinstance(node, ast.ClassDef) and node.name == "FrontendArgs"):
        return set()
    return {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)}


def test_the_builtin_argument_list_is_exactly_the_0_10_1_1_cli():
    vllm_root = vllm_sources.ensure_tree("0.10.1.1") / "vllm"
    assert VLLM_0_10_1_1_ARGUMENTS == _openai_server_arguments(vllm_root)
