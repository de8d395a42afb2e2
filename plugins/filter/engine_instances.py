# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""engine_instances: the engines a host runs, each with its name, port, GPU group and files.

A host runs one engine unless its inventory lists several in engine_instances (an 8-GPU host
holds two TP=4 engines, a 16-GPU one four). The one-engine default is built from the engine
role's own variables, so an inventory that never heard of instances renders exactly what it
rendered before: the same name, port, files and GPUs.

engine_instance_problems says, one sentence each naming host and instance, why a list cannot
run on a host: names or ports used twice, GPU groups that overlap, a group smaller than the
instance's tensor_parallel_size, GPUs the host does not have or that a foreign process holds.
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# A name becomes a pid file, a systemd unit and a supervisord program: plain characters only.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
KEYS = {"name", "port", "gpus", "env_file", "log_file", "engine_args"}
AUTO = "auto"


def engine_instances(instances, *, name: str, port: int, env_file: str, log_file: str,
                     visible_devices: str = "", engine_args: dict, gpus: dict | None = None) -> list[dict]:
    """Each instance with every value decided: name, port, gpus (the CUDA_VISIBLE_DEVICES text,
    "" when it is `auto` and the GPUs were not read), env_file, log_file and args (engine_args
    with the instance's own overrides).

    name, port, env_file, log_file, visible_devices and engine_args are the engine role's
    variables: the one instance of a host that lists none, and the defaults of a listed one
    (its port the role's plus its position; its files named after it beside the role's).
    """
    listed = _listed(instances)
    if not listed:
        listed = [{"name": name, "port": port, "gpus": visible_devices or AUTO,
                   "env_file": env_file, "log_file": log_file}]
    resolved = []
    for position, entry in enumerate(listed):
        instance_name = str(entry["name"])
        resolved.append({
            "name": instance_name,
            "port": entry.get("port", _int(port) + position),
            "gpus": entry.get("gpus", AUTO),
            "env_file": entry.get("env_file") or _beside(env_file, f"{instance_name}.env"),
            "log_file": entry.get("log_file") or _beside(log_file, f"{instance_name}.log"),
            "args": {**engine_args, **(entry.get("engine_args") or {})},
        })
    _place(resolved, gpus)
    return resolved


def engine_instance_problems(instances: list[dict], host: str, gpus: dict | None = None) -> list[str]:
    """Why the resolved instances cannot run on the host, one sentence each; [] when they can.
    Without GPU facts (a run that skips the engine phase) only names and ports are judged."""
    problems = []
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
    return problems + _gpu_problems(instances, host, gpus)


def _gpu_problems(instances: list[dict], host: str, gpus: dict) -> list[str]:
    problems = []
    owner: dict[int, str] = {}
    holders = {}
    for process in gpus.get("processes") or []:
        if not process.get("own"):
            holders.setdefault(process["gpu_index"], f"pid {process['pid']} ({process['name']})")
    for instance in instances:
        label = f"{host}/{instance['name']}"
        size = instance["args"].get("tensor_parallel_size", 1)
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
        size = instance["args"].get("tensor_parallel_size", 1)
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
        if not isinstance(entry.get("engine_args") or {}, dict):
            raise AnsibleFilterError(f"engine_instances[{position}] ({entry['name']}): engine_args is not a dict")
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
    """What a release records of its instances' `key` (engine, gates, summary), from
    {instance: {key: value}}: a host that lists no instance records its one engine's value as it
    always did; a host of several records {"instances": {name: value}} (a summary: one text
    naming each). None when no instance has a value."""
    values = {name: entry.get(key) for name, entry in (proven or {}).items() if entry.get(key) is not None}
    if not values:
        return None
    if not instances:
        return next(iter(values.values()))
    if key == "summary":
        return "; ".join(f"{name}: {value}" for name, value in values.items())
    return {"instances": values}


def instance_settings(engine: dict | None, name: str, instances=()) -> dict:
    """The settings one instance is restored with from a release record's engine: its own entry
    of a host of several, the record itself for the one engine of a host that lists none;
    {} when the record holds none for it (the inventory's then apply)."""
    engine = engine or {}
    if "instances" in engine:
        return engine["instances"].get(name) or {}
    return {} if instances else engine


class FilterModule:
    def filters(self):
        return {"engine_instances": engine_instances, "engine_instance_problems": engine_instance_problems,
                "instance_record": instance_record, "instance_settings": instance_settings}
