# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host's HTTP client for the engine's OpenAI-compatible API: JSON requests, server-sent
event streams timed as they arrive, the bearer key, and failures that name the URL.

Runs on the host: standard library only, Python 3.8.

The engine is reached on loopback or a lab address, so the client speaks to it directly: it
is built on http.client, which never consults http_proxy, https_proxy or no_proxy (a proxy
of the connection's environment would otherwise carry the request, and the key, elsewhere).

    client = EngineClient("http://127.0.0.1:8000", api_key, connect_timeout=10, read_timeout=600)
    with client.open("POST", "/v1/chat/completions", json_body=body) as answer:
        if answer.status != 200:
            raise answer.status_error()
        for event in answer.events():
            ...  # event.data, event.arrival
"""

from __future__ import annotations

import json
import socket
import time
from collections import namedtuple
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from urllib.parse import urlsplit

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0

# How much of an error answer's body a message quotes.
DETAIL_CHARS = 200

# The data of the event that ends an OpenAI-style stream; it is no event of the answer.
STREAM_END = "[DONE]"

Event = namedtuple("Event", ["data", "event", "arrival"])
Event.__doc__ = """One server-sent event: its data lines joined by newlines, its event type
(`message` when it names none), and the clock's reading when its first line arrived."""


class EngineHttpError(Exception):
    """A request to the engine that failed; `reason` says why without the URL, the message
    names the method and URL as well."""

    def __init__(self, method, url, reason, message=None):
        super(EngineHttpError, self).__init__(message or "%s %s: %s" % (method, url, reason))
        self.method = method
        self.url = url
        self.reason = reason


class EngineStatusError(EngineHttpError):
    """An answer whose status is not the one the caller wanted, with the error its body carries."""

    def __init__(self, method, url, status, body, detail):
        super(EngineStatusError, self).__init__(
            method, url, "HTTP %d: %s" % (status, detail),
            "%s %s answered HTTP %d: %s" % (method, url, status, detail))
        self.status = status
        self.body = body
        self.detail = detail


def failure_reason(error, timeout):
    """Why a connection gave no answer, in a few words; `timeout` is the one in force."""
    if isinstance(error, socket.timeout):
        return "timed out after %g s" % timeout
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, ConnectionResetError):
        return "connection reset"
    if isinstance(error, socket.gaierror):
        return "cannot resolve the host: %s" % (error.strerror or error)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[0].lower() + error.strerror[1:]
    if isinstance(error, HTTPException):
        text = str(error)
        return "%s: %s" % (type(error).__name__, text) if text else type(error).__name__
    return str(error) or type(error).__name__


def error_detail(body, limit=DETAIL_CHARS):
    """The error an answer's body carries, on one line: an OpenAI error object's message (vLLM
    answers {"error": {"message": ...}} or {"message": ...}), else the body's start."""
    text = body.decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict):
        error = document.get("error", document)
        if isinstance(error, dict):
            text = str(error.get("message") or error)
        elif error:
            text = str(error)
    return " ".join(text.split())[:limit]


def parse_events(lines, clock):
    """The server-sent events of `lines` (bytes, each ending with LF or CRLF), as the
    EventSource specification reads them: `field: value` lines (one space after the colon
    dropped), a blank line ending each event, `:` comments (keep-alive pings) and fields other
    than data and event ignored, an event without data never dispatched, a byte-order mark at
    the start dropped. An event that the end of the answer cut off before its blank line still
    counts, so that its data can be judged."""
    data, event_type, arrival = [], "", None
    for number, raw in enumerate(lines):
        line = raw.decode("utf-8", "replace")
        if line.endswith("\n"):
            line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
        if number == 0 and line.startswith("\ufeff"):
            line = line[1:]
        if not line:
            if data:
                yield Event("\n".join(data), event_type or "message", arrival)
            data, event_type, arrival = [], "", None
            continue
        if line.startswith(":"):
            continue
        name, _colon, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if arrival is None:
            arrival = clock()
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
    if data:
        yield Event("\n".join(data), event_type or "message", arrival)


class Answer(object):
    """The engine's answer to one request: status and headers at once, then the body read
    whole (read, json) or as server-sent events (events). Close it, or use it in a with."""

    def __init__(self, method, url, connection, response, read_timeout):
        self.method = method
        self.url = url
        self.status = response.status
        self.reason = response.reason
        self.headers = response.getheaders()
        # Whether the stream ended with its [DONE] event (set while events() is read).
        self.done = False
        self._connection = connection
        self._response = response
        self._read_timeout = read_timeout
        self._body = None

    def header(self, name):
        """The value of header `name` (any case), None when the answer has none."""
        return self._response.getheader(name)

    def read(self):
        """The whole body (read once, kept)."""
        if self._body is None:
            try:
                self._body = self._response.read()
            except (OSError, HTTPException) as error:
                raise self._failure(error)
        return self._body

    def json(self):
        """The body parsed as JSON; ValueError when it is not JSON."""
        return json.loads(self.read().decode("utf-8"))

    def error_detail(self, limit=DETAIL_CHARS):
        return error_detail(self.read(), limit)

    def status_error(self):
        """An EngineStatusError of this answer, naming the URL, the status and the error."""
        body = self.read()
        return EngineStatusError(self.method, self.url, self.status, body, error_detail(body))

    def events(self, clock=time.perf_counter):
        """The body's server-sent events, each as soon as it arrived, timed by `clock`; the
        [DONE] event ends them and sets `done`."""
        for event in parse_events(self._lines(), clock):
            if event.data.strip() == STREAM_END:
                self.done = True
                return
            yield event

    def _lines(self):
        while True:
            try:
                line = self._response.readline()
            except (OSError, HTTPException) as error:
                raise self._failure(error)
            if not line:
                return
            yield line

    def _failure(self, error):
        return EngineHttpError(self.method, self.url, failure_reason(error, self._read_timeout))

    def close(self):
        # An answer that ends the connection (HTTP/1.0, Connection: close) holds the socket
        # itself; closing the connection alone would leave it open.
        self._response.close()
        self._connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc_info):
        self.close()


class EngineClient(object):
    """Requests to the engine at `url` (http:// or https://, the API's root: paths are
    appended), with `api_key` as the bearer token where a request asks for it. Each request
    is a connection of its own, so one client serves many threads at once."""

    def __init__(self, url, api_key=None, connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                 read_timeout=DEFAULT_READ_TIMEOUT):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError("url %s is not an http:// or https:// URL" % url)
        if not parts.hostname:
            raise ValueError("url %s names no host" % url)
        try:
            port = parts.port
        except ValueError:
            raise ValueError("url %s has a port that is not a number from 0 to 65535" % url) from None
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
        self._host = parts.hostname
        self._port = port
        self._prefix = parts.path.rstrip("/")

    def open(self, method, path, json_body=None, data=None, headers=None, auth=True,
             connect_timeout=None, read_timeout=None):
        """Send a request and return its Answer as soon as the status and headers came, the
        body left to read; EngineHttpError when no answer came.

        The body is `json_body` serialised, or the bytes `data` as they are; either goes as
        application/json unless `headers` say otherwise. `auth` sends the bearer key."""
        connect_timeout = self.connect_timeout if connect_timeout is None else connect_timeout
        read_timeout = self.read_timeout if read_timeout is None else read_timeout
        url = self.url + path
        sent_headers = {"Accept": "application/json"}
        if json_body is not None:
            data = json.dumps(json_body).encode("utf-8")
        if data is not None:
            sent_headers["Content-Type"] = "application/json"
        if auth and self.api_key:
            sent_headers["Authorization"] = "Bearer %s" % self.api_key
        sent_headers.update(headers or {})
        connection = self._connection_class(self._host, self._port, timeout=connect_timeout)
        connected = False
        try:
            connection.connect()
            connected = True
            connection.sock.settimeout(read_timeout)
            connection.request(method, self._prefix + path, data, sent_headers)
            response = connection.getresponse()
        except (OSError, HTTPException) as error:
            connection.close()
            if not connected and isinstance(error, socket.timeout):
                reason = "timed out connecting after %g s" % connect_timeout
            else:
                reason = failure_reason(error, read_timeout)
            raise EngineHttpError(method, url, reason)
        return Answer(method, url, connection, response, read_timeout)

    def request(self, method, path, **options):
        """open() with the whole body read and the connection closed: the Answer's read() and
        json() then need no connection."""
        with self.open(method, path, **options) as answer:
            answer.read()
        return answer
