"""A base for the unit tests' small HTTP engines on loopback: JSON answers, no access log."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class JsonEngine(BaseHTTPRequestHandler):
    """Subclasses answer with send_json; the test's output stays free of access-log lines."""

    def send_json(self, document, status: int = 200, headers: dict | None = None, before_body=None) -> None:
        """Answer `document` as JSON with `headers`; `before_body()` runs once the headers are
        out, before the body (a test that counts requests in flight marks one ended there)."""
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if before_body:
            before_body()
        self.wfile.write(body)

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass
