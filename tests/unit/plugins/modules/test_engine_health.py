"""biv100.serving.engine_health against the engine stand-in of the engine_process tests, started
through engine_process on a free loopback port."""

from __future__ import annotations

import subprocess
import time

import pytest
import test_engine_process as stand_in

from ansible_collections.biv100.serving.plugins.modules import engine_health

# The stand-in's fixtures, shared with the engine_process tests.
engine = stand_in.engine
server_script = stand_in.server_script


@pytest.fixture
def health(run_module):
    """health(url, **args) runs the module with a short timeout and interval."""

    def run(url, **args):
        defaults = dict(url=url, served_model_name="qwen3_5", timeout=10, interval=0.1)
        return run_module(engine_health, dict(defaults, **args))

    return run


@pytest.fixture
def serving(engine):
    """serving(*server arguments) starts the stand-in; returns (its URL, the start's result)."""

    def start(*arguments):
        started = engine(*arguments)
        assert not started.failed, started.result["msg"]
        return "http://127.0.0.1:%d" % engine.port, started.result

    return start


def test_a_loading_engine_is_waited_for_until_it_serves_the_model(serving, health):
    url, started = serving("--ready-after", "1", "--max-model-len", "256000")

    failed, result = health(url, max_model_len=256000, pid=started["pid"], _ansible_check_mode=True)

    assert not failed and result["changed"] is False
    assert result["elapsed"] >= 0.7  # the start check took the first 0.3 s of the loading
    assert result["models"] == [{"id": "qwen3_5", "object": "model", "max_model_len": 256000}]


def test_another_served_model_fails_naming_what_is_served(serving, health):
    url, _started = serving("--served-model-name", "other")

    failed, result = health(url)

    assert failed and result["msg"] == "served model qwen3_5 not in /v1/models (got: other)"
    assert result["models"][0]["id"] == "other"


def test_another_max_model_len_fails_naming_both(serving, health):
    url, _started = serving("--max-model-len", "131072")

    failed, result = health(url, max_model_len=256000)

    assert failed and result["msg"] == "qwen3_5: max_model_len 131072, expected 256000"


def test_the_api_key_is_sent_to_v1_models(serving, health):
    url, _started = serving("--api-key", "s3cret")

    assert not health(url, api_key="s3cret").failed
    failed, result = health(url, api_key="wrong")
    assert failed and result["msg"].startswith("GET %s/v1/models answered HTTP 401" % url)


def test_an_engine_never_healthy_times_out_with_the_log_tail(serving, health, engine):
    url, started = serving("--ready-after", "600")

    failed, result = health(url, timeout=1, pid=started["pid"], log_file=str(engine.log_file))

    assert failed and result["msg"].startswith(
        "engine at %s not healthy after 1 s (last: HTTP 503); log tail (%s):\n"
        % (url, engine.log_file)
    )
    assert "serving on port %d" % engine.port in "\n".join(result["log_tail"])
    assert '"GET /health HTTP/1.1" 503' in result["log_tail"][-1]


def test_nothing_listening_is_reported_as_connection_refused(health):
    url = "http://127.0.0.1:%d" % stand_in.free_port()

    failed, result = health(url, timeout=0.5)

    assert (
        failed
        and result["msg"] == "engine at %s not healthy after 0.5 s (last: connection refused)" % url
    )


def test_an_engine_that_ended_fails_at_once(health):
    ended = subprocess.Popen(["true"])
    ended.wait()
    begun = time.monotonic()

    failed, result = health("http://127.0.0.1:%d" % stand_in.free_port(), timeout=30, pid=ended.pid)

    assert failed and result["msg"].startswith("engine process %d ended while waiting" % ended.pid)
    assert time.monotonic() - begun < 2
