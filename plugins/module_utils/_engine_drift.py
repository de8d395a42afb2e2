# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""engine_process's drift: how the running engine's arguments and environment differ from the
desired ones, one sentence per difference.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations


def split_arguments(argv):
    """(positional arguments, {option: [values]}) of an argv; a flag's value is None.

    `--opt=value` and `--opt value` read alike; a token after an option is its value unless
    it is itself an option.
    """
    positional, options = [], {}
    index = 0
    while index < len(argv):
        token = argv[index]
        if not is_option(token):
            positional.append(token)
            index += 1
            continue
        name, sep, value = token.partition("=")
        if not sep:
            following = argv[index + 1] if index + 1 < len(argv) else None
            value = following if following is not None and not is_option(following) else None
            index += value is not None
        options.setdefault(name, []).append(value)
        index += 1
    return positional, options


def is_option(token):
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)  # a negative number is a value
    except ValueError:
        return True
    return False


def shown(value):
    if value is None:
        return "unset"
    return value if value != "" else '""'


def shown_values(values):
    if values is None:
        return "absent"
    return ", ".join("set" if value is None else shown(value) for value in values)


def as_running(running, desired):
    """The desired command as a running engine's argv shows it.

    A launcher at the front of the command that execs the rest (chroot, numactl, taskset, env,
    the lab's in-engine-root) leaves the kernel the command from its program on: when the
    running program is not the desired command's first word but one of its later words, the
    desired command from that word on. The launcher's own words, which the argv cannot show,
    are compared with the launch record (launcher_drift).
    """
    if running and desired and running[0] != desired[0] and running[0] in desired[1:]:
        return desired[desired.index(running[0], 1):]
    return desired


def launcher(command, running):
    """The words at the front of `command` that a running engine's argv does not show."""
    return command[:len(command) - len(as_running(running, command))]


def launcher_drift(launched, running, desired):
    """A launcher at the front of the command that differs from the one the engine was started
    with (`launched`, the launch record's command; None when there is none)."""
    if launched is None or launcher(launched, running) == launcher(desired, running):
        return []
    return ["launcher: running %s, desired %s" % (
        " ".join(launcher(launched, running)) or "none", " ".join(launcher(desired, running)) or "none")]


def argument_drift(running, desired):
    desired = as_running(running, desired)
    running_positional, running_options = split_arguments(running)
    desired_positional, desired_options = split_arguments(desired)
    sentences = []
    if running_positional != desired_positional:
        sentences.append(
            "program and positional arguments: running %s, desired %s"
            % (" ".join(running_positional), " ".join(desired_positional))
        )
    names = list(desired_options) + [
        name for name in running_options if name not in desired_options
    ]
    for name in names:
        if running_options.get(name) != desired_options.get(name):
            sentences.append(
                "argument %s: running %s, desired %s"
                % (
                    name,
                    shown_values(running_options.get(name)),
                    shown_values(desired_options.get(name)),
                )
            )
    return sentences


def environment_drift(running, desired, extra_is_drift):
    names = list(desired)
    if extra_is_drift:
        names += sorted(name for name in running if name not in desired)
    return [
        "env %s: running %s, desired %s"
        % (name, shown(running.get(name)), shown(desired.get(name)))
        for name in names
        if running.get(name) != desired.get(name)
    ]


def drift(observed, desired_command, desired_env, extra_is_drift=True, launched=None):
    """Every difference of the running engine (`observed`: its argv and environment) from the
    desired command and environment; `launched` is the command the engine was started with, as
    its launch record keeps it, when there is one."""
    sentences = []
    if desired_command is not None:
        sentences += launcher_drift(launched, observed["command"], desired_command)
        sentences += argument_drift(observed["command"], desired_command)
    if desired_env is not None:
        sentences += environment_drift(observed["env"], desired_env, extra_is_drift)
    return sentences
