"""biv100.serving.engine_health against the engine stand-in of the engine_process tests, started
through engine_process on a free loopback port."""

from __future__ import annotations

import json
import re
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
    """health(url, **args) runs the module with a short interval, and a timeout that only a
    failure waits out (a loaded machine takes seconds to start the stand-in's Python)."""

    def run(url, **args):
        defaults = dict(url=url, served_model_name="qwen3_5", timeout=60, interval=0.1)
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
    assert result["elapsed"] >= 1  # the loading lasted a second from the module's first poll
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
    # Listening before the 1 s wait begins, however slowly a loaded machine starts its Python.
    stand_in.wait_for_log_line(engine.log_file, "serving on port %d" % engine.port)

    failed, result = health(url, timeout=1, pid=started["pid"], log_file=str(engine.log_file))

    tail = result["log_tail"]
    assert failed and result["msg"] == (
        "engine at %s not healthy after 1 s (last: HTTP 503); log tail (%d lines of %s) in log_tail"
        % (url, len(tail), engine.log_file)
    )
    assert " vllm starts: " in tail[0] and tail[-1].startswith("serving on port %d" % engine.port)
    # The stand-in answered every poll with an access line; none of them says why.
    assert '"GET /health HTTP/1.1" 503' in engine.log_file.read_text()
    assert not any("GET /health" in line for line in tail)


# --- the log tail of a failed start --------------------------------------------------------

# A start that dies as vLLM's do: its header, loading with progress bars redrawn by carriage
# returns, the health polls' access lines (uvicorn's and http.server's), a logged exception.
DYING_START = [
    "INFO 11-29 17:59:00 [api_server.py:1805] an earlier engine's line",
    "--- 2026-11-29T18:00:00Z vllm starts: /usr/local/corex/bin/python3 -m "
    "vllm.entrypoints.openai.api_server --model=/opt/models/qwen3_5",
    "INFO 11-29 18:00:01 [api_server.py:1805] vLLM API server version 0.10.1.1",
    "",
    "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
    "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.50it/s]",
    'INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 503 Service Unavailable',
    "   ",
    "ERROR 11-29 18:00:04 [engine.py:412] Engine failed to start",
    "Traceback (most recent call last):",
    '  File "/usr/local/corex/lib64/python3/dist-packages/vllm/worker/worker.py", line 210, in '
    "init_device",
    "    torch.cuda.set_device(self.device)",
    "RuntimeError: CUDA error: out of memory; tried to allocate " + "1 GiB, " * 120,
    '127.0.0.1 - - [29/Nov/2026 18:00:05] "GET /health HTTP/1.1" 503 -',
    'INFO:     127.0.0.1:51236 - "GET /v1/models HTTP/1.1" 200 OK',
    "",
]


@pytest.fixture
def dead_engine(tmp_path, health):
    """dead_engine(log lines) -> the result of waiting for an engine that has already ended,
    with that log."""

    def wait(lines):
        log_file = tmp_path / "engine.log"
        log_file.write_text("\n".join(lines) + "\n")
        ended = subprocess.Popen(["true"])
        ended.wait()
        url = "http://127.0.0.1:%d" % stand_in.free_port()
        failed, result = health(url, pid=ended.pid, log_file=str(log_file))
        assert failed and result["msg"].startswith("engine process %d ended" % ended.pid)
        return result

    return wait


def test_the_tail_starts_at_the_logged_exception_and_its_traceback(dead_engine):
    tail = dead_engine(DYING_START)["log_tail"]

    assert tail[:3] == [
        "ERROR 11-29 18:00:04 [engine.py:412] Engine failed to start",
        "Traceback (most recent call last):",
        '  File "/usr/local/corex/lib64/python3/dist-packages/vllm/worker/worker.py", line 210, '
        "in init_device",
    ]
    assert tail[3] == "    torch.cuda.set_device(self.device)"
    assert tail[4].startswith("RuntimeError: CUDA error: out of memory") and len(tail) == 5


def test_access_lines_progress_bars_and_blank_lines_are_left_out(dead_engine):
    tail = dead_engine(DYING_START)["log_tail"]

    assert not any("GET /health" in line or "GET /v1/models" in line for line in tail)
    assert not any("Completed |" in line for line in tail)
    assert all(line.strip() for line in tail)


def test_a_long_line_is_cut_to_300_characters_saying_so(dead_engine):
    error = dead_engine(DYING_START + ["ValueError: " + "v" * 1000])["log_tail"][-1]

    assert len(error) == 300
    assert error.startswith("ValueError: vvv") and error.endswith(" more characters]")
    left_out = int(error.rsplit("[... ", 1)[1].split()[0])
    assert len(error.split(" [... ")[0]) + left_out == len("ValueError: " + "v" * 1000)


def test_the_tail_is_shown_once_in_log_tail_and_the_message_is_one_line(dead_engine):
    result = dead_engine(DYING_START)

    assert "\n" not in result["msg"]
    assert re.search(r"; log tail \(5 lines of /\S+/engine\.log\) in log_tail$", result["msg"])
    assert json.dumps(result).count("Traceback (most recent call last)") == 1
    assert "an earlier engine's line" not in json.dumps(result)


def test_without_an_error_the_tail_is_the_last_lines_from_the_start_on(dead_engine):
    polled = []
    for number in range(60):
        polled += ["INFO loading step %d" % number, '"GET /health HTTP/1.1" 503 -']

    tail = dead_engine(DYING_START[:3] + polled)["log_tail"]

    assert tail == ["INFO loading step %d" % number for number in range(20, 60)]


def test_a_traceback_longer_than_the_tail_keeps_its_start_and_its_end(dead_engine):
    frames = ['  File "frame%d.py", line 1, in f' % number for number in range(60)]

    tail = dead_engine(DYING_START[:3] + ["Traceback (most recent call last):"] + frames
                       + ["KeyError: 'qwen3_5'"])["log_tail"]

    assert len(tail) == 40 and tail[0] == "Traceback (most recent call last):"
    assert tail[1] == "[... 23 lines left out ...]"
    assert tail[2] == '  File "frame23.py", line 1, in f' and tail[-1] == "KeyError: 'qwen3_5'"


def test_a_chain_of_tracebacks_is_kept_from_its_first(dead_engine):
    chained = [
        "Traceback (most recent call last):",
        '  File "loader.py", line 3, in load',
        "FileNotFoundError: config.json",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "api_server.py", line 9, in run',
        "RuntimeError: the model could not be loaded",
    ]

    tail = dead_engine(DYING_START[:3] + ["INFO before"] + chained)["log_tail"]

    assert tail == [line for line in chained if line]


def test_a_log_with_nothing_but_noise_says_so(dead_engine):
    result = dead_engine(DYING_START[1:2] + ['"GET /health HTTP/1.1" 503 -', ""])

    assert result["log_tail"] == DYING_START[1:2]
    empty = dead_engine([""])
    assert empty["msg"].endswith("engine.log): nothing since this start") and empty["log_tail"] == []


def test_the_api_key_is_masked_in_the_log_tail_and_the_message(tmp_path, health):
    key = "sk-biv100-health-9f8e7d6c"
    log_file = tmp_path / "engine.log"
    log_file.write_text("ERROR engine refused its key %s\n" % key)
    ended = subprocess.Popen(["true"])
    ended.wait()

    failed, result = health("http://127.0.0.1:%d" % stand_in.free_port(), pid=ended.pid,
                            log_file=str(log_file), api_key=key)

    assert failed and result["log_tail"] == ["ERROR engine refused its key ********"]
    assert key not in json.dumps(result)


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
