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
module: serving_report
short_description: Draw a fleet's deployment ledger - plots of every release's figures and a page
version_added: 0.2.0
description:
  - Reads the fleet's deployment ledger (C(ledger.jsonl), written by the
    P(biv100.serving.ledger#callback) callback) on the controller and renders into O(dest) three
    PNG plots and a static C(index.html) that shows them with a table of the releases.
  - C(score.png) - the weighted throughput score per release and host, with the throughput
    gate's line, both as the figures recorded them (the competition's weights are 0.83 x output
    tok/s + 0.17 x input tok/s, its gate a score of 8000).
  - C(latency.png) - TTFT and TPOT p50, p90 and p99 per release and host.
  - C(quality.png) - the quality score's deviation from the baseline release per release and
    host, with the quality gate's band as the figures recorded it (the competition's is +/-4 %).
  - C(index.html) - the plots, and one table row per release and host - release, host, state,
    score, output tok/s, TTFT p99, quality, and the gates' verdicts (functional, quality,
    throughput). No JavaScript and nothing from elsewhere; the PNG files sit beside it.
  - Releases are in the order they first appear in the ledger. A release and host get one point
    in a plot when the ledger recorded that figure for them (the last line of the pair that has
    it counts); a release without figures is in the table and in no plot. The figures of a line
    whose deploy rolled back belong to the release it rolled back from, which is the one they
    were measured on.
  - A figure measured on the lab's engine stand-in (C(simulated) in the ledger) is drawn hollow,
    named simulated in the plot's title and legend, and marked C((sim)) in the table, as in
    C(LEDGER.md).
  - The same ledger gives byte-identical files (fixed size, DPI and font, matplotlib's defaults
    rather than the machine's C(matplotlibrc), no software or time stamp in the PNG files). A file
    whose bytes would not change is not written, so a second run reports no change.
  - Nothing runs on a host and no connection is opened; C(playbooks/report.yml) (C(make report))
    runs it on C(localhost) with any inventory.
requirements:
  - matplotlib on the controller (pinned in the project's C(requirements.txt))
options:
  ledger_dir:
    description:
      - The folder of C(ledger.jsonl).
      - When not set, the folder the ledger callback uses in the same run - the variable
        C(serving_ledger_dir) as the task's host sees it, then C(BIV100_LEDGER_DIR), then C(dir)
        under C([biv100_ledger]) in C(ansible.cfg), then C(ledger/<fleet>) at the project root,
        the fleet being the name of the first inventory folder (C(ledger/lab) for
        C(-i inventory/lab)).
    type: path
  dest:
    description:
      - The folder the report is written to, created if needed.
      - When not set, C(build/report/<fleet>) at the project root (the folder of the project's
        C(ansible.cfg)), the fleet named as for the ledger.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.conn
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: The action of the same name does all the work on the controller.
  async:
    support: none
  become:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Writes nothing, and says which files would change.
  connection:
    support: none
  delegation:
    support: none
  diff_mode:
    support: none
  platform:
    support: full
    platforms: all
    details: Runs on the controller whatever the host is.
seealso:
  - plugin: biv100.serving.ledger
    plugin_type: callback
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Draw the fleet's ledger into build/report/<fleet>/
  biv100.serving.serving_report:

- name: Draw another ledger elsewhere
  biv100.serving.serving_report:
    ledger_dir: /srv/ledgers/biv100
    dest: /srv/www/biv100-report
"""

RETURN = r"""
ledger:
  description: The ledger file that was read.
  returned: success
  type: str
  sample: /work/project/ledger/lab/ledger.jsonl
dest:
  description: The folder of the report.
  returned: success
  type: str
  sample: /work/project/build/report/lab
index:
  description: The report's page.
  returned: success
  type: str
  sample: /work/project/build/report/lab/index.html
plots:
  description: The PNG plots - weighted score, latency percentiles, quality deviation.
  returned: success
  type: list
  elements: str
  sample: [/work/project/build/report/lab/score.png, /work/project/build/report/lab/latency.png,
           /work/project/build/report/lab/quality.png]
files_changed:
  description: The names of the files that were written (in check mode, that would be).
  returned: success
  type: list
  elements: str
  sample: [index.html, score.png]
releases:
  description: The releases in the report, in the order they first appear in the ledger.
  returned: success
  type: list
  elements: str
  sample: [sub168, sub510, sub511]
hosts:
  description: The hosts in the report.
  returned: success
  type: list
  elements: str
  sample: [lab-h1, lab-h2]
"""
