# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The environment engine_process starts an engine with: a minimal base, then the variables of
its env file, then the task's env - never the environment of the connection that runs the
module, so that the same task starts the same engine every time.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os
import pwd

from ansible_collections.biv100.serving.plugins.module_utils._env_file import (
    parse_env_text,
    read_env_file,
)

# The whole inherited environment of the engine, before env_file and env.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class EnvironmentProblem(ValueError):
    """The desired environment cannot be read; the message says why."""


def env_file_matches(path, content):
    """Whether the file at path holds exactly content (False when it is missing)."""
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read() == content
    except FileNotFoundError:
        return False


def base_environment():
    return {
        "PATH": BASE_PATH,
        "HOME": pwd.getpwuid(os.geteuid()).pw_dir,
        "LANG": "C.UTF-8",
    }


class DesiredEnvironment(object):
    """The engine's environment: `merged` is base, then env_file, then env; `inline` is base
    and env alone (what a systemd unit carries beside its EnvironmentFile=); `overlap` names
    the variables both env and env_file set."""

    def __init__(self, base, from_file, extra):
        self.merged = dict(base)
        self.merged.update(from_file)
        self.merged.update(extra)
        self.inline = dict(base)
        self.inline.update(extra)
        self.overlap = sorted(set(extra) & set(from_file))


def desired_environment(params, check_mode, warn):
    """The DesiredEnvironment, or None when the task does not concern the environment; warn()
    is told what a check run leaves out. Raises EnvironmentProblem.

    Stopping needs no env_file, and a status given neither env nor env_file only reports.
    """
    if params["state"] == "stopped" or (
        params["state"] == "status" and not params["env"] and not params["env_file"]
    ):
        return None
    from_file = {}
    if params["env_file"] and params["env_file_content"] is not None:
        try:
            from_file = parse_env_text(params["env_file_content"], "env_file_content")
        except ValueError as error:
            raise EnvironmentProblem(str(error))
    elif params["env_file"]:
        try:
            from_file = read_env_file(params["env_file"])
        except FileNotFoundError:
            if not check_mode:
                raise EnvironmentProblem("env_file %s does not exist" % params["env_file"])
            # An earlier task of the same check run would have written it.
            warn("env_file %s does not exist yet; its variables are left out" % params["env_file"])
        except (OSError, ValueError) as error:
            raise EnvironmentProblem("env_file: %s" % error)
    extra = dict((key, str(value)) for key, value in params["env"].items())
    return DesiredEnvironment(base_environment(), from_file, extra)
