#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The documentation of the action plugin of the same name, which does all the work on the
# controller; as for ansible.builtin.debug, there is no module code.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_submission
short_description: Build the platform submission bundle of a release the fleet proved good
version_added: 0.2.0
description:
  - Builds, on the controller, the bundle the competition platform runs - which does not run
    Ansible - from a release as the named hosts kept it, and writes it to C(<dest>/<release>/)
    with its archive C(<dest>/<release>.tar.gz).
  - The input is each host's export of the release, as M(biv100.serving.serving_release) returns
    it with C(state=exported) - its status, its record, the bytes the release installed and the
    vendor's digest of every file involved. Nothing runs on a host and no connection is opened.
  - C(computility-run.yaml) - the run document the deploy recorded with the release on the
    reference host (its C(engine.platform_run)), byte for byte, not the inventory's current
    settings.
  - C(patch_ops.sh) - the POSIX sh installer the platform runs, rendered from
    C(files/submission/patch_ops.sh.in) with the release, the interpreters of the hosts in the
    bundle and the collection's own serving layer and protected files.
  - C(MANIFEST) - per variant of the vendor's base (the hosts whose vendor files have the same
    sha256 at every path the release touches), the vendor's and the release's sha256 of every
    path; C(files/<variant>/<path>) - the bytes each variant installs; C(README.md) - the
    release's status, usage, gate figures, mapping records, variants and the hosts left out;
    C(SHA256SUMS) - the sha256 of every other file.
  - Refuses a release a named host does not hold; a release that is not V(good) on a named
    host unless O(force) (the README then says on which hosts it was not proven good); a
    reference record without C(engine.platform_run) (a release deployed before run documents
    were kept - deploy it again under a new id); two hosts of the same vendor base whose release
    installed different files; a release that would remove a vendor file; kept bytes whose
    sha256 is not the recorded one. Each refusal names the host and the path.
  - A host whose recorded run document differs from the reference's ran another engine - it is
    left out of the bundle, with its first differing line in RV(left_out) and a warning.
  - The same exports give the same bytes - no time of the build is written, and the archive is
    reproducible (sorted entries, mtime 0 in the tar and gzip headers, owner 0:0 without names).
    Only the files whose bytes or mode differ are written, each through a temporary file in its
    own folder and a rename, without following a link; files of an earlier build that the
    bundle no longer holds are removed. A second run reports no change and touches no file.
options:
  release:
    description: The release id (C(sub510)), the folder's and the archive's name.
    type: str
    required: true
  hosts:
    description:
      - The hosts whose release the bundle is built from, each as M(biv100.serving.serving_release)
        reported it with C(state=exported).
      - Every named host must hold the release.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The inventory host name.
        type: str
        required: true
      interpreter:
        description:
          - The interpreter of the host's vllm, as M(biv100.serving.vllm_facts) found it
            (C(ansible_facts.vllm_facts.interpreter)); C(patch_ops.sh) tries it to find vllm.
        type: str
        required: true
      export:
        description:
          - The release as the host kept it - C(release), C(status) (null when the host lacks
            the release), C(record), C(files) (the base64 of every file the release installed)
            and C(vendor) (the sha256 of the vendor's file at every path involved, null when the
            vendor has none).
        type: dict
  reference:
    description:
      - The host whose recorded run document becomes C(computility-run.yaml) and whose gate
        figures the README shows.
      - The first of O(hosts) when not given.
    type: str
  force:
    description:
      - Build the bundle of a release that is not V(good) on some named host. The README says
        prominently on which hosts it was not proven good, and the task warns.
    type: bool
    default: false
  dest:
    description:
      - The folder of the submissions, created if needed.
      - When not set, C(build/submissions) at the project root (the folder of the project's
        C(ansible.cfg)).
      - C(<dest>/<release>) must be a folder or absent - a symlink or a file there is refused,
        as is a symlink or anything but files and folders inside it.
    type: path
extends_documentation_fragment:
  - biv100.serving.controller_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.conn
  - ansible.builtin.action_common_attributes.flow
attributes:
  check_mode:
    support: full
    details: Builds the bundle and writes nothing; RV(written) names what would change.
  diff_mode:
    support: full
    details: Shows each file written or removed (the sha256 of the archive and of files that are not text).
seealso:
  - module: biv100.serving.serving_release
  - module: biv100.serving.vllm_facts
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the release on every host of the fleet
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    release: sub510
    state: exported
  register: submission_export

- name: Note what the bundle needs of each host
  ansible.builtin.set_fact:
    submission_host:
      name: "{{ inventory_hostname }}"
      interpreter: "{{ ansible_facts.vllm_facts.interpreter }}"
      export: "{{ submission_export }}"

- name: Build build/submissions/sub510/ and sub510.tar.gz from what the hosts kept
  biv100.serving.serving_submission:
    release: sub510
    hosts: "{{ ansible_play_hosts | map('extract', hostvars, 'submission_host') }}"
  run_once: true

- name: The same, for one host, with its figures in the README, whatever its status
  biv100.serving.serving_submission:
    release: sub510
    hosts:
      - name: bi-v100-1
        interpreter: /usr/local/corex/bin/python3
        export: "{{ hostvars['bi-v100-1'].submission_export.export }}"
    force: true
    dest: /srv/submissions
"""

RETURN = r"""
bundle:
  description: The bundle's folder.
  returned: success
  type: str
  sample: /work/project/build/submissions/sub510
archive:
  description: The bundle's archive, the folder under the top directory C(<release>/).
  returned: success
  type: str
  sample: /work/project/build/submissions/sub510.tar.gz
archive_sha256:
  description: The sha256 of the archive - the same for the same exports.
  returned: success
  type: str
  sample: 3f2a9c0d4b6e8f1a2c3d4e5f60718293a4b5c6d7e8f9012345678901abcdef01
reference:
  description: The host whose run document and gate figures the bundle carries.
  returned: success
  type: str
  sample: bi-v100-1
variants:
  description:
    - The variants of the vendor's base, sorted by id - the id (12 hex of the sha256 of the
      variant's vendor digests), the vLLM version its hosts recorded, its hosts, and the package
      paths it installs and keeps.
  returned: success
  type: list
  elements: dict
  sample: [{id: 0c5e1f2a9b3d, vllm_version: 0.11.0, hosts: [bi-v100-1, bi-v100-2],
            installed: [entrypoints/openai/serving_chat.py], kept: [model_executor/models/registry.py]}]
left_out:
  description: The hosts that hold the release but ran another engine, and why.
  returned: success
  type: list
  elements: dict
  sample: [{host: bi-v100-3, reason: "runs another engine: model: /opt/models/qwen3_moe (line 9 of its
            computility-run.yaml, where bi-v100-1's has model: /opt/models/qwen3_5)"}]
written:
  description:
    - The paths under O(dest) written or removed (in check mode, that would be), sorted.
  returned: success
  type: list
  elements: str
  sample: [sub510.tar.gz, sub510/README.md]
"""
