"""The clients' key (engine_api_key, kept in Ansible Vault) reaches the engine's env file and
nothing else the engine role renders: not the command line, not the settings a release records,
not the platform's run file. And every task that carries it hides it from the output."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.parsing.vault import VaultLib, VaultSecret

from engine_defaults import SUB168

REPO = Path(__file__).resolve().parents[3]
RENDERER = Path(__file__).with_name("engine_role_vars.py")
VAULT_PASSWORD = "biv100-unit-vault-password"
SECRET = "sk-biv100-unit-5e3f0a7c9b1d"


def vault_inline(value: str) -> str:
    """An `!vault |` value as `ansible-vault encrypt_string` writes it into group_vars."""
    blob = VaultLib([("default", VaultSecret(VAULT_PASSWORD.encode()))]).encrypt(value).decode()
    return "!vault |\n" + "".join(f"  {line}\n" for line in blob.splitlines())


def render(inventory: str = "", restore: dict | None = None) -> dict:
    request = {"vault_password": VAULT_PASSWORD, "inventory": inventory, "restore": restore}
    done = subprocess.run([sys.executable, str(RENDERER)], input=json.dumps(request),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def vaulted():
    """The role's values for an inventory that keeps the key inline in Vault."""
    return render(f"engine_api_key: {vault_inline(SECRET)}")


def test_a_vault_encrypted_key_reaches_the_env_file(vaulted):
    assert f"\nVLLM_API_KEY={SECRET}\n" in vaulted["engine_env_file_content"]


def test_the_key_is_in_no_instance_value_command_line_release_record_or_platform_file(vaulted):
    # The instance value is a fact: it must not carry the key in any of its parts.
    assert SECRET not in json.dumps(vaulted["instances"])


def test_a_release_record_says_a_key_was_set_and_not_which(vaulted):
    (instance,) = vaulted["instances"]
    assert instance["record"]["api_key_set"] is True
    assert "VLLM_API_KEY" not in instance["record"]["env"] and "VLLM_API_KEY" not in instance["env"]
    assert render()["instances"][0]["record"]["api_key_set"] is False


def test_the_platform_file_names_the_key_without_its_value(vaulted):
    run_file = yaml.safe_load(vaulted["instances"][0]["record"]["platform_run"])
    assert run_file["secret_env"] == ["VLLM_API_KEY"] and "VLLM_API_KEY" not in run_file["env"]
    assert "secret_env" not in yaml.safe_load(render()["instances"][0]["record"]["platform_run"])


def test_a_restored_release_runs_with_the_current_key():
    # What a release proven with a key recorded, as the rollback role hands it back.
    recorded = {"instances": {"vllm": {
        "args": {**SUB168, "max_num_seqs": 4}, "allocator": {"max_split_size_mb": 512}, "env": {},
        "visible_devices": "", "allow_long_max_model_len": False, "api_key_set": True}}}
    restored = render(f"engine_api_key: {vault_inline(SECRET)}\n", restore=recorded)

    assert f"\nVLLM_API_KEY={SECRET}\n" in restored["engine_env_file_content"]
    launch = restored["instances"][0]["command"]
    assert launch[launch.index("--max-num-seqs") + 1] == "4" and SECRET not in json.dumps(restored["instances"])


def test_the_key_as_an_engine_argument_or_variable_is_refused_without_showing_it():
    problems = render(f"engine_args: {json.dumps({**SUB168, 'api_key': SECRET})}\n"
                      f"engine_env: {json.dumps({'VLLM_API_KEY': SECRET})}\n")["problems"]

    assert [problem.split(" would ")[0] for problem in problems] == [
        "engine_args.api_key", "engine_env.VLLM_API_KEY"]
    assert SECRET not in json.dumps(problems)


# --- every task that carries the key hides it --------------------------------------------------

KEY = "engine_api_key"

TASK_KEYWORDS = {
    "name", "when", "register", "no_log", "vars", "tags", "delegate_to", "run_once",
    "changed_when", "failed_when", "check_mode", "loop", "loop_control", "become", "environment",
    "ignore_errors", "until", "retries", "delay", "notify", "args", "block", "rescue", "always",
    "any_errors_fatal", "throttle", "diff", "listen",
}
# Options whose whole value is a Jinja expression without braces, and shown: debug's var.
BARE_EXPRESSIONS = {("debug", "var")}

JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def references(value, names: set[str], bare: bool = False) -> set[str]:
    """The names that the Jinja expressions in value use for their value: a name in a string
    literal (a message naming the variable) or asked only whether it is set is no use."""
    used = set()
    for text in strings_in(value):
        for expression in [text] if bare else JINJA.findall(text):
            expression = STRING_LITERAL.sub("''", expression)
            for name in names:
                rest = re.sub(rf"\b{name}\s*\|\s*length\s*>\s*0", "", expression)
                rest = re.sub(rf"\bif\s+{name}\b(?!\s*\|)", "", rest)
                if re.search(rf"\b{name}\b", rest):
                    used.add(name)
    return used


def secret_parameters() -> set[str]:
    """The roles' parameters their argument specs mark no_log: the playbooks pass the key in them."""
    names = set()
    for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        for entry in (yaml.safe_load(path.read_text())["argument_specs"] or {}).values():
            names |= {name for name, spec in (entry.get("options") or {}).items() if spec.get("no_log")}
    return names


def carriers() -> set[str]:
    """The variables whose value is the key or holds it: the key, the roles' secret parameters
    and, until nothing changes, every role variable that refers to one of them."""
    variables = {}
    for path in sorted(REPO.glob("roles/*/defaults/main.yml")) + sorted(REPO.glob("roles/*/vars/main.yml")):
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            variables[name] = value
    found = {KEY} | secret_parameters()
    while True:
        more = {name for name, value in variables.items() if name not in found and references(value, found)}
        if not more:
            return found
        found |= more


def no_log_options(module: str) -> set[str]:
    """The options of one of the collection's modules that its argument_spec marks no_log, or
    its action's (an action-only plugin such as engine_quality has no module code)."""
    options = set()
    for folder in ("modules", "action"):
        source = REPO / "plugins" / folder / f"{module}.py"
        if not source.exists():
            continue
        for call in ast.walk(ast.parse(source.read_text())):
            if isinstance(call, ast.keyword) and call.arg and isinstance(call.value, ast.Call):
                if any(keyword.arg == "no_log" and getattr(keyword.value, "value", None) is True
                       for keyword in call.value.keywords):
                    options.add(call.arg)
    return options


def tasks_of(tasks, where):
    for task in tasks or []:
        yield task, where
        for section in ("block", "rescue", "always"):
            yield from tasks_of(task.get(section), where)


def all_tasks():
    for path in sorted(REPO.glob("roles/*/tasks/*.yml")):
        yield from tasks_of(yaml.safe_load(path.read_text()), path.relative_to(REPO))
    for path in sorted(REPO.glob("playbooks/*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield from tasks_of(play.get(section), path.relative_to(REPO))


def exposures() -> list[str]:
    """Each task argument that carries the key into output: neither the task is no_log nor is
    the argument an option its module keeps out of output."""
    found = []
    names = carriers()
    for task, where in all_tasks():
        if task.get("no_log") is True:
            continue
        carrying = names | {name for name, value in (task.get("vars") or {}).items() if references(value, names)}
        action = next((key for key in task if key not in TASK_KEYWORDS), None)
        if action is None or action.endswith(("include_role", "import_role", "include_tasks", "import_tasks")):
            continue
        arguments = task[action] if isinstance(task[action], dict) else {"_raw_params": task[action]}
        module = action.rsplit(".", 1)[-1]
        hidden = no_log_options(module) if action.startswith("biv100.serving.") else set()
        for option, value in arguments.items():
            bare = (module, option) in BARE_EXPRESSIONS
            if option not in hidden and references(value, carrying, bare):
                found.append(f"{where}: {task.get('name')}: {action} {option}")
    return found


def test_the_key_and_the_variables_made_from_it_are_known():
    assert carriers() == {KEY, "engine_env_file_content", "probe_api_key", "gates_api_key", "canary_api_key",
                          "rollback_api_key", "tune_api_key"}


def test_every_task_that_carries_the_key_keeps_it_out_of_its_output():
    assert exposures() == []


def test_a_task_that_would_show_the_key_is_found(monkeypatch):
    leaking = [
        {"name": "Show the env file", "ansible.builtin.debug": {"msg": "{{ engine_env_file_content }}"}},
        {"name": "Show the token", "debug": {"var": "probe_api_key"}},
        {"name": "Start", "biv100.serving.engine_process": {"env_file_content": "{{ engine_env_file_content }}"}},
        {"name": "Say whether", "ansible.builtin.debug": {"msg": "{{ engine_api_key | length > 0 }}"}},
        {"name": "Hidden", "no_log": True, "ansible.builtin.debug": {"msg": "{{ engine_api_key }}"}},
    ]
    monkeypatch.setattr(sys.modules[__name__], "all_tasks", lambda: tasks_of(leaking, "leaking.yml"))

    assert exposures() == ["leaking.yml: Show the env file: ansible.builtin.debug msg",
                           "leaking.yml: Show the token: debug var"]
