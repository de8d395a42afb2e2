#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_health
short_description: Wait until the vLLM engine serves the configured model
version_added: 0.1.0
description:
  - Polls C(GET /health) until it answers 200; refused and reset connections, timeouts and
    other statuses mean the engine is still loading. Then reads C(GET /v1/models) and checks
    that a card's C(id) is O(served_model_name) and, when O(max_model_len) is given, that the
    card carries it.
  - Loading a large tensor-parallel model takes minutes, hence the long default O(timeout).
  - Only O(url) (C(http://) or C(https://)) is contacted, directly; proxy variables of the
    environment are ignored. O(api_key) goes with the C(/v1/models) request.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  served_model_name:
    description: The model name the engine serves (its C(--served-model-name)).
    type: str
    required: true
  max_model_len:
    description: The context length the model's card must carry.
    type: int
  timeout:
    description: Seconds to wait for the engine in all.
    type: float
    default: 900
  interval:
    description: Seconds between two polls.
    type: float
    default: 2
  pid:
    description: The engine's pid; when that process ends while waiting, the task fails at once.
    type: int
  log_file:
    description:
      - The engine's log. On failure its tail, the lines that say why, is returned in
        RV(log_tail), and the message names the file and the tail's length.
    type: path
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - biv100.serving.engine_endpoint
attributes:
  check_mode:
    support: full
    details:
      - Only reads, so it waits and checks in check mode too.
  diff_mode:
    support: none
seealso:
  - module: biv100.serving.engine_process
"""

EXAMPLES = r"""
- name: Wait until the engine serves qwen3_5 with the full context
  biv100.serving.engine_health:
    url: http://127.0.0.1:8000
    served_model_name: qwen3_5
    max_model_len: 256000
    api_key: "{{ serving_engine_api_key | default(omit) }}"
    pid: "{{ engine.pid }}"
    log_file: "{{ engine.log_file }}"
"""

RETURN = r"""
elapsed:
  description: Seconds from the first poll until the engine was found serving (or the failure).
  returned: always
  type: float
  sample: 143.2
models:
  description: The cards of C(/v1/models).
  returned: when /v1/models answered
  type: list
  elements: dict
  sample:
    - id: qwen3_5
      object: model
      owned_by: vllm
      max_model_len: 256000
msg:
  description:
    - On failure, what failed, on one line; with O(log_file), it ends saying how many lines of
      the log RV(log_tail) holds.
  returned: failure
  type: str
  sample: >-
    engine process 48213 ended while waiting for http://127.0.0.1:8000 (last: connection
    refused); log tail (4 lines of /var/log/biv100-serving/engine.log) in log_tail
log_tail:
  description:
    - The lines of O(log_file) that say why the engine failed, one item each - from its last
      start on (the header C(--- <time> <name> starts) of M(biv100.serving.engine_process)),
      without blank lines, access-log lines of the health polls, progress bars and throughput
      reports, from the last traceback (with the tracebacks chained before it and the error
      line logging it) or else the last block of error lines when there is one.
    - At most 40 lines, of at most 300 characters each; a longer line is cut, ending with how
      many characters were left out, and a longer traceback keeps its first line and its end.
    - The tail is here only, never in the message, so that it is shown once; ansible-core shows
      a failed task's message twice (its error summary and the result), and a list one line per
      item in every result format.
  returned: failure, when O(log_file) is given
  type: list
  elements: str
  sample:
    - ERROR 11-29 18:00:04 [engine.py:412] Engine failed to start
    - "Traceback (most recent call last):"
    - '  File "/usr/local/corex/lib64/python3/dist-packages/vllm/worker/worker.py", line 210, in init_device'
    - "RuntimeError: CUDA error: out of memory"
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._engine_http import (
    EngineClient,
    EngineHttpError,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    is_alive,
    with_log_tail,
)

# The longest a single request may take; a loading engine may accept and not answer.
REQUEST_TIMEOUT = 10

# How much of an unexpected answer a message quotes.
QUOTED_BYTES = 200


def quoted(body):
    return body[:QUOTED_BYTES].decode("utf-8", "replace")


class HealthWait(object):
    """One wait for one engine: the clock, the URL, and failing with the log's tail."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.client = EngineClient(self.params["url"], self.params["api_key"],
                                   connect_timeout=REQUEST_TIMEOUT, read_timeout=REQUEST_TIMEOUT)
        self.base = self.client.url
        self.started = time.monotonic()
        self.deadline = self.started + self.params["timeout"]

    def elapsed(self):
        return round(time.monotonic() - self.started, 1)

    def fail(self, message, **result):
        if self.params["log_file"]:
            message, result["log_tail"] = with_log_tail(message, self.params["log_file"])
        self.module.fail_json(msg=message, elapsed=self.elapsed(), **result)

    def until_healthy(self):
        """Poll /health until it answers 200; fail on timeout or when the engine's pid ends."""
        pid = self.params["pid"]
        last = "no answer yet"
        while True:
            if pid is not None and not is_alive(pid):
                self.fail(
                    "engine process %d ended while waiting for %s (last: %s)"
                    % (pid, self.base, last)
                )
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.fail(
                    "engine at %s not healthy after %g s (last: %s)"
                    % (self.base, self.params["timeout"], last)
                )
            seconds = min(REQUEST_TIMEOUT, remaining)
            try:
                # vLLM answers /health without the key.
                answer = self.client.request("GET", "/health", auth=False,
                                             connect_timeout=seconds, read_timeout=seconds)
                if answer.status == 200:
                    return
                last = "HTTP %d" % answer.status
            except EngineHttpError as error:
                last = error.reason
            time.sleep(max(0, min(self.params["interval"], self.deadline - time.monotonic())))

    def model_cards(self):
        """The cards of /v1/models; an engine that is healthy answers it at once."""
        try:
            answer = self.client.request("GET", "/v1/models")
        except EngineHttpError as error:
            self.fail("engine at %s answered /health but not /v1/models (%s)" % (self.base, error.reason))
        if answer.status != 200:
            self.fail(str(answer.status_error()))
        try:
            return json.loads(answer.read())["data"]
        except (ValueError, KeyError, TypeError):
            self.fail("GET %s did not answer a model list: %s" % (answer.url, quoted(answer.read())))

    def check(self, cards):
        """Fail naming what is wrong when the served model's card is missing or says otherwise."""
        name = self.params["served_model_name"]
        card = next((card for card in cards if card.get("id") == name), None)
        if card is None:
            served = ", ".join(str(card.get("id")) for card in cards) or "none"
            self.fail("served model %s not in /v1/models (got: %s)" % (name, served), models=cards)
        wanted = self.params["max_model_len"]
        if wanted is not None and card.get("max_model_len") != wanted:
            self.fail(
                "%s: max_model_len %s, expected %d" % (name, card.get("max_model_len"), wanted),
                models=cards,
            )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", default="http://127.0.0.1:8000"),
            served_model_name=dict(type="str", required=True),
            max_model_len=dict(type="int"),
            api_key=dict(type="str", no_log=True),
            timeout=dict(type="float", default=900),
            interval=dict(type="float", default=2),
            pid=dict(type="int"),
            log_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    try:
        wait = HealthWait(module)
    except ValueError as error:
        module.fail_json(msg=str(error))
    wait.until_healthy()
    cards = wait.model_cards()
    wait.check(cards)
    module.exit_json(changed=False, elapsed=wait.elapsed(), models=cards)


if __name__ == "__main__":
    main()
