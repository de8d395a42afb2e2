from ansible_collections.biv100.serving.plugins.filter.probe_summary import probe_summary


def test_the_probe_summary_has_latencies_and_failures():
    failed = {"summary": "1/2 probes passed", "probes": [
        {"name": "health", "passed": True, "latency_ms": 2.0},
        {"name": "n-two", "passed": False, "latency_ms": 40.0}]}
    assert probe_summary(failed) == "1/2 probes passed, median 40 ms, slowest n-two 40 ms; failed: n-two"
    assert probe_summary(None) == "not probed"
