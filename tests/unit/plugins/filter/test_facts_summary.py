from host_facts import GPUS, gpus, unregistered, vllm

from ansible_collections.biv100.serving.plugins.filter.facts_summary import facts_summary


def test_a_vendor_host_reads_as_one_line_per_subject():
    assert facts_summary(vllm(), GPUS) == [
        "vLLM 0.10.1.1+corex.4.3.0 (layout v0) for Python 3.11.2 at "
        "/usr/local/corex/python3/lib/python3.11/site-packages/vllm",
        "registry: 2 architectures, Qwen3_5 registered: yes",
        "model /opt/models/qwen3_5: Qwen3_5ForConditionalGeneration, served: yes",
        "serving files: 1/1 present; protected files: 1/2 present (absent: mamba_cache.py)",
        "GPUs: 4 x Iluvatar BI-V100 32768 MiB; free: 4",
    ]


def test_an_unregistered_model_says_whether_it_can_be_registered():
    assert facts_summary(unregistered(True), GPUS)[2].endswith(
        "served: no, registrable (the base has its model file)")
    assert facts_summary(unregistered(False), GPUS)[2].endswith(
        "served: no, not registrable (no model file in the base)")


def test_an_unusable_registry_and_model_show_their_errors():
    facts = vllm(error="config.json: no such file")
    facts["registry"]["error"] = "registry.py line 3: invalid syntax"
    lines = facts_summary(facts, gpus(0))
    assert lines[1] == "registry: unusable (registry.py line 3: invalid syntax)"
    assert lines[2] == "model /opt/models/qwen3_5: unusable (config.json: no such file)"
    assert lines[4] == "GPUs: none"


def test_gpus_not_read_are_said_to_be_unread():
    assert facts_summary(vllm(), None)[4] == "GPUs: not read (the engine phase is skipped)"


def test_without_a_model_path_the_model_line_says_so():
    facts = vllm()
    del facts["model"]
    assert facts_summary(facts, GPUS)[2] == "model: none given"


def test_the_cli_line_says_what_engine_args_are_checked_against():
    read = dict(vllm(), cli={"arguments": ["model", "max_num_seqs"], "error": None})
    unread = dict(vllm(), cli={"arguments": None, "error": "no add_argument call found"})

    assert facts_summary(read, GPUS)[5] == (
        "OpenAI-server CLI: 2 arguments in its source, which engine_args are checked against")
    assert facts_summary(unread, GPUS)[5] == (
        "OpenAI-server CLI: unread (no add_argument call found); engine_args are checked against "
        "vLLM 0.10.1.1's")
    assert len(facts_summary(dict(vllm(), cli=None), GPUS)) == 5
