"""The engine role's env file holds every variable of the instance's env, and the key, so that the
engine reads them back unchanged, under systemd and under the collection's launcher alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.biv100.serving.plugins.module_utils._env_file import parse_env_text

RENDERER = Path(__file__).with_name("engine_role_vars.py")

# A key and variables with what the env file's grammar would otherwise change: quotes, a
# backslash, whitespace at the ends, a line break.
AWKWARD_KEY = 'sk-"team" \\key\\ '
AWKWARD_ENV = {"NCCL_SOCKET_IFNAME": " eth0", "BANNER": "'quoted'\nsecond line", "PLAIN": "a=b #c"}


def render(inventory: str) -> dict:
    request = {"vault_password": "unused", "inventory": inventory}
    done = subprocess.run([sys.executable, str(RENDERER)], input=json.dumps(request),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_variable_is_read_back_from_the_env_file_as_it_was_given():
    rendered = render(f"engine_api_key: {json.dumps(AWKWARD_KEY)}\nengine_env: {json.dumps(AWKWARD_ENV)}\n")

    variables = parse_env_text(rendered["engine_env_file_content"], "engine_env_file_content")

    assert variables == {**rendered["instances"][0]["env"], "VLLM_API_KEY": AWKWARD_KEY}
    assert variables["VLLM_API_KEY"] == AWKWARD_KEY and variables["NCCL_SOCKET_IFNAME"] == " eth0"
    assert variables["BANNER"] == "'quoted'\nsecond line" and variables["PLAIN"] == "a=b #c"
    # Values the grammar reads unchanged are written as they are.
    assert "\nPLAIN=a=b #c\n" in rendered["engine_env_file_content"]
    assert "\nCUDA_VISIBLE_DEVICES=0,1,2,3\n" in rendered["engine_env_file_content"]
