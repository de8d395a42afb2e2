"""biv100.serving.engine_probe's handling of the clients' key: sent as the bearer token, shown
nowhere in what the module returns, even when an answer repeats it."""

from __future__ import annotations

import json

import pytest

from json_engine import JsonEngine

from ansible_collections.biv100.serving.plugins.modules import engine_probe

SECRET = "sk-biv100-probe-3c2b1a09"


class EchoingEngine(JsonEngine):
    """An engine that answers every request with the Authorization header it got, as a
    careless error page might."""

    def do_GET(self):
        self.send_json({"authorization": self.headers.get("Authorization")})


@pytest.fixture
def echoing_url(loopback_server):
    return loopback_server(EchoingEngine)[0]


def test_the_key_is_sent_as_the_bearer_token_and_returned_nowhere(echoing_url, run_module):
    failed, result = run_module(engine_probe, dict(url=echoing_url, api_key=SECRET, requests=[
        {"name": "models", "path": "/v1/models"},
        {"name": "health", "path": "/health", "auth": False},
    ]))

    assert not failed
    with_key, without_key = result["results"]
    # The engine got the key (its echo is masked on the way back), and only where asked.
    assert with_key["status"] == 200 and with_key["body"]["authorization"] == "Bearer ********"
    assert without_key["body"]["authorization"] is None
    assert SECRET not in json.dumps(result)
