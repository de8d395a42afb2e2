"""The host's HTTP client for the engine, against small engines on loopback: JSON both ways,
the key, the proxy of the environment left aside, timeouts and failures naming the URL, and
server-sent events as the specification and vLLM's streams shape them."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from json_engine import JsonEngine

from ansible_collections.biv100.serving.plugins.module_utils._engine_http import (
    EngineClient,
    EngineHttpError,
    EngineStatusError,
    Event,
    parse_events,
)

KEY = "sk-biv100-http-0a1b2c3d"


class RecordingEngine(JsonEngine):
    """Answers every request with what it got; `/error/<status>` answers that status with an
    OpenAI error object, `/text-error` a plain-text 503, `/slow` once the server's `release` is
    set."""

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.answer()

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append({"path": self.path, "method": self.command,
                                     "headers": dict(self.headers), "body": body})
        if self.path.startswith("/error/"):
            status = int(self.path.rsplit("/", 1)[1])
            self.send_json({"error": {"message": "max_tokens  must be\n at least 1", "code": status}}, status)
        elif self.path == "/text-error":
            text = b"Service Unavailable: the model is loading"
            self.send_response(503)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            if self.path == "/slow":
                self.server.release.wait(60)
            self.send_json({"path": self.path, "method": self.command}, headers={"x-engine": "under-test"})


@pytest.fixture
def engine(loopback_server):
    """(url, server) of a RecordingEngine; server.requests lists what came, server.release frees
    the requests to `/slow` (all of them at teardown)."""
    url, server = loopback_server(RecordingEngine)
    server.requests, server.release = [], threading.Event()
    yield url, server
    server.release.set()


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- JSON requests -------------------------------------------------------------------------


def test_a_json_request_carries_the_body_the_key_and_the_api_root_of_the_url(engine):
    url, server = engine
    client = EngineClient(url + "/root/", KEY)

    answer = client.request("POST", "/v1/chat/completions", json_body={"model": "qwen3_5", "n": 2})

    assert (answer.status, answer.json()) == (200, {"path": "/root/v1/chat/completions", "method": "POST"})
    assert answer.header("X-Engine") == "under-test" and ("x-engine", "under-test") in answer.headers
    assert answer.url == url + "/root/v1/chat/completions"
    got = server.requests[0]
    assert json.loads(got["body"]) == {"model": "qwen3_5", "n": 2}
    assert got["headers"]["Content-Type"] == "application/json"
    assert got["headers"]["Accept"] == "application/json"
    assert got["headers"]["Authorization"] == "Bearer " + KEY


def test_the_key_goes_only_where_asked_and_raw_bytes_go_as_they_are(engine):
    url, server = engine
    EngineClient(url, KEY).request("GET", "/health", auth=False)
    EngineClient(url).request("GET", "/v1/models")
    EngineClient(url, KEY).request("POST", "/v1/completions", data=b"{not json", headers={"Accept": "*/*"})

    without_auth, without_key, raw = server.requests
    assert "Authorization" not in without_auth["headers"] and "Authorization" not in without_key["headers"]
    assert raw["body"] == b"{not json" and raw["headers"]["Accept"] == "*/*"
    assert raw["headers"]["Authorization"] == "Bearer " + KEY


class RecordingProxy(BaseHTTPRequestHandler):
    """A forward proxy that only notes it was asked and answers 502."""

    def do_GET(self):
        self.server.asked.append(self.path)
        self.send_error(502)

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass


def test_a_proxy_of_the_environment_is_bypassed(engine, loopback_server, monkeypatch):
    url, server = engine
    proxy_url, proxy = loopback_server(RecordingProxy)
    proxy.asked = []
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy_url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    # The environment is in force: urllib's default opener sends the request to the proxy.
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.build_opener().open(url + "/through-the-proxy", timeout=5)
    assert proxy.asked == [url + "/through-the-proxy"]

    answer = EngineClient(url, KEY).request("GET", "/v1/models")

    assert answer.status == 200 and server.requests[-1]["path"] == "/v1/models"
    assert proxy.asked == [url + "/through-the-proxy"]


# --- failures ------------------------------------------------------------------------------


def test_an_answer_slower_than_the_read_timeout_fails_naming_the_url(engine):
    url, _server = engine  # /slow is not answered before the test ends: only the timeout ends the wait
    begun = time.monotonic()

    with pytest.raises(EngineHttpError) as failed:
        EngineClient(url, read_timeout=0.2).request("GET", "/slow")

    # The 0.2 s in force, not the default 60 s: a bound a loaded machine's lateness stays far from.
    assert time.monotonic() - begun < 5
    assert failed.value.reason == "timed out after 0.2 s"
    assert str(failed.value) == "GET %s/slow: timed out after 0.2 s" % url


def test_nothing_listening_is_connection_refused_naming_the_url():
    url = "http://127.0.0.1:%d" % free_port()

    with pytest.raises(EngineHttpError) as failed:
        EngineClient(url).request("GET", "/health")

    assert failed.value.reason == "connection refused"
    assert str(failed.value) == "GET %s/health: connection refused" % url


def test_another_status_keeps_its_body_and_its_error_names_the_url(engine):
    url, _server = engine
    client = EngineClient(url)

    answer = client.request("POST", "/error/400", json_body={"max_tokens": 0})

    assert answer.status == 400
    assert json.loads(answer.read())["error"]["code"] == 400
    assert answer.error_detail() == "max_tokens must be at least 1"
    error = answer.status_error()
    assert isinstance(error, EngineStatusError) and (error.status, error.body) == (400, answer.read())
    assert str(error) == "POST %s/error/400 answered HTTP 400: max_tokens must be at least 1" % url
    assert error.reason == "HTTP 400: max_tokens must be at least 1"


def test_a_body_that_is_no_error_object_is_quoted_as_it_is(engine):
    url, _server = engine

    answer = EngineClient(url).request("GET", "/text-error")

    assert answer.status == 503
    assert answer.error_detail() == "Service Unavailable: the model is loading"
    assert answer.error_detail(limit=19) == "Service Unavailable"


@pytest.mark.parametrize("url, message", [
    ("ftp://127.0.0.1:8000", "url ftp://127.0.0.1:8000 is not an http:// or https:// URL"),
    ("127.0.0.1:8000", "url 127.0.0.1:8000 is not an http:// or https:// URL"),
    ("http:///v1", "url http:///v1 names no host"),
    ("http://127.0.0.1:99999", "url http://127.0.0.1:99999 has a port that is not a number from 0 to 65535"),
])
def test_a_url_the_client_cannot_reach_is_refused_before_any_request(url, message):
    with pytest.raises(ValueError) as refused:
        EngineClient(url)
    assert str(refused.value) == message


# --- server-sent events --------------------------------------------------------------------


class StreamingEngine(BaseHTTPRequestHandler):
    """Answers with the server's `pieces`, each its own chunk of a chunked HTTP/1.1 body, after
    the piece's delay (seconds, or an event the test sets); ends the body unless told to stall
    (until the server's `release` is set) or to close without ending it."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for delay, piece in self.server.pieces:
            if isinstance(delay, threading.Event):
                delay.wait(60)
            else:
                time.sleep(delay)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        if self.server.ending == "stall":
            self.server.release.wait(60)
        elif self.server.ending == "end":
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass


@pytest.fixture
def streaming(loopback_server):
    """streaming(pieces, ending="end") -> the URL of an engine answering with those pieces; a
    stalled stream and the pieces held by events are let go at teardown."""
    events = []

    def start(pieces, ending="end"):
        url, server = loopback_server(StreamingEngine)
        server.pieces, server.ending, server.release = pieces, ending, threading.Event()
        events.extend([server.release] + [delay for delay, _piece in pieces if isinstance(delay, threading.Event)])
        return url

    yield start
    for event in events:
        event.set()


def chunk(text):
    return ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + "\n\n").encode()


def test_events_are_read_as_they_arrive_across_chunks_until_done(streaming):
    first, second = chunk("Hel"), chunk("lo")
    second_sent = threading.Event()
    url = streaming([
        (0, b": ping\n\n"),
        (0, first[:9]), (0, first[9:]),              # one event cut in the middle of its data line
        (second_sent, second[:-1]), (0, second[-1:]),  # its blank line in a chunk of its own
        (0, b"event: usage\r\ndata: {\"usage\":\r\ndata: {\"completion_tokens\": 2}}\r\n\r\n"),
        (0, b"data: [DONE]\n\n"),
        (0, chunk("after the end")),
    ])

    with EngineClient(url).open("POST", "/v1/chat/completions", json_body={"stream": True}) as answer:
        stream = answer.events()
        events = [next(stream)]
        # The second event is sent 0.3 s after the first was read, and timed between its sending
        # and its reading (on events()' clock): nothing a loaded machine's lateness can move.
        time.sleep(0.3)
        sent = time.perf_counter()
        second_sent.set()
        events.append(next(stream))
        read = time.perf_counter()
        events += list(stream)

    assert [event.data for event in events] == [
        first[6:-2].decode(), second[6:-2].decode(), '{"usage":\n{"completion_tokens": 2}}',
    ]
    assert [event.event for event in events] == ["message", "message", "usage"]
    assert answer.done is True
    # Each timed when its first line came: the second event 0.3 s after the first.
    assert 0.25 <= events[1].arrival - events[0].arrival and sent <= events[1].arrival <= read
    assert events[0].arrival <= events[1].arrival <= events[2].arrival


def test_a_stream_closed_without_done_ends_with_what_came(streaming):
    url = streaming([(0, chunk("a")), (0, b"data: {\"cut\": true}\n")], ending="close")

    with EngineClient(url).open("POST", "/v1/chat/completions") as answer:
        events = list(answer.events())

    assert [json.loads(event.data) for event in events][-1] == {"cut": True}
    assert len(events) == 2 and answer.done is False


def test_a_stream_that_stalls_fails_at_the_read_timeout_naming_the_url(streaming):
    # The stall lasts until the test ends. The read timeout bounds the waits for the headers and
    # the first event too: long enough for a loaded machine's server thread.
    url = streaming([(0, chunk("a"))], ending="stall")
    seen = []

    with pytest.raises(EngineHttpError) as failed:
        with EngineClient(url, read_timeout=2).open("POST", "/v1/chat/completions") as answer:
            for event in answer.events():
                seen.append(event)

    assert len(seen) == 1
    assert str(failed.value) == "POST %s/v1/chat/completions: timed out after 2 s" % url


class Ticks(object):
    """A clock that reads 1, 2, 3, ... one per call."""

    def __init__(self):
        self.now = 0

    def __call__(self):
        self.now += 1
        return self.now


def test_the_event_stream_grammar():
    lines = [
        b"\xef\xbb\xbfdata: first\n",        # a byte-order mark before the first field is dropped
        b"\n",
        b": a comment, as vLLM's keep-alive pings\n",
        b"\n",                                 # an empty event: nothing dispatched
        b"id: 7\n", b"retry: 100\n",           # fields the engine's clients do not use
        b"data:no space\n", b"data:  two spaces\n", b"\n",
        b"event: error\n", b"data\n", b"\n",  # a field without colon has an empty value
        b"data: \xff\n", b"\n",               # bytes that are no UTF-8 are replaced, never fatal
    ]

    events = list(parse_events(lines, Ticks()))

    assert events == [
        Event("first", "message", 1),
        Event("no space\n two spaces", "message", 2),
        Event("", "error", 3),
        Event("\ufffd", "message", 4),
    ]
