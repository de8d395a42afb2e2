#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_probe
short_description: Send the functional probes' requests to the engine from the host itself
version_added: 0.1.0
description:
  - Sends each request of O(requests) to the engine at O(url), in order, from the host, so the
    engine's port need not be reachable from the controller, and returns what came back
    (status, JSON body, for streams the events assembled per choice and the final usage) with
    the latency of each.
  - With O(suites), the action of the same name runs functional probe suites instead - data
    files of probes, each a request and jmespath expectations over its answer (the format is
    described in C(plugins/plugin_utils/_probe_suite.py)). It loads and checks the suites on the
    controller (a bad suite fails the task before any request is sent), sends the selected
    probes' requests through this module in one call, judges each answer on the controller,
    and fails the task when a probe fails, naming the first, the expectation it missed and the
    answer.
  - Expectations read the answer and the probe's own C(request), and may call, besides
    jmespath's functions, C(from_json), C(json_valid), C(schema_ok), C(schema_errors) (JSON
    Schema of the draft a schema's C($schema) names, else 2020-12, checked with the jsonschema
    package on the controller), C(regex_match) and C(regex_fullmatch), so that structured output
    and tool-call arguments are judged by parsing and validating them.
  - Without O(suites) the module only sends O(requests) and judges nothing.
  - Only C(http://) URLs are probed (the engine's local address).
  - Requests are read-only for the engine, so they are also sent in check mode.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  requests:
    description:
      - The requests, sent in this order.
      - Give either O(requests) or O(suites).
    type: list
    elements: dict
    suboptions:
      name:
        description: The probe's name, returned with its answer.
        type: str
        required: true
      method:
        description: The HTTP method.
        type: str
        default: GET
      path:
        description: The path under O(url).
        type: str
        required: true
      body:
        description:
          - A JSON body.
          - 'An object C({"$repeat": text, "times": N}) anywhere in it stands for the text
            repeated N times, so long prompts are made on the host and never travel.'
        type: raw
      raw_body:
        description: A body sent as it is (for requests that are not valid JSON).
        type: str
      stream:
        description: Read the answer as server-sent events.
        type: bool
        default: false
      timeout:
        description: Seconds the answer may take.
        type: float
        default: 60
      concurrent:
        description: How many copies of the request are sent at once; each answer is in RV(results[].responses).
        type: int
        default: 1
      repeat:
        description: How many times the request is sent one after the other; each answer is in RV(results[].responses).
        type: int
        default: 1
      auth:
        description: Send O(api_key) as the bearer token.
        type: bool
        default: true
  excerpt_bytes:
    description: How much of a body that is not JSON is returned.
    type: int
    default: 2000
  suites:
    description:
      - Probe suite files, and folders whose C(*.yml) and C(*.yaml) files are suites, on the
        controller; a relative path is relative to the current folder.
      - Probe names must be unique across the suites.
      - Give either O(suites) or O(requests).
    type: list
    elements: path
  values:
    description:
      - What C(${name}) in the suites' requests and expectations stands for
        (C(served_model_name), C(max_model_len), ...); a name a probe uses and this does not
        give fails the task.
      - Read only with O(suites).
    type: dict
    default: {}
  tags:
    description:
      - Run only the probes with one of these tags; all when empty.
      - Read only with O(suites).
    type: list
    elements: str
    default: []
  skip:
    description:
      - Names of probes not to run; a name no probe has fails the task.
      - Read only with O(suites).
    type: list
    elements: str
    default: []
  skip_tags:
    description:
      - Run none of the probes with one of these tags.
      - Read only with O(suites).
    type: list
    elements: str
    default: []
  checks:
    description:
      - Run only the probes that check one of these (a probe's C(checks)), all when empty.
      - C(protocol) probes check the server's side of the API, which any model's engine must get
        right; C(model) probes check what a trained model says. A host whose model has random
        weights is gated on C(protocol) alone.
      - Read only with O(suites).
    type: list
    elements: str
    choices: [protocol, model]
    default: []
  results_file:
    description:
      - A JSON file on the controller to write the run to (the host, the summary, every
        verdict and every answer), whole or not at all; its folder is made when missing.
      - A relative path is under the project folder, where the C(ansible.cfg) in use is (the
        current folder without one), never inside the collection.
      - Read only with O(suites).
    type: path
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - biv100.serving.engine_endpoint
attributes:
  action:
    support: full
    details:
      - The action of the same name loads the suites and judges the answers on the controller.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details:
      - The requests read nothing but the engine's answers; they are sent in check mode too.
  diff_mode:
    support: none
seealso:
  - module: biv100.serving.engine_health
"""

EXAMPLES = r"""
- name: Ask the engine for its models and one short answer
  biv100.serving.engine_probe:
    url: http://127.0.0.1:8000
    requests:
      - name: models
        path: /v1/models
      - name: chat
        method: POST
        path: /v1/chat/completions
        body: {model: qwen3_5, messages: [{role: user, content: Hi}], max_tokens: 8}
  register: probed

- name: Run the default functional suite and the team's own, leaving out the slow probes
  biv100.serving.engine_probe:
    suites:
      - "{{ playbook_dir }}/files/probes"
      - "{{ playbook_dir }}/probes/team.yml"
    values:
      served_model_name: qwen3_5
      max_model_len: 256000
    skip_tags: [slow]
    url: http://127.0.0.1:8000
    api_key: "{{ engine_api_key }}"
    results_file: "build/probes/{{ inventory_hostname }}.json"
  register: probe_result
"""

RETURN = r"""
results:
  description: One answer per request, in order.
  returned: without O(suites)
  type: list
  elements: dict
  contains:
    name:
      description: The probe's name.
      type: str
    status:
      description: The HTTP status; null when no answer came.
      type: int
    content_type:
      description: The answer's Content-Type.
      type: str
    headers:
      description:
        - The answer's headers, names lower-cased (a repeated header's values joined with
          C(, )); empty when no answer came.
        - How the engine tells about itself beyond the body, for instance the lab's stand-in
          marking its answers with C(x-biv100-simulated).
      type: dict
      version_added: 0.2.0
    body:
      description: The answer's JSON; null when it was not JSON (or a stream).
      type: raw
    text:
      description: The start of an answer that was not JSON.
      type: str
    stream:
      description:
        - For streams, the events assembled.
        - C(choices) holds per index its C(content), C(reasoning_content), C(tool_calls) with
          C(name) and C(arguments) joined, and C(finish_reason).
        - C(usage) is that of the last event that had one; C(done) says the C([DONE]) marker
          came; C(event_count) counts the events and C(events) holds the first 50, parsed;
          C(error) is the error event when the server sent one.
      type: dict
    latency_ms:
      description: Milliseconds from sending to the whole answer.
      type: float
    error:
      description: Why no answer came (refused, timed out); null when one came.
      type: str
    responses:
      description:
        - With O(requests[].concurrent) or O(requests[].repeat) above 1, every copy's answer
          (each without this key); the other keys are the first copy's.
      type: list
      elements: dict
summary:
  description: How many of the probes passed.
  returned: with O(suites)
  type: str
  sample: 49/49 probes passed
probes:
  description: One verdict per probe run, in the suites' order.
  returned: with O(suites)
  type: list
  elements: dict
  contains:
    name:
      description: The probe's name.
      type: str
    guards:
      description: The failure the probe guards against.
      type: str
    passed:
      description: Whether the answer met every expectation.
      type: bool
    latency_ms:
      description: Milliseconds the answer took; null when none came.
      type: float
    failed_expectation:
      description: The first expectation the answer did not meet; null when it passed.
      type: str
    excerpt:
      description: The start of the answer that failed (status, error, body, stream); null when it passed.
      type: str
table:
  description: One line per probe - C(pass) or C(FAIL), its name, its latency.
  returned: with O(suites)
  type: list
  elements: str
  sample: ["pass  models      3 ms", "FAIL  n-two      12 ms"]
failed_probes:
  description: The names of the probes that failed.
  returned: with O(suites)
  type: list
  elements: str
results_file:
  description: The file the run was written to; null without O(results_file).
  returned: with O(suites)
  type: str
"""

import json
import threading
import time
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._engine_http import (
    EngineClient,
    EngineHttpError,
)


KEPT_EVENTS = 50


def client_for(url, api_key, timeout):
    if urlsplit(url).scheme != "http":
        raise ValueError("url %s: only http:// is probed (the engine's local address)" % url)
    return EngineClient(url, api_key, connect_timeout=timeout, read_timeout=timeout)


def new_choice(index):
    return {
        "index": index,
        "content": "",
        "reasoning_content": "",
        "tool_calls": [],
        "finish_reason": None,
        "role": None,
    }


def add_tool_call_delta(choice, delta):
    index = delta.get("index", len(choice["tool_calls"]))
    while len(choice["tool_calls"]) <= index:
        choice["tool_calls"].append({"id": None, "name": "", "arguments": ""})
    call = choice["tool_calls"][index]
    function = delta.get("function") or {}
    call["id"] = delta.get("id") or call["id"]
    call["name"] += function.get("name") or ""
    call["arguments"] += function.get("arguments") or ""


def assemble(events):
    """The choices, usage and error of a stream's parsed events."""
    choices = {}
    usage = None
    error = None
    for event in events:
        if not isinstance(event, dict):
            continue
        if "error" in event:
            error = event["error"]
        if event.get("usage"):
            usage = event["usage"]
        for part in event.get("choices") or []:
            choice = choices.setdefault(part.get("index", 0), new_choice(part.get("index", 0)))
            delta = part.get("delta") or {}
            choice["role"] = delta.get("role") or choice["role"]
            choice["content"] += delta.get("content") or ""
            choice["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                add_tool_call_delta(choice, call)
            choice["finish_reason"] = part.get("finish_reason") or choice["finish_reason"]
    return [choices[index] for index in sorted(choices)], usage, error


def read_stream(answer):
    """The answer's events, parsed, until [DONE] or the end of the answer."""
    events = []
    for event in answer.events():
        try:
            events.append(json.loads(event.data))
        except ValueError:
            events.append({"unparsed": event.data})
    choices, usage, error = assemble(events)
    return {
        "choices": choices,
        "usage": usage,
        "error": error,
        "done": answer.done,
        "event_count": len(events),
        "events": events[:KEPT_EVENTS],
    }


def expand_repeats(value):
    """The body with every {"$repeat": text, "times": N} replaced by the repeated text."""
    if isinstance(value, dict):
        if set(value) == {"$repeat", "times"}:
            return str(value["$repeat"]) * int(value["times"])
        return dict((key, expand_repeats(item)) for key, item in value.items())
    if isinstance(value, list):
        return [expand_repeats(item) for item in value]
    return value


def send(url, api_key, request, excerpt_bytes):
    """One request and its answer as a result dict; never raises for the engine's failures."""
    result = {
        "name": request["name"],
        "status": None,
        "content_type": None,
        "headers": {},
        "body": None,
        "text": None,
        "stream": None,
        "latency_ms": None,
        "error": None,
    }
    payload = None
    if request.get("raw_body") is not None:
        payload = request["raw_body"].encode("utf-8")
    elif request.get("body") is not None:
        payload = json.dumps(expand_repeats(request["body"])).encode("utf-8")
    started = time.monotonic()
    try:
        client = client_for(url, api_key, request.get("timeout") or 60)
        with client.open((request.get("method") or "GET").upper(), request["path"], data=payload,
                         auth=request.get("auth", True)) as answer:
            result["status"] = answer.status
            result["content_type"] = answer.header("Content-Type")
            for header, value in answer.headers:
                header = header.lower()
                result["headers"][header] = (
                    result["headers"][header] + ", " + value if header in result["headers"] else value
                )
            if request.get("stream") and answer.status == 200:
                result["stream"] = read_stream(answer)
            else:
                data = answer.read()
                try:
                    result["body"] = json.loads(data.decode("utf-8")) if data else None
                except ValueError:
                    result["text"] = data[:excerpt_bytes].decode("utf-8", "replace")
    except EngineHttpError as error:
        result["error"] = error.reason
    except ValueError as error:
        result["error"] = str(error)
    result["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
    return result


def send_copies(url, api_key, request, excerpt_bytes):
    """The request sent once, `repeat` times in a row, or `concurrent` times at once."""
    concurrent = request.get("concurrent") or 1
    repeat = request.get("repeat") or 1
    if concurrent <= 1 and repeat <= 1:
        return send(url, api_key, request, excerpt_bytes)
    if concurrent <= 1:
        answers = [send(url, api_key, request, excerpt_bytes) for _copy in range(repeat)]
    else:
        answers = [None] * concurrent
        start = threading.Barrier(concurrent)

        def one(slot):
            start.wait()
            answers[slot] = send(url, api_key, request, excerpt_bytes)

        threads = [threading.Thread(target=one, args=(slot,)) for slot in range(concurrent)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    result = dict(answers[0])
    result["responses"] = answers
    result["latency_ms"] = max(answer["latency_ms"] for answer in answers)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", default="http://127.0.0.1:8000"),
            api_key=dict(type="str", no_log=True),
            requests=dict(
                type="list",
                elements="dict",
                options=dict(
                    name=dict(type="str", required=True),
                    method=dict(type="str", default="GET"),
                    path=dict(type="str", required=True),
                    body=dict(type="raw"),
                    raw_body=dict(type="str"),
                    stream=dict(type="bool", default=False),
                    timeout=dict(type="float", default=60),
                    concurrent=dict(type="int", default=1),
                    repeat=dict(type="int", default=1),
                    auth=dict(type="bool", default=True),
                ),
            ),
            excerpt_bytes=dict(type="int", default=2000),
            # Read by the action of the same name, which sends the module only the requests it
            # makes of them; here so that the documentation is checked against one spec.
            suites=dict(type="list", elements="path"),
            values=dict(type="dict", default={}),
            tags=dict(type="list", elements="str", default=[]),
            skip=dict(type="list", elements="str", default=[]),
            skip_tags=dict(type="list", elements="str", default=[]),
            checks=dict(type="list", elements="str", default=[], choices=["protocol", "model"]),
            results_file=dict(type="path"),
        ),
        required_one_of=[("requests", "suites")],
        mutually_exclusive=[("requests", "suites")],
        supports_check_mode=True,
    )
    params = module.params
    results = [
        send_copies(params["url"], params["api_key"], request, params["excerpt_bytes"])
        for request in params["requests"]
    ]
    answered = sum(1 for result in results if result["error"] is None)
    module.exit_json(
        changed=False,
        results=results,
        msg="%d of %d requests answered" % (answered, len(results)),
    )


if __name__ == "__main__":
    main()
