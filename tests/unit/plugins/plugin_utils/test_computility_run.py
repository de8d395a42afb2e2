import pytest
import yaml
from ansible.errors import AnsibleFilterError

from engine_defaults import SUB168

from ansible_collections.biv100.serving.plugins.plugin_utils._computility_run import computility_run
from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import engine_cli_args

ENV = {
    "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8,max_split_size_mb:512",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}
ENGINE_ARGS = {**SUB168, "tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3"}
LAUNCH = {"model_path": "/opt/models/qwen3_5", "served_model_name": "qwen3_5", "port": 8000}


def render(engine_args=None, env=None, **launch):
    return computility_run(ENGINE_ARGS if engine_args is None else engine_args, ENV if env is None else env,
                           **{**LAUNCH, **launch})


def test_the_document_round_trips_through_yaml_with_the_inventorys_values():
    parsed = yaml.safe_load(yaml.safe_dump(render()))
    assert parsed["env"] == ENV
    assert parsed["parameters"] == {
        **ENGINE_ARGS,
        "model": "/opt/models/qwen3_5",
        "served_model_name": "qwen3_5",
        "host": "0.0.0.0",
        "port": 8000,
    }
    assert parsed["command"] == [
        "python", "-m", "vllm.entrypoints.openai.api_server", *engine_cli_args(parsed["parameters"])
    ]  # fmt: skip


def test_the_command_is_the_one_the_fleet_launches():
    command = render(python="/usr/local/corex/python3/bin/python3")["command"]
    assert command[:5] == [
        "/usr/local/corex/python3/bin/python3", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/opt/models/qwen3_5",
    ]  # fmt: skip
    assert "--port" in command and command[command.index("--port") + 1] == "8000"


def test_numbers_in_the_environment_become_the_text_the_process_sees():
    assert render(env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": 1})["env"] == {
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"
    }


@pytest.mark.parametrize("value", [True, ["a"], None])
def test_an_environment_value_without_one_spelling_is_refused(value):
    with pytest.raises(AnsibleFilterError, match=r"^env\.X is .*: an environment value must be"):
        render(env={"X": value})


def test_a_launch_value_set_twice_must_agree():
    assert render(engine_args={**ENGINE_ARGS, "port": 8000})["parameters"]["port"] == 8000
    with pytest.raises(AnsibleFilterError) as raised:
        render(engine_args={**ENGINE_ARGS, "port": 9000})
    assert str(raised.value) == "engine_args.port is 9000 but port is 8000: set it in one place"


def test_a_secret_is_named_in_the_run_file_and_its_value_is_not():
    document = render(secret_env=["VLLM_API_KEY"])

    assert document["secret_env"] == ["VLLM_API_KEY"] and "VLLM_API_KEY" not in document["env"]
    assert list(document) == ["env", "secret_env", "parameters", "command"]
    assert "secret_env" not in render()  # the file of a fleet without secrets is as it was


def test_a_secrets_value_in_the_environment_is_refused():
    with pytest.raises(AnsibleFilterError) as raised:
        render(env={**ENV, "VLLM_API_KEY": "sk-biv100-1234"}, secret_env=["VLLM_API_KEY"])
    assert "sk-biv100-1234" not in str(raised.value)
    assert str(raised.value).startswith("env carries the value of the secret VLLM_API_KEY")
