# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""lock_round: which hosts a run's first round of the fleet lock took, and why it did not take
them all, if it did not."""

from __future__ import annotations


def refusal_of(host, taking, run_id):
    """Why this host's first round is not this run's, or None when the run took the host."""
    if taking.get("unreachable"):
        return "%s: unreachable while its lock was taken (%s)" % (host, taking.get("msg") or "no reason given")
    holder = taking.get("holder") or {}
    if holder.get("run_id") == run_id:
        return None
    return "%s: %s" % (host, taking.get("msg") or "the lock could not be taken")


def lock_round(hosts, hostvars, run_id, register="lock_taking"):
    """{taken: the hosts the run took, by name; refusal: the first refusal in host name order,
    empty when the run took every host that took part}.

    A host with no result of the round (out of the play before it) or a skipped one (it takes
    no part) is in neither.
    """
    taken, refusals = [], []
    for host in sorted(hosts):
        taking = hostvars[host].get(register)
        if not isinstance(taking, dict) or taking.get("skipped"):
            continue
        refusal = refusal_of(host, taking, run_id)
        if refusal:
            refusals.append(refusal)
        else:
            taken.append(host)
    return {"taken": taken, "refusal": refusals[0] if refusals else ""}


class FilterModule:
    def filters(self):
        return {"lock_round": lock_round}
