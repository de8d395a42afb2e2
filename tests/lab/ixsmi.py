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

The memory used that is reported is the configured `memory_used_mib` as is: whoever adds a
compute process also decides how much memory the GPU then shows as used.
"""

import json
import os
import sys

CONFIG_NAME = "ixsmi-lab.json"

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
        config = load_config()
        gpus, processes = config["gpus"], config.get("compute_processes", [])
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
