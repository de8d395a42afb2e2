# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The TCP ports the host listens on and the processes that hold them: the listening sockets of
/proc/net/tcp and tcp6 (the network namespace of the module, which is the host's), each matched
by its inode to the processes whose descriptors hold it.

Runs on the host: standard library only, Python 3.8, Linux /proc.
"""

from __future__ import annotations

import os
import socket
import struct

TCP_TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))
# The st column of a socket in the LISTEN state (include/net/tcp_states.h).
LISTEN = "0A"


def socket_address(text, family):
    """The address of a /proc/net/tcp line: hex digits of 32-bit words, each in the host's
    byte order."""
    words = [int(text[start:start + 8], 16) for start in range(0, len(text), 8)]
    return socket.inet_ntop(family, b"".join(struct.pack("=I", word) for word in words))


def listening_sockets(tables=TCP_TABLES):
    """{socket inode: (address, port)} of every listening TCP socket."""
    found = {}
    for path, family in tables:
        try:
            with open(path) as stream:
                lines = stream.read().splitlines()[1:]
        except FileNotFoundError:
            continue  # a kernel without IPv6
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            found[int(fields[9])] = (socket_address(address, family), int(port, 16))
    return found


def socket_holders(inodes):
    """{inode: [pid, ...]} of the processes holding each of the sockets; a process whose
    descriptors cannot be read (another user's, to a module that is not root) holds none."""
    wanted = dict(("socket:[%d]" % inode, inode) for inode in inodes)
    holders = {}
    if not wanted:
        return holders
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        folder = "/proc/%s/fd" % entry
        try:
            descriptors = os.listdir(folder)
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                inode = wanted.get(os.readlink("%s/%s" % (folder, descriptor)))
            except OSError:
                continue  # closed meanwhile
            if inode is not None and int(entry) not in holders.setdefault(inode, []):
                holders[inode].append(int(entry))
    return holders


def listening_ports(tables=TCP_TABLES):
    """Every listening TCP socket, by port: its port, address and the pids holding it (sorted;
    empty when no process could be named)."""
    sockets = listening_sockets(tables)
    holders = socket_holders(sockets)
    listeners = [
        {"port": port, "address": address, "pids": sorted(holders.get(inode, []))}
        for inode, (address, port) in sockets.items()
    ]
    return sorted(listeners, key=lambda listener: (listener["port"], listener["address"]))
