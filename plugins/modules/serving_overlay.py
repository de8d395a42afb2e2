#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: serving_overlay
short_description: Install serving-layer files over a host's vLLM as one atomic release
description:
  - The action of the same name validates the payload on the controller against the host's
    facts, asks the host in one round trip for the sha256 of each destination's installed
    file and of its pristine vendor copy (and the pristine text of the files the payload
    patches, which it patches on the controller), and sends in a second round trip only the
    files that differ.
  - Every destination is checked on the host one component at a time, and written, removed or
    read without following a link - a symlink anywhere between the package root and the file,
    or a destination that is not a regular file, refuses the whole release before anything
    changes, naming the entry, the path and the link.
  - The host half compiles every Python file it receives with the host's own interpreter,
    keeps the pristine vendor copy of every file before its first overwrite, writes the
    release's files, installs each changed file through a temporary file in its own
    directory (fsync, rename), writes the release record last and switches C(current).
version_added: "0.1.0"
author:
  - biv100.serving maintainers (!UNKNOWN)
notes:
  - The action passes the host half internal options of its own, named with a leading C(_)
    (C(_state), C(_package_root), C(_files), ...) as ansible.builtin.copy's
    C(_original_basename) is; tasks give only the options below.
  - Needs the facts of M(biv100.serving.vllm_facts) (package root, layout, interpreter,
    registry and model) gathered first in the play.
options:
  payload_dir:
    description:
      - The payload folder, holding C(manifest.yml) and the files and patches it names, on the
        controller; a relative path is found beside the playbook, as other plugins find their
        files.
      - Required unless O(plan) is given.
    type: path
  release:
    description:
      - The release id, usually the submission id (C(sub510)).
      - A release id is never reused for other content.
    type: str
  auto_release:
    description:
      - The id of a new release when O(release) is not given, normally one UTC timestamp made
        once on the controller for every host.
      - When nothing differs from the current release, no release is made.
      - One of O(release) and O(auto_release) is required unless O(plan) is given.
    type: str
  protected_extra:
    description: Model-layer paths protected beyond the brief's twelve, relative to the package root.
    type: list
    elements: str
    default: []
  record:
    description: More fields for the release record (the submission id, the controller's git revision).
    type: dict
    default: {}
  plan:
    description:
      - The RV(plan) an earlier check-mode run of this task returned for this host. The task then
        installs that plan instead of planning again, once the host shows that nothing the
        plan was based on moved (the installed and pristine digests of every path, the
        current release); otherwise it fails and writes nothing.
      - The other options are not read then.
    type: dict
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - biv100.serving.run_lock
attributes:
  action:
    support: full
    details:
      - The action of the same name plans the release on the controller and sends the host
        half only what differs.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details:
      - Reports the files that would change, writes nothing.
  diff_mode:
    support: full
    details:
      - Shows each changed text file as a unified diff.
seealso:
  - module: biv100.serving.vllm_facts
  - module: biv100.serving.model_guard
"""

EXAMPLES = r"""
- name: Learn the host's vLLM first
  biv100.serving.vllm_facts:
    model_path: /opt/models/qwen3_5

- name: Stage the payload as release sub510
  biv100.serving.serving_overlay:
    payload_dir: files/serving
    release: sub510

- name: Stage it under a timestamp, or not at all when nothing differs
  biv100.serving.serving_overlay:
    payload_dir: files/serving
    auto_release: "{{ now(utc=true, fmt='%Y%m%dT%H%M%SZ') }}"
"""

RETURN = r"""
release:
  description: The release now current.
  returned: success
  type: str
  sample: sub510
changed_files:
  description: Package paths whose installed content changed (or would, in check mode).
  returned: success
  type: list
  elements: str
  sample: [entrypoints/openai/serving_chat.py]
payload_digest:
  description: One sha256 over every destination path and its content on this host.
  returned: success
  type: str
mappings:
  description:
    - The manifest's mapping records of the entries the release carries - source, place and change,
      the checks that prove it (proven_by), the entry's name and the package paths it installs.
  returned: success
  type: list
  elements: dict
  sample: [{source: fast path / safe path split, place: serving_chat.py, change: patch, proven_by: [n-two],
            entry: fast-path-chat, paths: [entrypoints/openai/serving_chat.py]}]
current_release:
  description: The release C(current) pointed at before this run, and its record.
  returned: when the release changed
  type: dict
plan:
  description:
    - In check mode, what staging would install on this host and what it takes for granted
      there; give it to the O(plan) option of the real run.
  returned: check mode
  type: dict
new_folders:
  description:
    - By manifest entry, the folders its files would create (or created) that the host's vLLM
      does not have now; a check-mode run also warns about each.
  returned: success
  type: dict
  sample: {my-parser: [reasoning/mine/]}
base_copies_added:
  description: Package paths whose pristine vendor copy was kept by this run.
  returned: when files were installed
  type: list
  elements: str
"""

import base64
import hashlib
import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath
from ansible_collections.biv100.serving.plugins.module_utils._run_lock import NotHeld, fenced
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    StateDir,
    read_json,
    switch_symlink,
    utc_timestamp,
    write_json,
)

# Compiles each file given on the command line (payload path, file on disk) and prints the
# errors as JSON; runs under the engine's interpreter, any Python 3.8 or later.
COMPILE_PROBE = r"""
import json, sys
errors = {}
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        with open(path, "rb") as stream:
            compile(stream.read(), name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        errors[name] = "line %s: %s" % (getattr(error, "lineno", "?"), getattr(error, "msg", error))
print(json.dumps(errors))
"""


class Host(object):
    """The package and the state store of one host, both reached without following links.

    The base index (StateDir.base_index) maps each package path ever overlaid to the sha256 of
    the vendor's file, or null when the vendor has none (going back to base removes it).
    """

    def __init__(self, module):
        self.module = module
        self.store = StateDir(module.params["state_dir"])
        self.package = Tree(module.params["_package_root"])
        self.state = Tree(self.store.root)
        self.index = read_json(self.store.base_index, default={})

    def base_copy(self, path):
        """The kept vendor copy of a package path, relative to the state store."""
        return os.path.relpath(self.store.base_copy(path), self.store.root)

    def release_file(self, release, path):
        return os.path.relpath(self.store.release_file(release, path), self.store.root)

    def pristine(self, path):
        """(tree, path) of the vendor's own file: its kept copy once overlaid, else installed."""
        if path in self.index:
            return (self.state, self.base_copy(path)) if self.index[path] is not None else None
        return self.package, path

    def pristine_digest(self, path):
        where = self.pristine(path)
        return where[0].digest(where[1]) if where else None

    def check(self, paths):
        """{path: why} for every path that leads through a link or is not a regular file."""
        unsafe = {}
        for path in paths:
            try:
                self.package.inspect(path)
            except UnsafePath as error:
                unsafe[path] = str(error)
        return unsafe

    def refuse_unsafe(self, paths):
        unsafe = self.check(paths)
        if unsafe:
            self.module.fail_json(
                msg="refusing to write through the host's own tree under %s (nothing changed): %s"
                % (self.module.params["_package_root"], "; ".join(unsafe[path] for path in sorted(unsafe))),
                unsafe=unsafe,
            )


def current_release(store):
    release_id = store.current_release()
    record = read_json(store.release_record(release_id)) if release_id else None
    return {"id": release_id, "record": record}


def inventory(module, host):
    """Digests of the asked paths and of every path an earlier release overlaid.

    A path that leads through a link is reported under `unsafe` instead of being read; a path
    whose folders the vendor base lacks is reported with the folders a write would create.
    """
    files, unsafe = {}, {}
    for path in sorted(set(module.params["_paths"]) | set(host.index)):
        try:
            found = host.package.inspect(path)
            entry = {
                "current": host.package.digest(path) if found["kind"] == "file" else None,
                "pristine": host.pristine_digest(path),
            }
            if found["missing"]:
                entry["new_folders"] = found["missing"]
            if path in module.params["_pristine_content"] and entry["pristine"]:
                tree, name = host.pristine(path)
                entry["pristine_content"] = base64.b64encode(tree.read(name)).decode("ascii")
        except UnsafePath as error:
            unsafe[path] = str(error)
            continue
        files[path] = entry
    module.exit_json(changed=False, files=files, unsafe=unsafe, overlaid=sorted(host.index),
                     current_release=current_release(host.store))


def decoded(module, files):
    """The content sent for the files the host lacks, each checked against its digest."""
    contents = {}
    for item in files:
        if item.get("content") is None:
            continue
        data = base64.b64decode(item["content"])
        if hashlib.sha256(data).hexdigest() != item["sha256"]:
            module.fail_json(msg="%s arrived damaged (sha256 differs from the controller's)" % item["path"])
        contents[item["path"]] = data
    return contents


def refuse_moved(module, host):
    """Fail, before anything is written, when the host is no longer what the plan was made on:
    a file whose installed or pristine content changed, or another release made current."""
    moved = []
    current = host.store.current_release()
    if current != module.params["_expect_current"]:
        moved.append("current release %s, planned on %s" % (current or "none", module.params["_expect_current"] or "none"))
    for path, planned in sorted(module.params["_expect"].items()):
        found = {"current": host.package.digest(path), "pristine": host.pristine_digest(path)}
        moved.extend("%s %s %s, planned on %s" % (path, key, short(found[key]), short(planned.get(key)))
                     for key in ("current", "pristine") if found[key] != planned.get(key))
    if moved:
        module.fail_json(msg="the host changed since this run planned its release, nothing was written; "
                         "run the deploy again: %s" % "; ".join(moved), moved=moved)


def short(digest):
    return "sha256 %s\u2026" % digest[:12] if digest else "absent"


def refuse_uncompilable(module, contents, digests):
    """Compile every Python file with the engine's interpreter before anything is written;
    the plan of this run compiled some already (`compiled`: their sha256, as in `digests`)."""
    checked = set(module.params["_compiled"])
    python_files = sorted(path for path in contents if path.endswith(".py") and digests[path] not in checked)
    if not python_files:
        return
    interpreter = module.params["_interpreter"]
    scratch = tempfile.mkdtemp(prefix="biv100-compile-")
    try:
        arguments = []
        for number, path in enumerate(python_files):
            on_disk = os.path.join(scratch, "%d.py" % number)
            with open(on_disk, "wb") as stream:
                stream.write(contents[path])
            arguments += [path, on_disk]
        rc, out, err = module.run_command([interpreter, "-c", COMPILE_PROBE] + arguments)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        errors = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        module.fail_json(msg="%s could not compile the payload (rc=%d): %s" % (interpreter, rc, err.strip()))
    if errors:
        module.fail_json(
            msg="payload files do not compile with %s: %s"
            % (interpreter, "; ".join("%s %s" % (path, why) for path, why in sorted(errors.items()))),
            compile_errors=errors,
        )


def keep_pristine_copies(host, paths):
    """Copy each vendor file aside before its first overwrite; never replace a kept copy."""
    added = {}
    for path in paths:
        if path in host.index:
            continue
        data = host.package.read(path)
        if data is not None:
            host.state.write(host.base_copy(path), data)
            added[path] = host.state.digest(host.base_copy(path))
        else:
            added[path] = None
    if added:
        host.index.update(added)
        write_json(host.store.base_index, host.index)
    return sorted(added)


def plan_changes(module, host, desired, sent):
    """What each path must become: bytes to write, None to remove; unchanged paths left out.
    Returns (changes, the installed digest of every path).

    The controller sends only what the host lacks. A file going back to the vendor's version
    comes from its kept pristine copy, and a file the vendor never had is removed.
    """
    changes, installed = {}, {}
    for path, digest in sorted(desired.items()):
        installed[path] = host.package.digest(path)
        if installed[path] == digest:
            continue
        if digest is None:
            changes[path] = None
        elif path in sent:
            changes[path] = sent[path]
        elif host.index.get(path) == digest:
            changes[path] = host.state.read(host.base_copy(path))
        else:
            module.fail_json(msg="%s: the host has no content with sha256 %s and none was sent" % (path, digest))
    return changes, installed


def write_release_files(host, release, desired, changes):
    """The release's own copy of every file it installs, for rollback byte for byte.

    Written before the package changes: a state store that fills up stops the run while every
    installed file is still the old one.
    """
    for path, digest in sorted(desired.items()):
        if digest is not None:
            data = changes[path] if path in changes else host.package.read(path)
            host.state.write(host.release_file(release, path), data)


def install(host, changes):
    for path, data in sorted(changes.items()):
        if data is None:
            host.package.remove(path)
        else:
            host.package.write(path, data)


def text_diff(host, changes):
    before, after = [], []
    for path, data in sorted(changes.items()):
        old = host.package.read(path) or b""
        before.append("# %s\n%s" % (path, old.decode("utf-8", "replace")))
        after.append("# %s\n%s" % (path, (data or b"").decode("utf-8", "replace")))
    return {"before": "\n".join(before), "after": "\n".join(after),
            "before_header": "installed", "after_header": "release"}


def present(module, host):
    store = host.store
    release = module.params["release"]
    if not release or "/" in release or release.startswith("."):
        module.fail_json(msg="release must be a plain name such as sub510, got %r" % release)
    desired = dict((item["path"], item.get("sha256")) for item in module.params["_files"])
    # Checked again here, not only in the inventory round trip: the tree may have changed since.
    host.refuse_unsafe(sorted(set(desired) | set(host.index)))
    if module.params["_expect"] is not None:
        refuse_moved(module, host)
    previous = current_release(store)
    existing = read_json(store.release_record(release))
    if existing is not None and existing.get("digests") != desired:
        module.fail_json(
            msg="release %s already exists on this host with other content; releases are "
            "immutable: deploy under a new id" % release
        )
    changes, before = plan_changes(module, host, desired, decoded(module, module.params["_files"]))
    if not changes and previous["id"] == release:
        module.exit_json(changed=False, release=release, changed_files=[], current_release=previous)

    refuse_uncompilable(module, dict((path, data) for path, data in changes.items() if data is not None), desired)
    result = {"changed": True, "release": release, "changed_files": sorted(changes),
              "current_release": previous}
    if module._diff:
        result["diff"] = text_diff(host, changes)
    if module.check_mode:
        module.exit_json(**result)

    record = dict(module.params["record"])
    record.update(
        id=release,
        status="pending",
        previous=previous["id"],
        digests=desired,
        files=dict((path, {"before": before[path], "after": desired[path]}) for path in sorted(desired)),
        changed_files=sorted(changes),
    )
    try:
        # Only while this run holds the host's lock, checked under its flock (no take-over between).
        with fenced(store.root, writing="staging %s" % release):
            result["base_copies_added"] = keep_pristine_copies(host, sorted(desired))
            write_release_files(host, release, desired, changes)
            install(host, changes)
            record["created_at"] = utc_timestamp()
            # Written last: a release without its record is an interrupted one, never current.
            write_json(store.release_record(release), record)
            switch_symlink(store.current, os.path.join("releases", release))
    except NotHeld as error:
        module.fail_json(msg=str(error), changed_files=[])
    except OSError as error:
        module.fail_json(msg="staging %s stopped at %s: %s" % (release, error.filename or "?", error.strerror),
                         changed_files=sorted(changes))
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            # The task's options, as documented. The action of the same name reads payload_dir,
            # auto_release, protected_extra and plan itself and never sends them; they are here so
            # that the documentation is checked against one spec.
            payload_dir=dict(type="path"),
            release=dict(type="str"),
            auto_release=dict(type="str"),
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            protected_extra=dict(type="list", elements="str", default=[]),
            record=dict(type="dict", default={}),
            plan=dict(type="dict"),
            # What the action tells the host half (as ansible.builtin.copy's _original_basename):
            # undocumented, so with a type only, no default, and the lists the action makes as
            # raw (a list type needs its elements documented); the defaults are filled in below.
            _state=dict(type="str"),
            _package_root=dict(type="path"),
            _paths=dict(type="raw"),
            _pristine_content=dict(type="raw"),
            _files=dict(type="raw"),
            _interpreter=dict(type="path"),
            _expect=dict(type="dict"),
            _expect_current=dict(type="str"),
            _compiled=dict(type="raw"),
        ),
        required_if=[("_state", "present", ("release", "_interpreter")), ("_state", "verify", ("_expect",))],
        supports_check_mode=True,
    )
    for name in ("_paths", "_pristine_content", "_files", "_compiled"):
        module.params[name] = module.params[name] or []
    if module.params["_state"] not in ("inventory", "present", "verify") or not module.params["_package_root"]:
        module.fail_json(msg="serving_overlay runs through its action plugin, which tells the host half what to "
                             "do (_state inventory, present or verify) and where (_package_root)")
    host = Host(module)
    if module.params["_state"] == "inventory":
        inventory(module, host)
    if module.params["_state"] == "verify":
        host.refuse_unsafe(sorted(module.params["_expect"] or {}))
        refuse_moved(module, host)
        module.exit_json(changed=False, msg="the host is as this run planned it")
    try:
        present(module, host)
    except UnsafePath as error:
        # A link that appeared after the checks, before anything was written or in between
        # whole files: the release is not recorded, so a re-run starts over.
        module.fail_json(msg="refusing to write through the host's own tree under %s: %s"
                         % (module.params["_package_root"], error))


if __name__ == "__main__":
    main()
