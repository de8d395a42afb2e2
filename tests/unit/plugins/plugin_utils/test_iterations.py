"""A fleet's iterations from its ledger: per release its changes, verdicts and the checks that prove them."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._iterations import iteration_section, iterations

ALLOCATOR = {"kind": "setting", "source": "buddy_allocator.cu", "place": "computility-run.yaml env",
             "change": "PYTORCH_CUDA_ALLOC_CONF", "what": "expandable_segments = true",
             "proven_by": ["two-long-prompts-at-once"]}
CHAT = {"kind": "file", "source": "refuse n above max_num_seqs", "place": "serving_chat.py", "change": "patch",
        "what": "entrypoints/openai/serving_chat.py", "proven_by": ["n-above-max-num-seqs"]}
POINT = {"name": "model-layer", "failure": "model-layer files deployed", "fixed_by": "the guard",
         "proven_by": ["guard"]}


def line(host, release, **fields):
    return {"host": host, "release": release, "state": "good", "probes": "75/75 probes passed",
            "guard": "12 protected files as recorded", "failure_points": [POINT], **fields}


def test_releases_come_newest_first_with_each_hosts_verdict_the_canarys_and_the_platforms():
    lines = [
        line("h1", "sub509", changes=[CHAT]),
        line("h1", "sub510", changes=[ALLOCATOR], canary={"verdict": "pass"}),
        line("h2", "sub510", changes=[ALLOCATOR]),
        line("h1", "sub510", platform={"verdict": "failed", "reason": "n=3 OOM", "figures": {"score": 7900}}),
    ]

    found = iterations(lines)

    assert [item.release for item in found] == ["sub510", "sub509"]
    section = "\n".join(iteration_section(found[0]))
    assert "h1 good, h2 good; canary pass; platform failed: n=3 OOM (score 7900)" in section
    assert ("| buddy_allocator.cu | computility-run.yaml env | PYTORCH_CUDA_ALLOC_CONF | expandable_segments = true "
            "| two-long-prompts-at-once ✓ |") in section
    assert "Fixed failure points:\n\n- model-layer files deployed: guard ✓\n" in section


def test_a_check_fails_when_one_hosts_last_run_failed_it_and_is_not_run_after_a_rollback():
    failed = line("h2", "sub509", changes=[CHAT], failed_probes=["n-above-max-num-seqs"],
                  probes="74/75 probes passed")
    rolled_back = {"host": "h3", "release": "sub508", "state": "rolled back", "probes": "75/75 probes passed",
                   "rollback": {"from": "sub511", "to": "sub508", "files": []},
                   "changes": [ALLOCATOR], "guard": "FAILED: sampler.py differs", "failure_points": [POINT]}

    (sub511, sub509) = iterations([line("h1", "sub509", changes=[CHAT]), failed, rolled_back])

    assert sub509.checks == {"guard": True, "n-above-max-num-seqs": False}
    # The probes after the rollback were of sub508; the guard's finding was of sub511.
    assert sub511.states == {"h3": "rolled back to sub508"}
    assert sub511.checks == {"guard": False, "two-long-prompts-at-once": None}


def test_a_change_only_some_hosts_made_names_them():
    new_host = [CHAT, ALLOCATOR]

    (item,) = iterations([line("h1", "sub510", changes=[ALLOCATOR]), line("h9", "sub510", changes=new_host)])

    assert [(row["source"], row["hosts"]) for row in item.changes] == [
        ("buddy_allocator.cu", []), ("refuse n above max_num_seqs", ["h9"])]
    assert "entrypoints/openai/serving_chat.py (on h9)" in "\n".join(iteration_section(item))
