# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """What runs the collection's engines on a host, and where it keeps them: the options that
    engine_process (which starts and stops one) and engine_retire (which retires those a host no
    longer runs) share."""

    DOCUMENTATION = r"""
options:
  pid_dir:
    description:
      - The folder of the collection's pid files, where an engine's pid file is by default and
        where the collection's engines are found.
    type: path
    default: /run/biv100-serving
  manager:
    description:
      - What runs the engine. V(auto) takes systemd when C(/run/systemd/system) exists,
        else supervisord when C(supervisorctl pid) answers, else V(pidfile), the launcher.
    type: str
    choices: [auto, systemd, supervisord, pidfile]
    default: auto
  systemctl:
    description: The C(systemctl) to use; found on C(PATH) when not given.
    type: path
  supervisorctl:
    description:
      - The C(supervisorctl) to use; found on C(PATH) when not given.
      - It must reach the host's supervisord without arguments (its own configuration file).
    type: path
  supervisor_conf_dir:
    description:
      - The folder supervisord includes program files from. Defaults to the first that exists
        of C(/etc/supervisor/conf.d) and C(/etc/supervisord.d).
    type: path
  stop_timeout:
    description: Seconds between C(SIGTERM) to the engine's process group and C(SIGKILL).
    type: int
    default: 30
"""
