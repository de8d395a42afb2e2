# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""computility_run: the platform's computility-run.yaml, rendered from the variables the fleet
is deployed with, so that the platform submission and the hosts cannot disagree."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import engine_cli_args

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def computility_run(
    engine_args: dict,
    env: dict,
    *,
    model_path: str,
    served_model_name: str,
    port: int,
    host: str = "0.0.0.0",
    python: str = "python",
    secret_env: list | tuple = (),
) -> dict:
    """Return the run file's document, to be written with to_nice_yaml:

    env         the engine's environment, every value a string (as the process will see it)
    secret_env  (when given) the names of the variables whose values the platform supplies
                from its own secrets: the file is shared and committed, so it names them only
    parameters  every engine argument with its typed value, the launch ones included
    command     the argv that starts the engine, rendered from parameters by engine_cli_args
    """
    launch = {
        "model": model_path,
        "served_model_name": served_model_name,
        "host": host,
        "port": port,
    }
    _refuse_second_values(engine_args, launch)
    _refuse_secret_values(env, secret_env)
    parameters = {**engine_args, **launch}
    document = {"env": {name: _env_text(name, value) for name, value in env.items()}}
    if secret_env:
        document["secret_env"] = sorted(set(secret_env))
    document["parameters"] = parameters
    document["command"] = [python, "-m", API_SERVER_MODULE, *engine_cli_args(parameters)]
    return document


def _refuse_secret_values(env: dict, secret_env) -> None:
    """A secret's value must not be written into the run file: it names the secret only."""
    carried = sorted(set(env) & set(secret_env))
    if carried:
        raise AnsibleFilterError(
            f"env carries the value of the secret {', '.join(carried)}: the run file names "
            f"secrets in secret_env and carries none"
        )


def _refuse_second_values(engine_args: dict, launch: dict) -> None:
    """A launch value also set in engine_args must agree: one of the two would be silently lost."""
    for name, value in launch.items():
        if name in engine_args and engine_args[name] != value:
            raise AnsibleFilterError(
                f"engine_args.{name} is {engine_args[name]!r} but {name} is {value!r}: "
                f"set it in one place"
            )


def _env_text(name: str, value) -> str:
    # A boolean has no single spelling in the environment (true, True, 1): the inventory must
    # write the one the reading program expects.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError(
            f"env.{name} is {value!r}: an environment value must be a string or a number"
        )
    return str(value)
