#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Report the GPUs and TCP ports of a host, what holds them, and the collection's engines
description:
  - Runs C(ixsmi), the CoreX counterpart of C(nvidia-smi), twice (GPU query and compute-process
    query) and parses its CSV output into a list of GPUs.
  - Lists the collection's running engines (RV(gpu_facts.engines)) and every TCP port the host
    listens on with the process holding it (RV(gpu_facts.ports)), read from C(/proc), so that an
    engine's GPUs and port held by one of the collection's own engines are told from those a
    foreign process holds.
  - Read-only; never changes anything on the host.
version_added: "0.1.0"
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  ixsmi_path:
    description:
      - Path of the C(ixsmi) executable.
      - When omitted, the usual CoreX locations are tried, then E(PATH).
    type: path
  search_paths:
    description:
      - Locations tried, in order, when O(ixsmi_path) is omitted.
    type: list
    elements: path
    default:
      - /usr/local/corex/bin/ixsmi
      - /usr/local/corex/bin64/ixsmi
  own_pid_file:
    description:
      - The pid files of the collection's own engines (M(biv100.serving.engine_process)); by
        default every C(*.pid) file in C(/run/biv100-serving), where it keeps the pid file of
        each engine it starts, so that an engine the inventory no longer names is still known
        as the collection's.
      - A pid file names the collection's engine when its process is the one its launch record
        C(<name>.json) beside it describes (same pid and start time), so a pid reused by another
        process is never taken for an engine.
      - Each engine runs in a process group of its own; GPU processes in that group are the
        engine's workers, marked C(own) and named by C(instance) (the pid file's name without
        C(.pid)), and do not make their GPU busy, so a redeploy finds the GPUs its running
        engines hold still available to them. The ports they listen on are marked the same way.
    type: list
    elements: path
    aliases: [own_pid_files]
    version_added: 0.2.0
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
    details:
      - Reads only, so check mode runs it unchanged.
  diff_mode:
    support: none
    details:
      - Changes nothing, so there is no diff.
  facts:
    support: full
    details:
      - Needs the CoreX C(ixsmi) tool on the host.
notes:
  - When C(ixsmi) cannot list compute processes, RV(gpu_facts.processes_supported) is false and
    every GPU counts as free.
seealso:
  - module: biv100.serving.vllm_facts
"""

EXAMPLES = r"""
- name: Learn the GPUs of the host
  biv100.serving.gpu_facts:

- name: Use an ixsmi from a non-standard SDK prefix
  biv100.serving.gpu_facts:
    ixsmi_path: /opt/corex-4.3.0/bin/ixsmi

- name: Refuse a host with fewer free GPUs than the tensor-parallel size
  ansible.builtin.assert:
    that: ansible_facts.gpu_facts.free | length >= 4
    fail_msg: "only {{ ansible_facts.gpu_facts.free | length }} free GPUs"
"""

RETURN = r"""
gpu_facts:
  description: What C(ixsmi) reports. Also returned under C(ansible_facts).
  returned: success
  type: dict
  contains:
    ixsmi:
      description: The C(ixsmi) that was run.
      type: str
      sample: /usr/local/corex/bin/ixsmi
    count:
      description: Number of GPUs.
      type: int
      sample: 4
    gpus:
      description: One entry per GPU, in index order.
      type: list
      elements: dict
      sample:
        - index: 0
          name: Iluvatar BI-V100
          uuid: GPU-5b3c2f9e-0000-4000-8000-000000000000
          memory_total_mib: 32768
          memory_used_mib: 0
          utilization_pct: 0
          processes: []
    free:
      description: Indexes of the GPUs no compute process holds, but the collection's own engine.
      type: list
      elements: int
      sample: [0, 1, 2, 3]
    processes:
      description: Every compute process on any GPU, with the index of its GPU.
      type: list
      elements: dict
      sample:
        - gpu_index: 0
          pid: 4242
          name: python3
          used_memory_mib: 30512
          own: false
          instance: null
    processes_supported:
      description: Whether C(ixsmi) answered the compute-process query.
      type: bool
      sample: true
    engines:
      description:
        - The collection's running engines (those of O(own_pid_file)), by name.
        - C(ports) are the TCP ports its processes listen on; C(gpus) the indexes of the GPUs its
          C(CUDA_VISIBLE_DEVICES) names (as indexes or UUIDs; every GPU when it is unset), and
          C(visible_devices) that value as the engine has it (null when unset).
        - C(manager) is what runs it (the launch record's C(systemd), C(supervisord) or
          C(pidfile)).
      type: list
      elements: dict
      version_added: 0.2.0
      sample:
        - name: vllm
          pid: 48213
          manager: pidfile
          started_at: "2026-05-09T07:35:25Z"
          pid_file: /run/biv100-serving/vllm.pid
          ports: [8000]
          gpus: [0, 1, 2, 3]
          visible_devices: "0,1,2,3"
    ports:
      description:
        - Every TCP port the host listens on (IPv4 and IPv6), by port, with the process holding
          it - C(pid) and C(command) (its command line) are null when the module may not read
          the holder's descriptors (another user's process, to a module that is not root).
        - C(own) and C(instance) as for RV(gpu_facts.processes).
      type: list
      elements: dict
      version_added: 0.2.0
      sample:
        - port: 8000
          address: 0.0.0.0
          pid: 48213
          command: /usr/local/corex/bin/python3 -m vllm.entrypoints.openai.api_server --port 8000
          own: true
          instance: vllm
"""

import csv
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    command_line,
    process_stat,
)
from ansible_collections.biv100.serving.plugins.module_utils._listening_ports import listening_ports
from ansible_collections.biv100.serving.plugins.module_utils._own_engines import (
    device_items,
    pid_files,
    running_engines,
)

GPU_FIELDS = ("index", "name", "uuid", "memory.total", "memory.used", "utilization.gpu")
PROCESS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
CSV_FORMAT = "--format=csv,noheader,nounits"
# What nvidia-smi-like tools print for a value they cannot read.
UNAVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]")


def find_ixsmi(module):
    explicit = module.params["ixsmi_path"]
    tried = [explicit] if explicit else list(module.params["search_paths"])
    for candidate in tried:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    if not explicit:
        on_path = module.get_bin_path("ixsmi")
        if on_path:
            return on_path
        tried.append("ixsmi on PATH (%s)" % os.environ.get("PATH", ""))
    module.fail_json(msg="ixsmi not found; tried: %s" % ", ".join(tried), tried=tried)


def parse_csv(text, fields):
    rows = []
    for cells in csv.reader(text.splitlines(), skipinitialspace=True):
        # Some versions say so in words instead of printing no rows.
        if not cells or cells[0].startswith("No running processes"):
            continue
        if len(cells) != len(fields):
            raise ValueError("expected %d fields (%s), got %r" % (len(fields), ",".join(fields), cells))
        rows.append(dict(zip(fields, (cell.strip() for cell in cells))))
    return rows


def to_int(value):
    if value in UNAVAILABLE:
        return None
    try:
        return int(float(value))
    except ValueError:
        raise ValueError("%r is not a number" % value)


def query(module, ixsmi, option, fields):
    """Run one ixsmi query; returns (rows or None when the query is refused, stderr)."""
    rc, out, err = module.run_command([ixsmi, "%s=%s" % (option, ",".join(fields)), CSV_FORMAT])
    if rc != 0:
        return None, (err or out).strip()
    try:
        return parse_csv(out, fields), ""
    except ValueError as exc:
        module.fail_json(msg="cannot parse the output of %s %s: %s" % (ixsmi, option, exc), stdout=out)


def gpu_from_row(row):
    return {
        "index": to_int(row["index"]),
        "name": row["name"],
        "uuid": row["uuid"],
        "memory_total_mib": to_int(row["memory.total"]),
        "memory_used_mib": to_int(row["memory.used"]),
        "utilization_pct": to_int(row["utilization.gpu"]),
        "processes": [],
    }


def own_pid_files(listed):
    """The pid files given, else every pid file in the collection's pid folder."""
    return listed if listed is not None else pid_files()


def engine_groups(engines):
    """{process group: instance name} of the collection's running engines (each leads a group
    of its own)."""
    return dict((engine.pid, engine.name) for engine in engines)


def gpu_indexes(visible_devices, gpus):
    """The indexes of the GPUs a CUDA_VISIBLE_DEVICES value names (by index or UUID); every GPU
    when it is unset."""
    items = device_items(visible_devices)
    if items is None:
        return [gpu["index"] for gpu in gpus]
    by_uuid = dict((gpu["uuid"], gpu["index"]) for gpu in gpus)
    indexes = []
    for item in items:
        index = int(item) if item.isdigit() else by_uuid.get(item)
        if index is not None and index not in indexes:
            indexes.append(index)
    return indexes


def engine_fact(engine, gpus):
    fact = engine.fact()
    fact["gpus"] = gpu_indexes(engine.visible_devices, gpus)
    return fact


def port_facts(listeners, engines):
    """Each listening socket with the process holding it, own (and its instance) when that is
    one of the collection's engines' processes."""
    owner = {}
    for engine in engines:
        for pid in engine.pids:
            owner[pid] = engine.name
    facts = []
    for listener in listeners:
        pids = listener["pids"]
        instance = next((owner[pid] for pid in pids if pid in owner), None)
        pid = pids[0] if pids else None
        command = command_line(pid) if pid else None
        facts.append({
            "port": listener["port"],
            "address": listener["address"],
            "pid": pid,
            "command": " ".join(command) if command else None,
            "own": instance is not None,
            "instance": instance,
        })
    return facts


def instance_of(pid, groups):
    """The instance whose engine's process group pid is in, or None."""
    stat = process_stat(pid) if groups and pid else None
    return groups.get(stat["pgrp"]) if stat is not None else None


def attach_processes(gpus, process_rows, own_groups=None):
    """Link each compute process to its GPU (ixsmi names the GPU by uuid); return them all."""
    by_uuid = dict((gpu["uuid"], gpu) for gpu in gpus)
    processes = []
    for row in process_rows:
        gpu = by_uuid.get(row["gpu_uuid"])
        pid = to_int(row["pid"])
        instance = instance_of(pid, own_groups)
        process = {
            "gpu_index": gpu["index"] if gpu else None,
            "pid": pid,
            "name": row["process_name"],
            "used_memory_mib": to_int(row["used_memory"]),
            "own": instance is not None,
            "instance": instance,
        }
        processes.append(process)
        if gpu:
            gpu["processes"].append(process)
    return processes


def gather(module):
    ixsmi = find_ixsmi(module)
    gpu_rows, error = query(module, ixsmi, "--query-gpu", GPU_FIELDS)
    if gpu_rows is None:
        module.fail_json(msg="%s --query-gpu failed: %s" % (ixsmi, error), ixsmi=ixsmi)
    process_rows, _error = query(module, ixsmi, "--query-compute-apps", PROCESS_FIELDS)
    listeners = listening_ports()
    engines = running_engines(own_pid_files(module.params["own_pid_file"]), listeners)
    try:
        gpus = sorted((gpu_from_row(row) for row in gpu_rows), key=lambda gpu: gpu["index"])
        processes = attach_processes(gpus, process_rows or [], engine_groups(engines))
    except ValueError as exc:
        module.fail_json(msg="cannot parse the output of %s: %s" % (ixsmi, exc), ixsmi=ixsmi)
    return {
        "ixsmi": ixsmi,
        "count": len(gpus),
        "gpus": gpus,
        "free": [gpu["index"] for gpu in gpus if all(process["own"] for process in gpu["processes"])],
        "processes": processes,
        "processes_supported": process_rows is not None,
        "engines": [engine_fact(engine, gpus) for engine in engines],
        "ports": port_facts(listeners, engines),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ixsmi_path=dict(type="path"),
            search_paths=dict(
                type="list",
                elements="path",
                default=["/usr/local/corex/bin/ixsmi", "/usr/local/corex/bin64/ixsmi"],
            ),
            own_pid_file=dict(type="list", elements="path", aliases=["own_pid_files"]),
        ),
        supports_check_mode=True,
    )
    facts = gather(module)
    module.exit_json(changed=False, gpu_facts=facts, ansible_facts={"gpu_facts": facts})


if __name__ == "__main__":
    main()
