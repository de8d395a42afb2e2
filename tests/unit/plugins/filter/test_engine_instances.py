import pytest
from ansible.errors import AnsibleFilterError
from engine_defaults import SUB168
from host_facts import gpus

from ansible_collections.biv100.serving.plugins.filter.engine_instances import (
    FilterModule,
    engine_instance_problems,
    engine_instances,
    instance_record,
    instance_settings,
)

# The engine role's own variables, as the role's defaults set them.
ROLE = {"name": "vllm", "port": 8000, "env_file": "/etc/biv100-serving/engine.env",
        "log_file": "/var/log/biv100-serving/engine.log", "engine_args": SUB168}


def resolve(instances, host_gpus=None, **role):
    return engine_instances(instances, **{**ROLE, **role}, gpus=host_gpus)


def test_a_host_that_lists_no_instance_runs_the_one_engine_of_the_roles_variables():
    (only,) = resolve([], gpus(8))
    assert only == {"name": "vllm", "port": 8000, "gpus": "0,1,2,3", "group": [0, 1, 2, 3], "free_left": 8,
                    "env_file": "/etc/biv100-serving/engine.env",
                    "log_file": "/var/log/biv100-serving/engine.log", "args": SUB168}
    # engine_visible_devices is kept as written, UUIDs included.
    assert resolve(None, gpus(8), visible_devices="4,5,6,7")[0]["gpus"] == "4,5,6,7"
    assert resolve(None, gpus(8), visible_devices="GPU-1a,GPU-2b")[0]["gpus"] == "GPU-1a,GPU-2b"


def test_listed_instances_get_consecutive_free_groups_ports_and_files_of_their_own():
    first, second = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_args": {"max_num_seqs": 4}}], gpus(8))
    assert (first["gpus"], first["port"], first["env_file"], first["log_file"]) == (
        "0,1,2,3", 8000, "/etc/biv100-serving/vllm-1.env", "/var/log/biv100-serving/vllm-1.log")
    assert (second["gpus"], second["port"], second["env_file"]) == ("4,5,6,7", 8001, "/etc/biv100-serving/vllm-2.env")
    assert second["args"] == {**SUB168, "max_num_seqs": 4} and first["args"] == SUB168


def test_auto_skips_the_gpus_another_instance_names_and_those_held_by_others():
    busy = gpus(8)
    busy["free"] = [0, 2, 3, 4, 5, 6, 7]  # GPU 1 is someone else's
    named, placed = resolve([{"name": "a", "gpus": [0, 4, 5, 6]}, {"name": "b"}], busy)
    assert (named["gpus"], named["group"]) == ("0,4,5,6", [0, 4, 5, 6])
    # Left for b: 2, 3, 7 - too few for TP=4, which its problem says.
    assert (placed["gpus"], placed["group"], placed["free_left"]) == ("", None, 3)


def test_problems_name_host_and_instance():
    busy = gpus(8)
    busy["free"] = [0, 1, 2, 3, 4, 5]
    busy["processes"] = [{"gpu_index": 6, "pid": 4242, "name": "train.py", "own": False},
                         {"gpu_index": 7, "pid": 4242, "name": "train.py", "own": False}]
    instances = resolve([{"name": "vllm-1", "gpus": "0,1,2"}, {"name": "vllm-1", "port": 8000, "gpus": [2, 7, 8, 9]},
                         {"name": "vllm 3"}], busy)

    assert engine_instance_problems(instances, "lab-h5", busy) == [
        "lab-h5/vllm-1: name vllm-1 is also lab-h5/vllm-1's",
        "lab-h5/vllm-1: port 8000 is also lab-h5/vllm-1's",
        "lab-h5/vllm 3: an instance's name is letters, digits, '_', '.' and '-'",
        "lab-h5/vllm-1: tensor_parallel_size is 4 but its GPU group 0,1,2 has 3",
        "lab-h5/vllm-1: GPU 8,9 not on the host, which has 8",
        "lab-h5/vllm-1: GPU 2 also in lab-h5/vllm-1's group",
        "lab-h5/vllm-1: GPU 7 held by another process: GPU 7 by pid 4242 (train.py)",
        "lab-h5/vllm 3: tensor_parallel_size is 4 but only 3 free GPUs are left for it (gpus: auto); "
        "held: GPU 6 by pid 4242 (train.py), GPU 7 by pid 4242 (train.py)",
    ]


def test_a_fitting_mixed_list_has_no_problem_and_without_gpu_facts_only_names_and_ports_are_judged():
    instances = resolve([{"name": "vllm-1"}, {"name": "vllm-2"}], gpus(8))
    assert engine_instance_problems(instances, "lab-h5", gpus(8)) == []
    unread = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "port": 8000}])
    assert [instance["gpus"] for instance in unread] == ["", ""]
    assert engine_instance_problems(unread, "lab-h5") == ["lab-h5/vllm-2: port 8000 is also lab-h5/vllm-1's"]


@pytest.mark.parametrize("instances, message", [
    ({"name": "vllm-1"}, "a list of instances"),
    ([{"port": 8001}], "needs at least a name"),
    ([{"name": "vllm-1", "gpu": "0"}], "unknown key gpu"),
    ([{"name": "vllm-1", "gpus": {"0": 1}}], "give auto"),
])
def test_a_malformed_list_is_refused_naming_the_entry(instances, message):
    with pytest.raises(AnsibleFilterError, match=message):
        resolve(instances, gpus(8))


def test_a_host_of_one_engine_records_its_values_as_before_and_one_of_several_records_each():
    proven = {"vllm": {"engine": {"args": SUB168}, "gates": None, "summary": "75/75 probes passed"}}
    assert instance_record(proven, "engine") == {"args": SUB168}
    assert instance_record(proven, "gates") is None
    assert instance_record(proven, "summary") == "75/75 probes passed"
    several = {"vllm-1": {"engine": {"args": SUB168}, "gates": {"bench": {"score": 9000}}, "summary": "a"},
               "vllm-2": {"engine": {"args": {**SUB168, "max_num_seqs": 4}}, "gates": None, "summary": "b"}}
    listed = [{"name": "vllm-1"}, {"name": "vllm-2"}]
    assert instance_record(several, "engine", listed) == {"instances": {name: several[name]["engine"] for name in several}}
    assert instance_record(several, "gates", listed) == {"instances": {"vllm-1": {"bench": {"score": 9000}}}}
    assert instance_record(several, "summary", listed) == "vllm-1: a; vllm-2: b"


def test_an_instance_is_restored_with_what_its_release_recorded_for_it():
    one = {"args": SUB168, "env": {}}
    listed = [{"name": "vllm-1"}, {"name": "vllm-2"}]
    assert instance_settings(one, "vllm") == one
    assert instance_settings({"instances": {"vllm-2": one}}, "vllm-2", listed) == one
    # Nothing recorded for it (a release of before instances, the vendor's files): the inventory's.
    assert instance_settings({"instances": {"vllm-2": one}}, "vllm-1", listed) == {}
    assert instance_settings(one, "vllm-1", listed) == {} and instance_settings(None, "vllm") == {}


def test_the_filters_are_registered():
    assert set(FilterModule().filters()) == {"engine_instances", "engine_instance_problems", "instance_record",
                                             "instance_settings"}
