#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_facts
short_description: Read where an installed vLLM keeps its serving and model-layer files
version_added: 0.1.0
description:
  - Locates the C(vllm) package of a Python interpreter without importing it (importing vLLM
    needs torch and the GPU stack), and reports its version, its layout, the path and sha256 of
    every serving-layer and protected model-layer file this collection knows, the architectures
    its model registry declares, and whether it serves a given model.
  - The interpreter is asked once, in one subprocess, where C(importlib.util.find_spec) finds
    C(vllm), which version C(importlib.metadata) reports for it, and its Python version. A
    top-level C(find_spec) does not run the package's C(__init__.py).
  - C(model_executor/models/registry.py) is parsed with Python's C(ast), never imported or
    executed. A registry that is missing or does not parse is reported in
    RV(vllm_facts.registry.error) instead of failing the task, so that a later check can name
    the problem.
  - The module only reads files; it never reports a change.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  interpreter:
    description:
      - The Python interpreter whose C(vllm) package is inspected, usually the one the engine
        runs under (on a BI-V100 host, the CoreX SDK's Python).
      - Defaults to the Python this module runs under (C(ansible_python_interpreter)).
    type: path
  package_root:
    description:
      - The C(vllm) package directory, for a package no interpreter finds on its own.
      - When set, the package is not searched for; the interpreter is still asked for its
        Python version. The version is read from a C(vllm-*.dist-info/METADATA) beside the
        package, else from the package's C(_version.py) or C(version.py).
    type: path
  model_path:
    description:
      - A model directory holding a Hugging Face C(config.json). When set,
        RV(vllm_facts.model) tells whether the registry serves the architectures it declares.
    type: path
  state_dir:
    description:
      - The collection's state store. Where it keeps the vendor's pristine C(registry.py)
        (because a release patched it), RV(vllm_facts.model.missing_in_base) is decided
        from that copy rather than from the installed file.
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - biv100.serving.state_store
attributes:
  check_mode:
    support: full
    details:
      - The module only reads files.
  diff_mode:
    support: none
  facts:
    support: full
notes:
  - Layouts, by the first marker present in the package; C(v0) (0.8 to 0.10, the V0 engine's
    C(worker/model_runner.py) is still shipped), C(v1-split) (0.33, the OpenAI entrypoints are
    split per endpoint, C(entrypoints/openai/chat_completion/)), C(v1) (0.11, V0 gone,
    C(v1/engine/core.py)); otherwise C(unknown).
  - A file name is looked for at each location it has had, oldest first; where a release ships
    a V0 file beside its V1 counterpart (scheduler, sampler, xformers, model_runner), the V0 one
    is reported. A name absent from the package is reported absent, never matched to another
    file; where a later vLLM gave its role to a file of another name, that file is named in
    C(equivalent).
  - Registry entries are replayed from literal entries, C(**) merges of earlier tables and
    dict comprehensions over the items of an earlier table. A comprehension condition made of
    anything but comparisons, C(and), C(or) and C(not) keeps every entry. What cannot be
    evaluated is listed in RV(vllm_facts.registry.unresolved).
  - The registry is parsed by the Python this module runs under; run it under the engine's
    interpreter when that one is newer, so that new syntax in C(registry.py) parses.
seealso:
  - module: ansible.builtin.setup
"""

EXAMPLES = r"""
- name: Read the vLLM of the CoreX Python and check the model it will serve
  biv100.serving.vllm_facts:
    interpreter: /usr/local/corex/bin/python3
    model_path: /opt/models/qwen3_5

- name: Stop when a missing architecture has no model file in the base
  ansible.builtin.assert:
    that: vllm_facts.model.registrable[item]
    fail_msg: "no model file of the base defines {{ item }}"
  loop: "{{ vllm_facts.model.missing }}"

- name: Read a vLLM package that no interpreter finds by itself
  biv100.serving.vllm_facts:
    package_root: /usr/local/corex/lib64/python3/dist-packages/vllm
  register: base_vllm

- name: Show where the protected scheduler lives in this layout
  ansible.builtin.debug:
    msg: "{{ base_vllm.vllm_facts.layout }}: {{ scheduler.path }}"
  vars:
    scheduler: "{{ base_vllm.vllm_facts.files.protected['scheduler.py'] }}"
"""

RETURN = r"""
vllm_facts:
  description:
    - What the module found; also set as the host fact C(vllm_facts).
    - Paths of files are relative to RV(vllm_facts.package_root) and use C(/); a trailing C(/)
      names a folder.
  returned: success
  type: dict
  contains:
    interpreter:
      description: The interpreter inspected.
      returned: success
      type: str
      sample: /usr/local/corex/bin/python3
    python_version:
      description: The interpreter's Python version.
      returned: success
      type: str
      sample: 3.10.12
    package_root:
      description: The absolute path of the C(vllm) package directory.
      returned: success
      type: str
      sample: /usr/local/corex/lib64/python3/dist-packages/vllm
    version:
      description:
        - The installed vLLM version, from the package metadata, else from the package's
          C(_version.py) or C(version.py); null when neither states one.
      returned: success
      type: str
      sample: 0.10.1.1
    layout:
      description: The package layout, see the notes.
      returned: success
      type: str
      choices: [v0, v1, v1-split, unknown]
      sample: v0
    files:
      description:
        - Each serving-layer and protected model-layer file by name, with C(path) (null when
          absent), C(exists), C(sha256) (null when absent) and C(equivalent) (the file of
          another name that took over the role of an absent name, else null).
        - The C(reasoning/) folder also has C(files), the sha256 of each file under it by
          path (byte code caches left out); its C(sha256) is that of their C(sha256sum)
          listing sorted by path.
      returned: success
      type: dict
      contains:
        serving:
          description:
            - C(protocol.py), C(serving_chat.py), C(qwen3coder_tool_parser.py),
              C(reasoning/), C(api_server.py), C(chat_utils.py), C(cli_args.py),
              C(registry.py).
          returned: success
          type: dict
          sample:
            protocol.py:
              path: entrypoints/openai/protocol.py
              exists: true
              sha256: 3f568e429198b664340f24745e33ef32c15f9db9083c43f6b1e2ec2b01b0ab72
              equivalent: null
            reasoning/:
              path: reasoning/
              exists: true
              sha256: f8cd63d4bc8b125317611ef3a3ebd105caa73f5e8ef0c5f9a45a6591797e7230
              equivalent: null
              files:
                reasoning/__init__.py: 173d7fa8442c3e3eff01b01e1c0ded7f7f9633479a8df1764f9001430500caf5
        protected:
          description:
            - C(qwen3_5.py), C(model_runner.py), C(_custom_ops.py), C(sampler.py),
              C(scheduler.py), C(sequence.py), C(xformers.py), C(paged_attn.py),
              C(prefix_prefill.py), C(logits_processor.py), C(mamba_cache.py),
              C(arg_utils.py).
          returned: success
          type: dict
          sample:
            qwen3_5.py:
              path: null
              exists: false
              sha256: null
              equivalent: null
            scheduler.py:
              path: core/scheduler.py
              exists: true
              sha256: c0f9e67b97879ecd2bb1c342206315ff0d4d9c355ef1db800c2eff9616815ba8
              equivalent: null
    registry:
      description: The model registry, C(model_executor/models/registry.py).
      returned: success
      type: dict
      contains:
        path:
          description: Its path; null when the package has none.
          returned: success
          type: str
          sample: model_executor/models/registry.py
        architectures:
          description: The architectures of C(_VLLM_MODELS), each with its module and class.
          returned: success
          type: dict
          sample:
            Qwen3ForCausalLM: [qwen3, Qwen3ForCausalLM]
            Qwen3MoeForCausalLM: [qwen3_moe, Qwen3MoeForCausalLM]
        has_qwen3_5:
          description: Whether an architecture name starts with C(Qwen3_5).
          returned: success
          type: bool
          sample: false
        unresolved:
          description: Parts of the registry that could not be evaluated, each with its line.
          returned: success
          type: list
          elements: str
          sample: ["model_executor/models/registry.py line 88: cannot expand ** _plugin_models()"]
        error:
          description:
            - Why the registry could not be read (missing, unreadable, a syntax error with its
              line, no C(_VLLM_MODELS)); null when it was read. Architectures are then empty.
          returned: success
          type: str
          sample: "model_executor/models/registry.py line 42: invalid syntax"
    model:
      description: Whether the registry serves the model at O(model_path).
      returned: when O(model_path) is set
      type: dict
      contains:
        path:
          description: The model directory.
          returned: success
          type: str
          sample: /opt/models/qwen3_5
        error:
          description: Why C(config.json) gave no architectures, naming the file; null otherwise.
          returned: success
          type: str
          sample: "cannot read /opt/models/qwen3_5/config.json: [Errno 2] No such file or directory"
        architectures:
          description: The C(architectures) C(config.json) declares.
          returned: success
          type: list
          elements: str
          sample: [Qwen3_5ForConditionalGeneration]
        max_position_embeddings:
          description:
            - From the top level of C(config.json), else from its C(text_config); null when
              neither has it.
          returned: success
          type: int
          sample: 262144
        served:
          description: Whether the registry has every declared architecture.
          returned: success
          type: bool
          sample: false
        missing:
          description: The declared architectures the registry lacks.
          returned: success
          type: list
          elements: str
          sample: [Qwen3_5ForConditionalGeneration]
        missing_in_base:
          description:
            - The declared architectures the vendor's own registry lacks, whatever a release
              installed over it; the same as RV(vllm_facts.model.missing) before any release
              touched C(registry.py).
          returned: success
          type: list
          elements: str
          sample: [Qwen3_5ForConditionalGeneration]
        registrable:
          description:
            - For each missing architecture, whether a C(model_executor/models/*.py) file
              defines a top-level class of that name, so a registry entry could serve it.
          returned: success
          type: dict
          sample:
            Qwen3_5ForConditionalGeneration: true
        defined_in:
          description: For each registrable architecture, the model file defining it.
          returned: success
          type: dict
          sample:
            Qwen3_5ForConditionalGeneration: model_executor/models/qwen3_5.py
    cli:
      description:
        - The host's own OpenAI-server CLI, read from the parser's source with C(ast) (literal
          C(add_argument) calls and the dataclass fields the parser adds one option each for),
          never by importing vLLM.
      returned: success
      type: dict
      contains:
        arguments:
          description: The argument names (C(max_num_seqs) for C(--max-num-seqs)); null when unread.
          returned: success
          type: list
          elements: str
          sample: [max_model_len, max_num_seqs, tensor_parallel_size]
        error:
          description: Why the CLI could not be read; null when it was.
          returned: success
          type: str
          sample: "neither engine/arg_utils.py nor entrypoints/openai/cli_args.py exists"
ansible_facts:
  description: The host facts set.
  returned: success
  type: dict
  contains:
    vllm_facts:
      description: The same as RV(vllm_facts).
      returned: success
      type: dict
"""

import json
import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR, StateDir
from ansible_collections.biv100.serving.plugins.module_utils._vllm_cli import argument_names
from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import (
    PROTECTED_FILES,
    SERVING_FILES,
    detect_layout,
    package_version,
    resolve_files,
)
from ansible_collections.biv100.serving.plugins.module_utils._vllm_registry import (
    model_facts,
    registry_facts,
)

# Runs under the inspected interpreter, any Python 3.8 or later, and prints one JSON line.
PROBE = r"""
import importlib.util, json, platform, sys


def installed_version():
    # Called only once a package is found: importlib.metadata costs more than the rest.
    try:
        from importlib.metadata import version
        return version("vllm")
    except Exception:
        return None  # no metadata (a source tree, a vendor copy): the tree's version file tells


# `python -c` puts the working directory first on sys.path; a vllm folder there is not installed.
if sys.path[:1] == [""]:
    del sys.path[0]
spec = importlib.util.find_spec("vllm")
locations = list(spec.submodule_search_locations or []) if spec else []
print(json.dumps({
    "package_root": locations[0] if locations else None,
    "version": installed_version() if locations else None,
    "python_version": platform.python_version(),
    "sys_path": sys.path,
}))
"""


def probe_interpreter(module, interpreter):
    """Ask the interpreter, in one subprocess, for its vllm package, vllm version and Python."""
    try:
        rc, out, err = module.run_command(
            [interpreter, "-c", PROBE], expand_user_and_vars=False, handle_exceptions=False
        )
    except OSError as error:
        module.fail_json(
            msg="cannot run %s: %s" % (interpreter, error.strerror), interpreter=interpreter
        )
    lines = out.strip().splitlines()
    try:
        # The last line: a sitecustomize may print before the probe does.
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        module.fail_json(
            msg="%s did not answer the vllm probe (rc=%d): %s"
            % (interpreter, rc, (err or out).strip()),
            interpreter=interpreter,
        )


def locate_package(module, interpreter, probe):
    """The absolute vllm package directory: package_root when given, else the probe's."""
    explicit = module.params["package_root"]
    if explicit:
        if not os.path.isdir(explicit):
            module.fail_json(msg="package_root %s is not a directory" % explicit)
        return os.path.abspath(explicit)
    if probe["package_root"] is None:
        module.fail_json(
            msg="no vllm package for %s (Python %s); searched its sys.path: %s"
            % (interpreter, probe["python_version"], ", ".join(probe["sys_path"])),
            interpreter=interpreter,
            sys_path=probe["sys_path"],
        )
    return os.path.abspath(probe["package_root"])


def collect_facts(interpreter, probe, package_root, version, model_path, state_dir):
    """Everything the module reports about the package at package_root."""
    files = {
        "serving": resolve_files(package_root, SERVING_FILES),
        "protected": resolve_files(package_root, PROTECTED_FILES),
    }
    registry = registry_facts(package_root, files["serving"]["registry.py"]["path"])
    facts = {
        "interpreter": interpreter,
        "python_version": probe["python_version"],
        "package_root": package_root,
        "version": version,
        "layout": detect_layout(package_root),
        "files": files,
        "registry": registry,
    }
    if model_path:
        facts["model"] = model_facts(model_path, package_root, registry["architectures"])
        facts["model"]["missing_in_base"] = missing_in_base(facts["model"], registry, state_dir)
    return facts


def missing_in_base(model, registry, state_dir):
    """What the vendor's registry lacks: a patched registry.py must not hide that it needs the
    patch (the next run would take the patch away again)."""
    store = StateDir(state_dir)
    if not registry["path"] or not os.path.isfile(store.base_copy(registry["path"])):
        return list(model["missing"])
    # The kept vendor copies stand in the store as they stood in the package.
    base_registry = registry_facts(store.base_copy(""), registry["path"])
    return [name for name in model["architectures"] if name not in base_registry["architectures"]]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            interpreter=dict(type="path"),
            package_root=dict(type="path"),
            model_path=dict(type="path"),
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
        ),
        supports_check_mode=True,
    )
    interpreter = module.params["interpreter"] or sys.executable
    probe = probe_interpreter(module, interpreter)
    package_root = locate_package(module, interpreter, probe)
    # The probe's metadata describes the package it found, not an explicit package_root.
    found_version = None if module.params["package_root"] else probe["version"]
    version = found_version or package_version(package_root)
    try:
        facts = collect_facts(interpreter, probe, package_root, version, module.params["model_path"],
                              module.params["state_dir"])
    except OSError as error:
        module.fail_json(msg="cannot read %s: %s" % (error.filename, error.strerror))
    arguments, why = argument_names(package_root)
    facts["cli"] = {"arguments": arguments, "error": why}
    module.exit_json(changed=False, vllm_facts=facts, ansible_facts={"vllm_facts": facts})


if __name__ == "__main__":
    main()
