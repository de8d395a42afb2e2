"""The shipped payload (files/serving) against the real vLLM 0.10.1.1 release.

Every patch must apply to the pristine file it names and leave a file that compiles; each fix
must be there in the patched code (run on its own where that is cheap); and the fixes the
README says need no patch must still hold in the pristine release.
"""

from __future__ import annotations

import ast
import asyncio
import copy
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace

import pytest
import vllm_sources
import yaml

from ansible_collections.biv100.serving.plugins.module_utils._vllm_registry import (
    parse_registry,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._unified_diff import apply_patch

PAYLOAD = Path(__file__).resolve().parents[2] / "files" / "serving"

# Where each file name of the brief that the payload may use lives in the 0.10.1.1 package.
BRIEF_PATHS = {
    "registry.py": "model_executor/models/registry.py",
    "serving_chat.py": "entrypoints/openai/serving_chat.py",
    "protocol.py": "entrypoints/openai/protocol.py",
    "chat_utils.py": "entrypoints/chat_utils.py",
    "cli_args.py": "entrypoints/openai/cli_args.py",
    "api_server.py": "entrypoints/openai/api_server.py",
}

ENTRIES = yaml.safe_load((PAYLOAD / "manifest.yml").read_text(encoding="utf-8"))["entries"]
PATCH_ENTRIES = [entry for entry in ENTRIES if entry["kind"] == "patch"]


def entry_named(name: str) -> dict:
    return next(entry for entry in ENTRIES if entry["name"] == name)


@pytest.fixture(scope="module")
def base_tree() -> Path:
    return vllm_sources.ensure_tree(vllm_sources.LAB_BASE_VERSION) / "vllm"


def base_source(base_tree: Path, dest: str) -> str:
    return (base_tree / BRIEF_PATHS.get(dest, dest)).read_text(encoding="utf-8")


def patched_source(base_tree: Path, entry: dict) -> str:
    patch_text = (PAYLOAD / entry["src"]).read_text(encoding="utf-8")
    return apply_patch(base_source(base_tree, entry["dest"]), patch_text, filename=entry["dest"])


# --- the manifest and its patches -----------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry["name"])
def test_every_entry_source_exists(entry):
    source = PAYLOAD / entry["src"]
    assert source.is_dir() if entry["kind"] == "dir" else source.is_file()


@pytest.mark.parametrize("entry", PATCH_ENTRIES, ids=lambda entry: entry["name"])
def test_every_patch_applies_to_the_base_release_and_compiles(base_tree, entry):
    source = patched_source(base_tree, entry)
    assert source != base_source(base_tree, entry["dest"])
    compile(source, BRIEF_PATHS.get(entry["dest"], entry["dest"]), "exec")


# --- what each patch does -------------------------------------------------------------------

QWEN3_5 = {
    "Qwen3_5ForCausalLM": ["qwen3_5", "Qwen3_5ForCausalLM"],
    "Qwen3_5ForConditionalGeneration": ["qwen3_5", "Qwen3_5ForConditionalGeneration"],
}


def test_the_registry_patch_registers_qwen3_5_and_changes_nothing_else(base_tree):
    entry = entry_named("qwen3-5-registry")
    assert entry["when"] == "model_unregistered"  # the base may register Qwen3_5 itself
    before, _unresolved = parse_registry(base_source(base_tree, "registry.py"))
    after, unresolved = parse_registry(patched_source(base_tree, entry))
    assert unresolved == []
    assert {name: after[name] for name in QWEN3_5} == QWEN3_5
    assert {name: pair for name, pair in after.items() if name not in QWEN3_5} == before


def test_the_registry_patch_puts_each_architecture_in_its_task_table(base_tree):
    module = ast.parse(patched_source(base_tree, entry_named("qwen3-5-registry")))
    assert "Qwen3_5ForCausalLM" in literal_keys(module, "_TEXT_GENERATION_MODELS")
    assert "Qwen3_5ForConditionalGeneration" in literal_keys(module, "_MULTIMODAL_MODELS")


def literal_keys(module: ast.Module, table: str) -> set[str]:
    """The keys written in the module-level dict literal assigned to `table`."""
    assignment = next(
        statement
        for statement in module.body
        if isinstance(statement, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == table for target in statement.targets)
    )
    return {ast.literal_eval(key) for key in assignment.value.keys if key is not None}


@pytest.fixture(scope="module")
def serving_chat(base_tree) -> ast.Module:
    return ast.parse(patched_source(base_tree, entry_named("n-within-max-num-seqs")))


def test_the_chat_endpoint_returns_the_n_guard_error_before_scheduling(serving_chat):
    body = method(serving_chat, "OpenAIServingChat", "create_chat_completion").body
    guard = next(
        position
        for position, statement in enumerate(body)
        if isinstance(statement, ast.Assign)
        and calls(statement.value, "_check_n_within_max_num_seqs")
    )
    result = body[guard].targets[0].id
    early_return = body[guard + 1]
    assert isinstance(early_return, ast.If)
    assert [ast.dump(statement) for statement in early_return.body] == [
        ast.dump(ast.Return(ast.Name(result, ast.Load())))
    ]
    scheduling = [statement for statement in body if calls(statement, "generate")]
    assert scheduling and all(statement.lineno > body[guard].lineno for statement in scheduling)


@pytest.mark.parametrize(
    ("n", "max_num_seqs", "refused"),
    [(3, 2, True), (2, 2, False), (1, 2, False), (None, 2, False), (5, 4, True)],
)
def test_the_n_guard_refuses_only_n_above_max_num_seqs(serving_chat, n, max_num_seqs, refused):
    check = standalone(method(serving_chat, "OpenAIServingChat", "_check_n_within_max_num_seqs"))
    error = asyncio.run(check(FakeServingChat(max_num_seqs), SimpleNamespace(n=n)))
    if not refused:
        assert error is None
    else:
        status, message = error
        assert status == HTTPStatus.BAD_REQUEST
        assert f"n={n}" in message and f"max_num_seqs ({max_num_seqs})" in message


class FakeServingChat:
    """What the guard uses of OpenAIServingChat: the engine client and the error factory
    (with the signature and defaults of OpenAIServing.create_error_response)."""

    def __init__(self, max_num_seqs: int):
        config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        self.engine_client = SimpleNamespace(get_vllm_config=lambda: _resolved(config))

    def create_error_response(
        self, message, err_type="BadRequestError", status_code=HTTPStatus.BAD_REQUEST
    ):
        return status_code, message


async def _resolved(value):
    return value


@pytest.fixture(scope="module")
def disable_thinking(base_tree):
    module = ast.parse(patched_source(base_tree, entry_named("thinking-off-for-tools")))
    function = method(module, "ChatCompletionRequest", "disable_thinking_for_tool_calls")
    decorators = [ast.unparse(decorator) for decorator in function.decorator_list]
    assert decorators == ["model_validator(mode='before')", "classmethod"]
    validator = standalone(function)
    return lambda data: validator(None, data)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.parametrize(
    ("request_data", "template_kwargs"),
    [
        ({"tools": TOOLS}, {"enable_thinking": False}),
        ({"tools": TOOLS, "chat_template_kwargs": None}, {"enable_thinking": False}),
        (
            {"tools": TOOLS, "chat_template_kwargs": {"custom": 1}},
            {"custom": 1, "enable_thinking": False},
        ),
        # The request's own choice wins, either way.
        (
            {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": True}},
            {"enable_thinking": True},
        ),
        (
            {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
            {"enable_thinking": False},
        ),
        # Without tools, thinking is left to the template's default.
        ({}, None),
        ({"tools": []}, None),
        ({"tools": None, "chat_template_kwargs": {"custom": 1}}, {"custom": 1}),
        # A malformed value is left for the field's own validation to refuse.
        ({"tools": TOOLS, "chat_template_kwargs": "enable_thinking"}, "enable_thinking"),
    ],
)
def test_thinking_is_switched_off_for_requests_with_tools_unless_they_chose(
    disable_thinking, request_data, template_kwargs
):
    assert disable_thinking(dict(request_data)).get("chat_template_kwargs") == template_kwargs


# --- fixes the base release already has (README: "Fixes that need no patch") ---------------


def test_the_base_accepts_an_assistant_message_with_tool_calls_and_content_none(base_tree):
    module = ast.parse(base_source(base_tree, "chat_utils.py"))
    parse = function_named(module, "_parse_chat_message_content")
    # `if content is None: content = []`: the message still yields one conversation message...
    assert any(
        ast.unparse(node.test) == "content is None"
        and [ast.unparse(statement) for statement in node.body] == ["content = []"]
        for node in ast.walk(parse)
        if isinstance(node, ast.If)
    )
    # ...to which the assistant's tool_calls are copied.
    assert "result_msg['tool_calls'] = list(parsed_msg['tool_calls'])" in ast.unparse(parse)


def test_the_base_accepts_max_completion_tokens(base_tree):
    protocol = ast.parse(base_source(base_tree, "protocol.py"))
    request = class_named(protocol, "ChatCompletionRequest")
    fields = {
        statement.target.id: ast.unparse(statement.annotation)
        for statement in request.body
        if isinstance(statement, ast.AnnAssign)
    }
    assert fields["max_completion_tokens"] == "Optional[int]"
    utils = ast.parse((base_tree / "entrypoints" / "utils.py").read_text(encoding="utf-8"))
    assert "'max_completion_tokens'" in ast.unparse(function_named(utils, "get_max_tokens"))


# --- reading code ---------------------------------------------------------------------------

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def class_named(module: ast.Module, name: str) -> ast.ClassDef:
    return next(
        node for node in module.body if isinstance(node, ast.ClassDef) and node.name == name
    )


def function_named(scope: ast.Module | ast.ClassDef, name: str):
    return next(node for node in scope.body if isinstance(node, FUNCTIONS) and node.name == name)


def method(module: ast.Module, class_name: str, name: str):
    return function_named(class_named(module, class_name), name)


def calls(node: ast.AST, attribute: str) -> bool:
    """Whether node contains a call of `<something>.<attribute>(...)`."""
    return any(
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr == attribute
        for inner in ast.walk(node)
    )


def standalone(function):
    """A copy of the function compiled on its own, without decorators or annotations: it then
    runs without vLLM and its dependencies, which only those refer to."""
    function = copy.deepcopy(function)
    function.decorator_list = []
    function.returns = None
    arguments = function.args
    for argument in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
        argument.annotation = None
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace: dict = {}
    exec(compile(module, f"<patched {function.name}>", "exec"), namespace)
    return namespace[function.name]
