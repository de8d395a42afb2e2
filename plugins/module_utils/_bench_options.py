# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options of biv100.serving.engine_bench, as its documentation lists them: one spec for the
host module, which validates what the action sends it, and for the action, which validates the
task (validate-modules checks the documentation against it).

Runs on the host too: standard library only, Python 3.8.
"""

from __future__ import annotations

# Each option given a workload or a request list, never both.
REQUIRED_ONE_OF = [("requests", "workload")]
MUTUALLY_EXCLUSIVE = [("requests", "workload")]


def argument_spec():
    """Made anew for each validation: it fills the defaults of suboptions into the default dicts
    themselves."""
    return dict(
        url=dict(type="str", default="http://127.0.0.1:8000"),
        api_key=dict(type="str", no_log=True),
        api_key_env_file=dict(type="str"),
        served_model_name=dict(type="str", required=True),
        requests=dict(type="list", elements="dict"),
        warmup=dict(type="int", default=0),
        concurrency=dict(type="int"),
        max_num_seqs=dict(type="int"),
        duration_seconds=dict(type="float"),
        timeout=dict(type="float", default=600),
        # A path on the host (the action validates it as text: it is expanded there, never on
        # the controller).
        progress_file=dict(type="path"),
        # The competition's bounds have no default here: the gates role passes them.
        weights=dict(type="dict", required=True, options=dict(
            output=dict(type="float", required=True),
            input=dict(type="float", required=True),
        )),
        # Read by the action, which sends the module only the requests it makes of them.
        workload=dict(type="str"),
        datasets=dict(type="dict", default={}),
        workload_factor=dict(type="float", default=1.0),
        # Required by the action, which alone reads it.
        gate=dict(type="float"),
        # Read by the action: the throughput gate's latency limits (plugin_utils/_objective.py).
        latency=dict(type="dict"),
        max_failed_fraction=dict(type="float", default=0.05),
        release=dict(type="str"),
        results_dir=dict(type="path"),
        label=dict(type="str"),
        compare_with=dict(type="dict", options=dict(
            release=dict(type="str", required=True),
            figures=dict(type="dict", required=True),
        )),
        poll_seconds=dict(type="float", default=5),
        quality=dict(type="dict"),
        # Read by the action: start the measurement and return its job (detach), or follow the
        # job a detached call returned (attach), so that one task list measures two hosts at once.
        detach=dict(type="bool", default=False),
        attach=dict(type="dict", options=dict(
            dir=dict(type="str", required=True),
            pid=dict(type="int", required=True),
            started=dict(type="str", required=True),
            label=dict(type="str", required=True),
        )),
    )
