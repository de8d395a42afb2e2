# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""lock_refusal: why a run's first round of the fleet lock did not take every host, if it did not."""

from __future__ import annotations


def refusal_of(host, taking, run_id):
    """Why this host's first round is not this run's, or None when the run took the host."""
    if taking is None:
        return "%s: it left the run before its lock was taken" % host
    if taking.get("unreachable"):
        return "%s: unreachable while its lock was taken (%s)" % (host, taking.get("msg") or "no reason given")
    holder = taking.get("holder") or {}
    if holder.get("run_id") == run_id:
        return None
    return "%s: %s" % (host, taking.get("msg") or "the lock could not be taken")


def lock_refusal(hosts, hostvars, run_id, register="lock_taking"):
    """The first refusal in host name order, or an empty string when the run took every host.

    A host's result counts only as this run's lock: the task's own failure is not the host's,
    since the whole run stops on it (the task runs with failed_when false).
    """
    for host in sorted(hosts):
        refusal = refusal_of(host, hostvars[host].get(register), run_id)
        if refusal:
            return refusal
    return ""


class FilterModule:
    def filters(self):
        return {"lock_refusal": lock_refusal}
