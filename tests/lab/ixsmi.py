#!/usr/bin/python3
# The biv100.serving test lab's stand-in for Iluvatar's `ixsmi`, not the vendor's tool.
# The lab installs it as /usr/local/corex/bin/ixsmi on every lab host; it reports the GPUs
# described by ixsmi-lab.json in the CoreX prefix (the folder above bin/).
"""An nvidia-smi-like GPU report read from a JSON file instead of a driver.

Supported, in nvidia-smi's output formats:

    ixsmi                                        a small status table
    ixsmi -h                                     this text
    ixsmi -L                                     one line per GPU
    ixsmi --query-gpu=FIELDS --format=csv[,noheader][,nounits]
    ixsmi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]

The JSON file (written by tests/lab/lab.py, editable by tests):

    {"gpus": [{"index": 0, "name": "Iluvatar BI-V100", "uuid": "GPU-...",
               "memory_total_mib": 32768, "memory_used_mib": 0,
               "utilization_gpu_pct": 0, "temperature_gpu_c": 34}],
     "compute_processes": [{"gpu_uuid": "GPU-...", "pid": 1234,
                            "process_name": "python3", "used_memory_mib": 30000}]}

Besides the compute processes the file lists, every running engine stand-in of this host
(tests/lab/engine_standin) is a compute process, as each worker of a real engine is: found in
/proc at every call, so a stand-in that ended is never shown. A stand-in is this host's when it
is in this tool's mount namespace (each lab host has its own) and the ixsmi it counts GPUs with
(BIV100_STANDIN_IXSMI, default /usr/local/corex/bin/ixsmi) is this one. It holds the first
--tensor-parallel-size GPUs of its CUDA_VISIBLE_DEVICES (indexes or UUIDs; all GPUs when unset;
an entry naming no GPU hides it and the rest, as in CUDA), each with

    used_memory_mib = int(gpu_memory_utilization x memory_total_mib)

(--gpu-memory-utilization, vLLM's default 0.9), under its pid and its argv[0]. It is one
process standing for the server and its workers, so one pid shows on each GPU it holds.

A GPU's memory used is the configured `memory_used_mib` (whoever adds a compute process to the
file also decides how much memory the GPU then shows as used) plus what the stand-ins on it
hold, at most its memory total.
"""

import json
import os
import sys

CONFIG_NAME = "ixsmi-lab.json"

# What tells an engine stand-in's process, and what it reads (engine_standin/__init__.py).
STANDIN_MODULE = "engine_standin"
STANDIN_IXSMI = "/usr/local/corex/bin/ixsmi"
# vLLM's defaults for the launch arguments that decide the GPUs and memory an engine holds.
DEFAULT_TENSOR_PARALLEL_SIZE = 1
DEFAULT_MEMORY_UTILIZATION = 0.9
# /proc/<pid>/stat states of a process that has ended: zombie, dead.
ENDED_STATES = ("Z", "X")

# Exit statuses of nvidia-smi that callers may test for.
EXIT_INVALID_ARGUMENT = 2
EXIT_NO_DEVICES = 6

TABLE_WIDTH = 75  # characters inside the status table's borders

# field -> (CSV header, unit, value of a GPU)
GPU_FIELDS = {
    "index": ("index", "", lambda gpu: gpu["index"]),
    "name": ("name", "", lambda gpu: gpu["name"]),
    "uuid": ("uuid", "", lambda gpu: gpu["uuid"]),
    "memory.total": ("memory.total [MiB]", "MiB", lambda gpu: gpu["memory_total_mib"]),
    "memory.used": ("memory.used [MiB]", "MiB", lambda gpu: gpu["memory_used_mib"]),
    "memory.free": (
        "memory.free [MiB]", "MiB", lambda gpu: gpu["memory_total_mib"] - gpu["memory_used_mib"]
    ),
    "utilization.gpu": ("utilization.gpu [%]", "%", lambda gpu: gpu["utilization_gpu_pct"]),
    "temperature.gpu": ("temperature.gpu", "", lambda gpu: gpu["temperature_gpu_c"]),
}

# field -> (CSV header, unit, value of a compute process)
PROCESS_FIELDS = {
    "gpu_uuid": ("gpu_uuid", "", lambda proc: proc["gpu_uuid"]),
    "pid": ("pid", "", lambda proc: proc["pid"]),
    "process_name": ("process_name", "", lambda proc: proc["process_name"]),
    "used_memory": ("used_gpu_memory [MiB]", "MiB", lambda proc: proc["used_memory_mib"]),
}


class UsageError(Exception):
    pass


def load_config():
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    with open(os.path.join(prefix, CONFIG_NAME)) as config:
        return json.load(config)


# ---- the engine stand-ins running on this host -------------------------------------------

def standin_processes(gpus, ixsmi_path):
    """A compute process per GPU that a running stand-in of this host holds, in pid order."""
    processes = []
    for pid, argv, environ in running_standins(ixsmi_path):
        memory_utilization = option_value(argv, "--gpu-memory-utilization", float,
                                          DEFAULT_MEMORY_UTILIZATION)
        size = option_value(argv, "--tensor-parallel-size", int, DEFAULT_TENSOR_PARALLEL_SIZE,
                            "-tp")
        for gpu in visible_gpus(environ.get("CUDA_VISIBLE_DEVICES"), gpus)[:size]:
            processes.append({
                "gpu_uuid": gpu["uuid"], "pid": pid, "process_name": argv[0],
                "used_memory_mib": int(memory_utilization * gpu["memory_total_mib"]),
            })
    return processes


def running_standins(ixsmi_path):
    """(pid, argv, environment) of each live stand-in that counts GPUs with this ixsmi, in this
    mount namespace. A process that ends while it is read, or that may not be read, is left out."""
    own_namespace = os.stat("/proc/self/ns/mnt")
    this_ixsmi = os.path.realpath(ixsmi_path)
    found = []
    for entry in sorted((name for name in os.listdir("/proc") if name.isdigit()), key=int):
        try:
            argv = read_nul_separated(f"/proc/{entry}/cmdline")
            if not runs_standin(argv) or process_state(entry) in ENDED_STATES:
                continue
            namespace = os.stat(f"/proc/{entry}/ns/mnt")
            environ = dict(item.split("=", 1) for item in read_nul_separated(f"/proc/{entry}/environ")
                           if "=" in item)
        except OSError:
            continue
        same_namespace = (namespace.st_dev, namespace.st_ino) == (own_namespace.st_dev, own_namespace.st_ino)
        if same_namespace and os.path.realpath(environ.get("BIV100_STANDIN_IXSMI", STANDIN_IXSMI)) == this_ixsmi:
            found.append((int(entry), argv, environ))
    return found


def read_nul_separated(path):
    """The NUL-terminated strings of a /proc file (cmdline, environ)."""
    with open(path, "rb") as stream:
        return [item.decode("utf-8", "surrogateescape") for item in stream.read().split(b"\0")[:-1]]


def process_state(pid):
    with open(f"/proc/{pid}/stat", "rb") as stream:
        raw = stream.read()
    # The command name in parentheses may hold spaces and parentheses itself.
    return raw[raw.rindex(b")") + 2:].split()[0].decode("ascii")


def runs_standin(argv):
    """`<python> -m engine_standin ...`, as the lab's engine_command starts it."""
    return any(argv[index:index + 2] == ["-m", STANDIN_MODULE] for index in range(1, len(argv)))


def option_value(argv, name, convert, default, *aliases):
    """The last value given to option `name` or an alias (`--name value` or `--name=value`,
    `_` for `-` as vLLM allows), converted; the default when absent or not a number."""
    value = None
    for index, word in enumerate(argv):
        option, equals, given = word.partition("=")
        if option.startswith("--"):
            option = "--" + option[2:].replace("_", "-")
        if option == name or option in aliases:
            value = given if equals else (argv[index + 1] if index + 1 < len(argv) else None)
    try:
        return convert(value) if value is not None else default
    except ValueError:
        return default


def visible_gpus(cuda_visible_devices, gpus):
    """The GPUs CUDA_VISIBLE_DEVICES makes visible, in its order: each entry an index or a UUID
    (or its start); the first entry naming no GPU hides itself and every entry after it."""
    if cuda_visible_devices is None:
        return list(gpus)
    visible = []
    for entry in (item.strip() for item in cuda_visible_devices.split(",")):
        matches = [gpu for gpu in gpus
                   if entry and (entry == str(gpu["index"]) or gpu["uuid"].startswith(entry))]
        if len(matches) != 1 or matches[0] in visible:
            break
        visible.append(matches[0])
    return visible


def with_standins(config, ixsmi_path):
    """The GPUs and compute processes of the file, with the stand-ins' processes and memory."""
    gpus = [dict(gpu) for gpu in config["gpus"]]
    standins = standin_processes(gpus, ixsmi_path)
    for gpu in gpus:
        held = sum(proc["used_memory_mib"] for proc in standins if proc["gpu_uuid"] == gpu["uuid"])
        gpu["memory_used_mib"] = min(gpu["memory_total_mib"], gpu["memory_used_mib"] + held)
    return gpus, config.get("compute_processes", []) + standins


def parse_args(argv):
    """Return (mode, fields, format options); nvidia-smi's `--opt=value` spelling only."""
    mode, fields, formats = "table", [], None
    for arg in argv:
        name, _equals, value = arg.partition("=")
        if arg in ("-h", "--help"):
            mode = "help"
        elif arg in ("-L", "--list-gpus"):
            mode = "list"
        elif name in ("--query-gpu", "--query-compute-apps"):
            mode = name[len("--query-"):]
            fields = [field.strip() for field in value.split(",") if field.strip()]
        elif name == "--format":
            formats = [option.strip() for option in value.split(",")]
        else:
            raise UsageError(f'Invalid combination of input arguments: "{arg}"')
    if mode in ("gpu", "compute-apps"):
        if formats is None or "csv" not in formats:
            raise UsageError('"--format=csv" must be given with a --query-* option.')
        unknown = set(formats) - {"csv", "noheader", "nounits"}
        if unknown:
            raise UsageError(f'"{sorted(unknown)[0]}" is not a valid format option.')
    return mode, fields, formats or []


def csv_report(rows, fields, known_fields, formats):
    for field in fields:
        if field not in known_fields:
            raise UsageError(f'Field "{field}" is not a valid field to query.')
    lines = []
    if "noheader" not in formats:
        lines.append(", ".join(known_fields[field][0] for field in fields))
    for row in rows:
        cells = []
        for field in fields:
            _header, unit, value_of = known_fields[field]
            value = str(value_of(row))
            cells.append(value if not unit or "nounits" in formats else f"{value} {unit}")
        lines.append(", ".join(cells))
    return lines


def gpu_list(gpus):
    return [f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})" for gpu in gpus]


def status_table(gpus, processes):
    rule = "+" + "-" * (TABLE_WIDTH + 2) + "+"
    lines = [
        rule,
        boxed("IXSMI (biv100 lab stand-in)"),
        rule,
        boxed(f"{'GPU':>3}  {'Name':<24}{'Memory-Usage':>22}{'GPU-Util':>12}{'Temp':>8}"),
        rule,
    ]
    for gpu in gpus:
        memory = f"{gpu['memory_used_mib']}MiB / {gpu['memory_total_mib']}MiB"
        lines.append(boxed(
            f"{gpu['index']:>3}  {gpu['name']:<24}{memory:>22}"
            f"{gpu['utilization_gpu_pct']:>11}%{gpu['temperature_gpu_c']:>7}C"
        ))
    lines += [
        rule,
        boxed("Processes:"),
        boxed(f"{'GPU':>3}  {'PID':>8}  {'Process name':<40}{'GPU Memory':>17}"),
    ]
    index_of = {gpu["uuid"]: gpu["index"] for gpu in gpus}
    for proc in processes:
        lines.append(boxed(
            f"{index_of.get(proc['gpu_uuid'], '?'):>3}  {proc['pid']:>8}  "
            f"{proc['process_name']:<40}{proc['used_memory_mib']:>14}MiB"
        ))
    if not processes:
        lines.append(boxed("No running processes found"))
    lines.append(rule)
    return lines


def boxed(text):
    return f"| {text:<{TABLE_WIDTH}} |"


def main(argv):
    try:
        mode, fields, formats = parse_args(argv)
        if mode == "help":
            print(__doc__)
            return 0
        gpus, processes = with_standins(load_config(), __file__)
        if not gpus:
            print("No devices were found")
            return EXIT_NO_DEVICES
        if mode == "list":
            lines = gpu_list(gpus)
        elif mode == "gpu":
            lines = csv_report(gpus, fields, GPU_FIELDS, formats)
        elif mode == "compute-apps":
            lines = csv_report(processes, fields, PROCESS_FIELDS, formats)
        else:
            lines = status_table(gpus, processes)
    except UsageError as error:
        print(error)
        print("Please run 'ixsmi --help' for usage information.")
        return EXIT_INVALID_ARGUMENT
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
