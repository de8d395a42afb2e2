from ansible_collections.biv100.serving.plugins.filter.verify_problems import verify_problems

ENGINE = {"running": True, "drift": [], "env_file": "/etc/e.env", "env_file_matches": True}
PROBES = {"probes": [{"name": "health", "passed": True, "guards": "g", "latency_ms": 3.0}],
          "summary": "1/1 probes passed"}
HEALTHY = {
    "guard": {"guard": {"mismatches": []}, "msg": "12 protected files as recorded (verify)"},
    "release": {"release": "sub510", "drift": []},
    "instances": {"vllm": {"engine": ENGINE, "probes": PROBES}},
}


def one_engine(engine, probes):
    """The findings of a host of one engine instance."""
    return {"vllm": {"engine": engine, "probes": probes}}


def test_a_healthy_host_has_no_problem():
    assert verify_problems(HEALTHY) == []


def test_each_finding_is_one_sentence():
    checks = dict(
        HEALTHY,
        guard={"msg": "model layer changed since first contact (verify): sequence.py sha256 a → b"},
        release={"release": "sub510", "drift": ["serving_chat.py: installed 1..., release 2..."]},
        instances=one_engine(
            {"running": True, "drift": ["argument --max-num-seqs: running 1, desired 2"],
             "env_file": "/etc/e.env", "env_file_matches": False},
            {"probes": [{"name": "n-two", "passed": False, "guards": "n=2 failing",
                         "failed_expectation": "status == `200`"}]}),
    )
    assert verify_problems(checks) == [
        "model layer: model layer changed since first contact (verify): sequence.py sha256 a → b",
        "serving file drift from release sub510: serving_chat.py: installed 1..., release 2...",
        "engine drift: argument --max-num-seqs: running 1, desired 2",
        "env file /etc/e.env: differs from the desired one",
        "probe n-two failed (guards: n=2 failing): expected status == `200`",
    ]


def test_what_is_missing_is_a_finding_too():
    checks = dict(HEALTHY, release={"release": None, "drift": []},
                  instances=one_engine({"running": False, "env_file": "/etc/e.env", "env_file_matches": False},
                                       {"failed": True, "msg": "probe suite x.yml does not exist"}))
    assert verify_problems(checks) == [
        "release: none deployed on this host",
        "engine: not running",
        "env file /etc/e.env: differs from the desired one",
        "probes did not run: probe suite x.yml does not exist",
    ]


def test_each_engine_instance_of_a_host_is_judged_and_named():
    checks = {"guard": HEALTHY["guard"], "release": HEALTHY["release"], "instances": {
        "vllm-1": {"engine": ENGINE, "probes": PROBES},
        "vllm-2": {"engine": {"running": False, "env_file": "/etc/v2.env", "env_file_matches": True},
                   "probes": {"failed": True, "msg": "connection refused"}},
    }}
    assert verify_problems(checks) == [
        "vllm-2: engine: not running",
        "vllm-2: probes did not run: connection refused",
    ]


def test_an_engine_of_the_collections_outside_the_layout_is_a_finding():
    running = [{"name": "vllm", "pid": 4242, "manager": "pidfile", "ports": [8000], "gpus": [0, 1, 2, 3]},
               {"name": "old", "pid": 4343, "manager": "systemd", "ports": [], "gpus": [4, 5, 6, 7]}]
    checks = dict(HEALTHY, engines=running)
    assert verify_problems(checks) == [
        "engine old runs outside the host's layout (vllm): pid 4343, systemd, port(s) none; a deploy retires it"]
    assert verify_problems(dict(HEALTHY, engines=running[:1])) == []
