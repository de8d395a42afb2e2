from host_facts import GPUS, gpus, unregistered, vllm

from ansible_collections.biv100.serving.plugins.filter.preflight_problems import (
    FilterModule,
    preflight_problems,
)


def test_a_fit_host_has_no_problem():
    assert preflight_problems(vllm(), GPUS, tensor_parallel_size=4) == []


def test_fewer_gpus_than_the_tensor_parallel_size_is_named_with_both_numbers():
    problems = preflight_problems(vllm(), gpus(2), tensor_parallel_size=4)
    assert problems == [
        "tensor_parallel_size is 4 but /usr/local/corex/bin/ixsmi reports 2 GPUs"
    ]


def test_gpus_held_by_someone_else_are_named_with_their_process():
    busy = gpus(4)
    busy["free"] = [0, 1]
    busy["processes"] = [
        {"gpu_index": 2, "pid": 4242, "name": "python3", "own": False},
        {"gpu_index": 3, "pid": 77, "name": "train.py", "own": False},
        {"gpu_index": 0, "pid": 9, "name": "vllm", "own": True},
    ]
    assert preflight_problems(vllm(), busy, tensor_parallel_size=4) == [
        "tensor_parallel_size is 4 but only 2 of 4 GPUs are free; "
        "held: GPU 2 by pid 4242 (python3), GPU 3 by pid 77 (train.py)"
    ]


def test_gpus_not_read_are_not_judged_and_the_rest_still_is():
    # A run with --skip-tags engine reads no GPU: staging alone needs none free.
    assert preflight_problems(vllm(), None, tensor_parallel_size=4) == []
    assert preflight_problems(unregistered(False), None, tensor_parallel_size=4) == \
        preflight_problems(unregistered(False), GPUS, tensor_parallel_size=4) != []


def test_an_unusable_registry_names_its_file_and_the_error():
    facts = vllm()
    facts["registry"].update(error="registry.py line 42: invalid syntax", architectures={})
    problems = preflight_problems(facts, GPUS, tensor_parallel_size=4)
    assert problems == [
        "the model registry of /usr/local/corex/python3/lib/python3.11/site-packages/vllm is "
        "unusable: registry.py line 42: invalid syntax"
    ]


def test_an_unregistered_model_with_a_model_file_in_the_base_is_fine():
    assert preflight_problems(unregistered(registrable=True), GPUS, tensor_parallel_size=4) == []


def test_an_unregistered_model_without_a_model_file_is_refused_by_name():
    (problem,) = preflight_problems(unregistered(registrable=False), GPUS, tensor_parallel_size=4)
    assert "Qwen3_5ForConditionalGeneration" in problem
    assert "/opt/models/qwen3_5" in problem and "cannot be registered" in problem


def test_an_unreadable_model_config_is_named():
    facts = vllm(error="/opt/models/qwen3_5/config.json: no such file", architectures=[])
    assert preflight_problems(facts, GPUS, tensor_parallel_size=4) == [
        "model /opt/models/qwen3_5 is unusable: /opt/models/qwen3_5/config.json: no such file"
    ]


def test_every_problem_is_reported_at_once():
    problems = preflight_problems(unregistered(registrable=False), gpus(1), tensor_parallel_size=4)
    assert len(problems) == 2
    assert "reports 1 GPU" in problems[0] and problems[0].endswith("1 GPU")


def test_the_filter_is_exported_under_its_name():
    assert FilterModule().filters() == {"preflight_problems": preflight_problems}
