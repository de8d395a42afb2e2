# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The engine instances of a host, each one complete value that every phase takes as it is.

A host runs one engine unless its inventory lists several in engine_instances (an 8-GPU host
holds two TP=4 engines, a 16-GPU one four); a host that lists none runs the one engine of the
engine role's variables, a list of one like any other. Each value carries everything the
engine, probe, gates, rollback and verify phases need, decided here once: name, label, port,
URL, GPU group, files, the command line, the environment (the clients' key aside: it is added
to the env file by the engine role alone, so that no fact, record or log carries it), the
settings a release records and the platform's run file.

A release records each instance's settings and its place on the host (port, GPUs, files), so a
rollback restores the layout the release ran, whatever the inventory lists now.

engine_instance_problems says, one sentence each, why the values cannot run on a host: their
arguments and allocator options, names or ports used twice, GPU groups that overlap, a group
smaller than the instance's tensor_parallel_size, GPUs the host does not have or that a
foreign process holds, a port a foreign process listens on.

engine_start_order puts first the instances that no other running engine of the collection's
stands in the way of, so that a host changing its layout keeps serving on the old engines while
the new ones that need nothing of theirs start.
"""

from __future__ import annotations

import re

import yaml
from ansible.errors import AnsibleFilterError
from ansible.parsing.yaml.dumper import AnsibleDumper

from ansible_collections.biv100.serving.plugins.plugin_utils._allocator_conf import allocator_conf, allocator_conf_problems
from ansible_collections.biv100.serving.plugins.plugin_utils._computility_run import computility_run
from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import engine_args_problems, engine_cli_args

# A name becomes a pid file, a systemd unit and a supervisord program: plain characters only.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
KEYS = {"name", "port", "gpus", "env_file", "log_file", "engine_args", "engine_env"}
AUTO = "auto"
# The engine role's variables the values are made from (engine_instance_defaults).
ENGINE_KEYS = {"name", "port", "env_file", "log_file", "visible_devices", "args", "allocator", "env",
               "allow_long_max_model_len", "api_key_set", "model_path", "served_model_name", "host",
               "tool_call_parser", "reasoning_parser", "command"}
# What a release records of an instance's settings, and a rollback to it brings back.
RECORDED = ("args", "allocator", "env", "visible_devices", "allow_long_max_model_len")
# What a release records of an instance's place on the host: with the names of its record, the
# layout a rollback to it restores. gpus is the CUDA_VISIBLE_DEVICES it ran with.
PLACE = ("port", "gpus", "env_file", "log_file")
# Launch arguments the role decides: the platform's run file lists them apart from engine_args.
LAUNCH = ("model", "served_model_name", "host", "port")
SECRET_ENV = "VLLM_API_KEY"
# How much of a foreign listener's command line a problem shows.
COMMAND_CHARS = 160


def engine_instances(instances, host: str, engine: dict, gpus: dict | None = None,
                     restore: dict | None = None) -> list[dict]:
    """The host's instances, each a complete value (see the filter's documentation for its keys).

    engine holds the engine role's variables (engine_instance_defaults): the one instance of a
    host that lists none, and the defaults of a listed one (its port the role's plus its
    position; its files named after it beside the role's). gpus are the host's GPU facts, for
    `auto` groups; restore is a release record's engine: the instances it names, each in the
    place and with the settings recorded for it, instead of the inventory's (a record that names
    none holds the settings of the one engine of its host).
    """
    missing = sorted(ENGINE_KEYS - set(engine or {}))
    if missing:
        raise AnsibleFilterError(f"engine_instances: the engine's {', '.join(missing)} not given")
    listed = _listed(instances)
    recorded = _recorded_layout(restore, listed)
    if recorded:
        listed = recorded
    elif listed and engine["visible_devices"]:
        raise AnsibleFilterError(
            f"{host}: engine_visible_devices applies to the one engine of a host that lists no instance: "
            "give each of engine_instances its gpus")
    if not listed:
        listed = [{"name": engine["name"], "port": engine["port"], "gpus": AUTO,
                   "env_file": engine["env_file"], "log_file": engine["log_file"]}]
    resolved = []
    for position, entry in enumerate(listed):
        name = str(entry["name"])
        settings = {**{key: engine[key] for key in RECORDED},
                    "args": {**engine["args"], **(entry.get("engine_args") or {})},
                    "env": {**engine["env"], **(entry.get("engine_env") or {})}}
        settings.update({key: value for key, value in recorded_instance(restore, name).items() if key in RECORDED})
        resolved.append({
            "name": name,
            "label": host if len(listed) == 1 else f"{host}/{name}",
            "port": entry.get("port", _int(engine["port"]) + position),
            "gpus": settings["visible_devices"] or entry.get("gpus", AUTO),
            "env_file": entry.get("env_file") or _beside(engine["env_file"], f"{name}.env"),
            "log_file": entry.get("log_file") or _beside(engine["log_file"], f"{name}.log"),
            "settings": settings,
        })
    _place(resolved, gpus)
    return [_complete(instance, engine) for instance in resolved]


def instance_with(instance: dict, settings: dict | None = None, place: dict | None = None,
                  name: str | None = None, label: str | None = None) -> dict:
    """The instance made again with other settings (any of RECORDED, each replaced whole: a key
    of engine_args left out is unset) or another place (PLACE), as engine_instances makes it.

    An instance carries all it was made from (its command before the arguments, the model, the
    parsers, whether a key is required), so a candidate of the tuner or an instance a release
    recorded is made from the host's value alone, never from the inventory again. How many GPUs
    placement left free (free_left, for the facts' problems) is not carried.
    """
    record, full_args = instance["record"], instance["full_args"]
    base_command = instance["command"][:len(instance["command"]) - len(engine_cli_args(full_args))]
    engine = {"model_path": full_args["model"], "served_model_name": full_args["served_model_name"],
              "host": full_args["host"], "tool_call_parser": full_args["tool_call_parser"],
              "reasoning_parser": full_args["reasoning_parser"], "command": base_command,
              "api_key_set": record["api_key_set"]}
    chosen = {**{key: record[key] for key in RECORDED},
              **{key: value for key, value in (settings or {}).items() if key in RECORDED and value is not None}}
    where = {**{key: record[key] for key in PLACE},
             **{key: value for key, value in (place or {}).items() if key in PLACE and value not in (None, "")}}
    made = {"name": name or instance["name"], "label": label or instance["label"], **where,
            "gpus": chosen["visible_devices"] or where["gpus"], "settings": chosen}
    # Its GPUs are named now, as a release records them: the group they make, as _place gives it.
    made["group"] = _group(made)
    return _complete(made, engine)


def restored_instances(instances: list[dict], restore: dict | None) -> list[dict]:
    """The host's instances as a release record ran them: the instances it names, each with the
    place and settings recorded for it (the host's instance of that name, else its first, gives
    what the record lacks); the host's instances themselves when it names none."""
    recorded = (restore or {}).get("instances") or {}
    if not recorded or not instances:
        return list(instances)
    if not isinstance(recorded, dict):
        raise AnsibleFilterError(f"engine_restore.instances is {type(recorded).__name__}: a mapping of instance names")
    host = str(instances[0]["label"]).split("/", maxsplit=1)[0]
    by_name = {instance["name"]: instance for instance in instances}
    return [instance_with(by_name.get(str(name), instances[0]), entry, entry, name=str(name),
                          label=host if len(recorded) == 1 else f"{host}/{name}")
            for name, entry in recorded.items()]


def _recorded_layout(restore: dict | None, listed: list[dict]) -> list[dict]:
    """The instances a release record names, each in the place recorded for it; the inventory's
    entry of the same name stands in for what the record lacks."""
    recorded = (restore or {}).get("instances") or {}
    if not isinstance(recorded, dict):
        raise AnsibleFilterError(f"engine_restore.instances is {type(recorded).__name__}: a mapping of instance names")
    inventory = {str(entry["name"]): entry for entry in listed}
    layout = []
    for name, entry in recorded.items():
        place = {key: (entry or {}).get(key) for key in PLACE if (entry or {}).get(key) not in (None, "")}
        layout.append({**{key: value for key, value in inventory.get(name, {}).items() if key in PLACE},
                       **place, "name": name})
    return layout


def _complete(instance: dict, engine: dict) -> dict:
    """The instance with what the phases derive from its settings: URL, command line,
    environment, the release record and the platform's run file."""
    settings = instance.pop("settings")
    # A key given as an argument or a variable reaches no command line, record or run file: the
    # problems name it instead.
    args = {key: value for key, value in settings["args"].items() if key != "api_key"}
    env = {key: value for key, value in settings["env"].items() if key != SECRET_ENV}
    launch = {"model": engine["model_path"], "served_model_name": engine["served_model_name"],
              "host": engine["host"], "port": instance["port"]}
    full_args = {**args, **launch, "enable_auto_tool_choice": True,
                 "tool_call_parser": engine["tool_call_parser"], "reasoning_parser": engine["reasoning_parser"]}
    platform_env = {"PYTORCH_CUDA_ALLOC_CONF": allocator_conf(settings["allocator"]),
                    **({"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"} if settings["allow_long_max_model_len"] else {}),
                    **env}
    document = computility_run(
        {key: value for key, value in full_args.items() if key not in LAUNCH}, platform_env,
        model_path=engine["model_path"], served_model_name=engine["served_model_name"],
        port=instance["port"], host=engine["host"], secret_env=[SECRET_ENV] if engine["api_key_set"] else [])
    return {
        **instance,
        "url": f"http://127.0.0.1:{instance['port']}",
        "served_model_name": engine["served_model_name"],
        "command": list(engine["command"]) + engine_cli_args(full_args),
        "env": {**platform_env, "CUDA_VISIBLE_DEVICES": instance["gpus"]},
        # Whether the engine requires a key, never the key: a release record says it was
        # proven with one, and a restored engine takes the current one.
        "record": {**settings, "args": args, "env": env, "api_key_set": bool(engine["api_key_set"]),
                   **{key: instance[key] for key in PLACE},
                   "platform_run": yaml.dump(document, Dumper=AnsibleDumper, indent=2, allow_unicode=True,
                                             default_flow_style=False, sort_keys=False)},
        "full_args": full_args,
        "problems": _secret_problems(settings),
    }


def _secret_problems(settings: dict) -> list[str]:
    """The clients' key goes only through engine_api_key, which reaches the env file alone: as an
    argument it would be on the command line any user of the host can read, as an engine_env
    variable in the release record and the platform's run file."""
    problems = []
    if "api_key" in settings["args"]:
        problems.append("engine_args.api_key would put the clients' key on the engine's command line: "
                        "set engine_api_key (in Ansible Vault) instead")
    if SECRET_ENV in settings["env"]:
        problems.append("engine_env.VLLM_API_KEY would record the key with the release and in the platform's "
                        "run file: set engine_api_key (in Ansible Vault) instead")
    return problems


def engine_instance_problems(instances: list[dict], host: str, gpus: dict | None = None,
                             vllm: dict | None = None) -> list[str]:
    """Why the instances cannot run on the host, one sentence each; [] when they can. Without GPU
    facts (a run that skips the engine phase) the GPUs are not judged; with the host's vLLM facts
    (vllm_facts) the arguments are judged against its CLI and its model."""
    problems = []
    for instance in instances:
        prefix = "" if instance["label"] == host else f"{instance['label']}: "
        problems += [prefix + problem for problem in _argument_problems(instance, gpus, vllm)]
        problems += [problem for problem in instance["problems"] + allocator_conf_problems(instance["record"]["allocator"])
                     if problem not in problems]
    for key in ("name", "port"):
        seen: dict = {}
        for instance in instances:
            value = instance[key]
            if value in seen:
                problems.append(f"{host}/{instance['name']}: {key} {value} is also {host}/{seen[value]}'s")
            seen.setdefault(value, instance["name"])
    for instance in instances:
        label = f"{host}/{instance['name']}"
        if not NAME.fullmatch(instance["name"]):
            problems.append(f"{label}: an instance's name is letters, digits, '_', '.' and '-'")
        if not isinstance(instance["port"], int) or isinstance(instance["port"], bool) or not 0 < instance["port"] < 65536:
            problems.append(f"{label}: port {instance['port']!r} is not a TCP port")
    if gpus is None:
        return problems
    return problems + _gpu_problems(instances, host, gpus) + _port_problems(instances, host, gpus)


def _port_problems(instances: list[dict], host: str, gpus: dict) -> list[str]:
    """An instance's port some process listens on that is none of the collection's engines (they
    make way for the instance as it starts)."""
    foreign: dict = {}
    for listener in gpus.get("ports") or []:
        if not listener.get("own"):
            foreign.setdefault(listener["port"], listener)
    problems = []
    for instance in instances:
        listener = foreign.get(instance["port"])
        if listener:
            problems.append(f"{host}/{instance['name']}: port {instance['port']} held by another process: "
                            f"{_listener(listener)}")
    return problems


def _listener(listener: dict) -> str:
    if listener.get("pid") is None:
        return (f"a process the host would not name (listening on {listener['address']}; "
                "its descriptors need root to read)")
    command = listener.get("command") or "?"
    if len(command) > COMMAND_CHARS:
        command = command[:COMMAND_CHARS - 3] + "..."
    return f"pid {listener['pid']} ({command})"


def engine_start_order(instances: list[dict], gpus: dict | None = None) -> list[dict]:
    """The instances in the order to start them: first those no other running engine of the
    collection's (gpu_facts' engines) holds the port or a GPU of, then the others, each group in
    the order given."""
    engines = (gpus or {}).get("engines") or []

    def in_the_way(instance):
        group = set(instance.get("group") or [])
        return any(engine["name"] != instance["name"]
                   and (instance["port"] in engine.get("ports", []) or group & set(engine.get("gpus", [])))
                   for engine in engines)

    return ([instance for instance in instances if not in_the_way(instance)]
            + [instance for instance in instances if in_the_way(instance)])


def _argument_problems(instance: dict, gpus: dict | None, vllm: dict | None) -> list[str]:
    model = (vllm or {}).get("model") or {}
    return engine_args_problems(
        instance["full_args"],
        gpus_free=len(gpus["free"]) if gpus is not None else None,
        max_position_embeddings=model.get("max_position_embeddings"),
        allow_long_max_model_len=instance["record"]["allow_long_max_model_len"],
        known_flags=((vllm or {}).get("cli") or {}).get("arguments"))


def _gpu_problems(instances: list[dict], host: str, gpus: dict) -> list[str]:
    problems = []
    owner: dict[int, str] = {}
    holders = {}
    for process in gpus.get("processes") or []:
        if not process.get("own"):
            holders.setdefault(process["gpu_index"], f"pid {process['pid']} ({process['name']})")
    for instance in instances:
        label = f"{host}/{instance['name']}"
        size = instance["record"]["args"].get("tensor_parallel_size", 1)
        group = instance["group"]
        if group is None and instance.get("free_left") is None:
            continue  # GPUs named by UUID: the host's own runtime judges them
        if group is None:
            problems.append(f"{label}: tensor_parallel_size is {size} but only {instance['free_left']} "
                            f"free GPU{'s are' if instance['free_left'] != 1 else ' is'} left for it "
                            f"(gpus: auto); held: {_held(holders) or 'none'}")
            continue
        missing = [index for index in group if index >= gpus["count"]]
        if missing:
            problems.append(f"{label}: GPU {_indexes(missing)} not on the host, which has {gpus['count']}")
        if len(group) < size:
            problems.append(f"{label}: tensor_parallel_size is {size} but its GPU group {_indexes(group)} "
                            f"has {len(group)}")
        shared = [index for index in group if index in owner]
        if shared:
            problems.append(f"{label}: GPU {_indexes(shared)} also in {host}/{owner[shared[0]]}'s group")
        held = [index for index in group if index in holders]
        if held:
            problems.append(f"{label}: GPU {_indexes(held)} held by another process: "
                            + ", ".join(f"GPU {index} by {holders[index]}" for index in held))
        for index in group:
            owner.setdefault(index, instance["name"])
    return problems


def _place(instances: list[dict], gpus: dict | None) -> None:
    """Give each `auto` instance the next tensor_parallel_size free GPUs in index order, after
    the GPUs named by the others; set each instance's group (None when too few are left)."""
    named = set()
    for instance in instances:
        if instance["gpus"] != AUTO:
            instance["group"] = _group(instance)
            named.update(instance["group"] or ())
    free = [index for index in (gpus or {}).get("free", []) if index not in named]
    for instance in instances:
        if instance["gpus"] != AUTO:
            # Text is kept as written: it is the engine's CUDA_VISIBLE_DEVICES.
            if not isinstance(instance["gpus"], str):
                instance["gpus"] = ",".join(str(index) for index in instance["group"])
            continue
        size = instance["settings"]["args"].get("tensor_parallel_size", 1)
        instance["free_left"] = len(free)
        if gpus is None:
            instance.update(gpus="", group=[])
        elif len(free) < size:
            instance.update(gpus="", group=None)
        else:
            taken, free = free[:size], free[size:]
            instance.update(gpus=",".join(str(index) for index in taken), group=taken)


def _group(instance: dict) -> list[int] | None:
    """The GPU indexes an instance names; None for CUDA_VISIBLE_DEVICES text of other forms
    (GPU UUIDs), which is passed on as written and cannot be checked against the host's."""
    value = instance["gpus"]
    if isinstance(value, str):
        items = value.split(",")
        if not all(item.strip().isdigit() for item in items):
            return None
    elif isinstance(value, list) and all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        items = value
    else:
        raise AnsibleFilterError(
            f"instance {instance['name']}: gpus is {value!r}; give auto, GPU indexes as a list, or "
            "CUDA_VISIBLE_DEVICES text (0,1,2,3)")
    return [int(str(item).strip()) for item in items]


def _listed(instances) -> list[dict]:
    if instances in (None, "", []):
        return []
    if not isinstance(instances, list):
        raise AnsibleFilterError(f"engine_instances is {type(instances).__name__}: a list of instances")
    for position, entry in enumerate(instances, 1):
        if not isinstance(entry, dict) or "name" not in entry:
            raise AnsibleFilterError(f"engine_instances[{position}] needs at least a name")
        unknown = sorted(set(entry) - KEYS)
        if unknown:
            raise AnsibleFilterError(f"engine_instances[{position}] ({entry['name']}): unknown key "
                                     f"{', '.join(unknown)}; an instance takes {', '.join(sorted(KEYS))}")
        for key in ("engine_args", "engine_env"):
            if not isinstance(entry.get(key) or {}, dict):
                raise AnsibleFilterError(f"engine_instances[{position}] ({entry['name']}): {key} is not a dict")
    return instances


def _beside(path: str, name: str) -> str:
    folder = path.rpartition("/")[0]
    return f"{folder}/{name}" if folder else name


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"engine_port is {value!r}, not a port number") from None


def _indexes(indexes) -> str:
    return ",".join(str(index) for index in indexes)


def _held(holders: dict) -> str:
    return ", ".join(f"GPU {index} by {holder}" for index, holder in sorted(holders.items()))


def instance_record(proven: dict, key: str, instances=()):
    """What a release records of its instances' `key` from {instance: {key: value}}: for engine
    and gates, {"instances": {name: value}}; for the summary, one text (each instance's named
    when the host runs several). None when no instance has a value."""
    values = {name: entry.get(key) for name, entry in (proven or {}).items() if entry.get(key) is not None}
    if not values:
        return None
    if key != "summary":
        return {"instances": values}
    if len(instances) <= 1:
        return "; ".join(values.values())
    return "; ".join(f"{name}: {value}" for name, value in values.items())


def recorded_instance(part: dict | None, name: str) -> dict:
    """One instance's entry in a part of a release record (engine, gates: {"instances": {name:
    ...}}); {} when the record holds nothing for it."""
    return ((part or {}).get("instances") or {}).get(name) or {}
