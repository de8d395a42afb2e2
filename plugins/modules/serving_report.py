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
    PNG plots of the releases' figures, a PNG plot per canary analysis, a PNG plot per tuning run
    found in O(tune_dir), and a static C(index.html) that shows them with a table of the releases,
    one of the canary analyses and one per tuning run.
  - The page's verdicts table gives, per release, the states its hosts ended in here and in each
    fleet of O(compare), and the platform's last verdict (recorded by C(record_verdict.yml)),
    marking a release the platform failed that a fleet found good, or passed that a fleet did not
    keep.
    It is shown once a platform verdict is recorded or a fleet is compared.
  - C(score.png) - the weighted throughput score per release and host, with the throughput
    gate's line, both as the figures recorded them (the competition's weights are 0.83 x output
    tok/s + 0.17 x input tok/s, its gate a score of 8000).
  - C(latency.png) - TTFT and TPOT p50, p90 and p99 per release and host.
  - C(quality.png) - the quality score's deviation from the baseline release per release and
    host, with the quality gate's band as the figures recorded it (the competition's is +/-4 %).
  - C(canary-<release>.png) - one per canary analysis the ledger recorded (the C(canary) of the
    canary host's line), named after the release it judged (characters other than letters,
    digits, C(.), C(_) and C(-) replaced by C(_); a later analysis of the same release is
    C(canary-<release>-2.png), and so on). Per metric, a panel of two box plots drawn from the
    quartiles the analysis recorded (p25 to p75, the median, whiskers from the minimum to the
    maximum, the mean), the baseline's beside the canary's, titled with the metric's
    classification, shift and interval (C(score Low -9.2 % [-9.5, -9.0])), with a dashed line
    where the metric's margin from the baseline's median lies; the figure's title gives the
    verdict, the score, the thresholds, the baseline host and release, and the baseline's kind
    (C(same window), or C(historical) - the canary's own figures recorded with that release).
    An analysis on a host of several engine instances is drawn once. A ledger without a canary
    analysis gives no canary plot, and the page says that there is none.
  - C(tune-<run>.png) - one per tuning run, a folder of O(tune_dir) holding the
    C(candidates.jsonl) that C(tune.yml) writes, named after the folder (characters made safe as
    for the canary plots). X is the TTFT p99 in milliseconds, y the weighted score; each
    candidate is placed by the figures of its last round (its record read last), a candidate that
    cleared every gate as a point coloured by that round (the legend gives the round's bench
    length), the incumbent (the host's settings) as a star labelled with its id, one that missed
    a gate as an x at its measured figures, the candidate C(proposal.yml) holds (when it is not
    the incumbent) ringed. The Pareto front - the eligible candidates no other
    one beats on both score and TTFT p99 - is a step line with their ids, the throughput gate a
    dashed line, taken from the candidates' records (C(gate_score), the gate their figures were
    judged against) or, when they do not keep it, from the ledger's figures as C(score.png) draws
    it. The candidates without a point - invalid (never started), failed to start, no figures -
    are listed under the plot with why - the first line of their problems, the last line of the
    engine's log, the gates missed.
    score, output tok/s, TTFT p99, quality, and the gates' verdicts (functional, quality,
    throughput) - one table row per canary analysis - release, canary host, baseline host,
    kind and release, verdict, score, trials, reasons - above its plot, and under C(Tuning runs)
    per run one table row per candidate - id, the settings that differ from the incumbent's,
    status, score, TTFT p99, round and bench length, why - the best eligible candidate, the
    candidate C(proposal.yml) holds with the proposal's header when the run wrote one, and the
    run's plot; without a tuning run the page says that there is none. No JavaScript and
    nothing from elsewhere; the PNG files sit beside it.
  - Releases are in the order they first appear in the ledger. A release and host get one point
    in a plot when the ledger recorded that figure for them (the last line of the pair that has
    it counts); a release without figures is in the table and in no plot. The figures of a line
    whose deploy rolled back belong to the release it rolled back from, which is the one they
    were measured on.
  - A figure measured on the lab's engine stand-in (C(simulated) in the ledger) is drawn hollow,
    named simulated in the plot's title and legend, and marked C((sim)) in the table, as in
    C(LEDGER.md); so is a simulated canary analysis, its boxes hollow, and a simulated
    candidate's point.
  - The same ledger gives byte-identical files (fixed size, DPI and font, matplotlib's defaults
    rather than the machine's C(matplotlibrc), no software or time stamp in the PNG files). A file
    whose bytes would not change is not written, so a second run reports no change. A
    C(canary-*.png) in O(dest) that the ledger no longer has an analysis for, or a
    C(tune-*.png) whose run is no longer in O(tune_dir), is removed; no other file there is
    touched.
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
  tune_dir:
    description:
      - The folder of the tuning runs, C(<tune_dir>/<run>/candidates.jsonl) each, with
        C(proposal.yml) beside it when the run proposed.
      - When not set, C(build/tune) at the project root, where C(tune.yml) writes them; a missing
        C(build/tune) means no tuning run. A folder named here must exist.
      - A last line of a C(candidates.jsonl) cut short (its run was killed while writing it) is
        left out with a warning; any other line that is not a record fails the task, naming the
        file and the line.
    type: path
  compare:
    description:
      - Other fleets' ledger folders (the lab's, C(ledger/lab), say), each named by its folder, whose
        states of each release the page's verdicts table sets beside this fleet's and the
        platform's last verdict, so that a release that passed here and failed there stands out.
      - Each must hold a C(ledger.jsonl).
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - biv100.serving.controller_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.conn
  - ansible.builtin.action_common_attributes.flow
attributes:
  check_mode:
    support: full
    details: Writes and removes nothing, and says which files would change or be removed.
  diff_mode:
    support: none
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

- name: Draw the tuning runs kept in another folder with the fleet's ledger
  biv100.serving.serving_report:
    tune_dir: /srv/tune/biv100
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
  description:
    - The PNG plots - weighted score, latency percentiles, quality deviation, then one per canary
      analysis in the ledger's order (none when the ledger has none), then one per tuning run in
      the order of their names.
  returned: success
  type: list
  elements: str
  sample: [/work/project/build/report/lab/score.png, /work/project/build/report/lab/latency.png,
           /work/project/build/report/lab/quality.png, /work/project/build/report/lab/canary-sub510.png,
           /work/project/build/report/lab/tune-20260101T120000Z.png]
files_changed:
  description: The names of the files that were written (in check mode, that would be).
  returned: success
  type: list
  elements: str
  sample: [index.html, score.png, canary-sub510.png]
files_removed:
  description:
    - The names of the canary and tuning plots removed from O(dest) because the ledger no longer
      has their analysis or O(tune_dir) their run (in check mode, that would be).
  returned: success
  type: list
  elements: str
  sample: [canary-sub509.png]
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
tune_dir:
  description: The folder the tuning runs were looked for in.
  returned: success
  type: str
  sample: /work/project/build/tune
tuning_runs:
  description: The tuning runs in the report, by the names of their folders in O(tune_dir).
  returned: success
  type: list
  elements: str
  sample: [20260101T120000Z]
"""
