import pytest
import yaml
from ansible.errors import AnsibleFilterError
from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS, SUB168
from host_facts import gpus

from ansible_collections.biv100.serving.plugins.filter.engine_instances import (
    FilterModule,
    engine_instance_problems,
    engine_instances,
    engine_start_order,
    instance_record,
    instance_with,
    recorded_instance,
    restored_instances,
)

# The engine role's own variables (engine_instance_defaults), as the role's defaults set them.
ENGINE = {"name": "vllm", "port": 8000, "env_file": "/etc/biv100-serving/engine.env",
          "log_file": "/var/log/biv100-serving/engine.log", "visible_devices": "", "args": SUB168,
          "allocator": DEFAULT_ALLOCATOR_OPTIONS, "env": {}, "allow_long_max_model_len": False,
          "api_key_set": False, "model_path": "/opt/models/qwen3_5", "served_model_name": "qwen3_5",
          "host": "0.0.0.0", "tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3",
          "command": ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]}


def resolve(instances, host_gpus=None, restore=None, host="lab-h5", **engine):
    return engine_instances(instances, host, {**ENGINE, **engine}, gpus=host_gpus, restore=restore)


def test_a_host_that_lists_no_instance_runs_one_instance_of_the_roles_variables():
    (only,) = resolve([], gpus(8))
    assert {key: only[key] for key in ("name", "label", "port", "url", "gpus", "group", "env_file", "log_file")} == {
        "name": "vllm", "label": "lab-h5", "port": 8000, "url": "http://127.0.0.1:8000", "gpus": "0,1,2,3",
        "group": [0, 1, 2, 3], "env_file": "/etc/biv100-serving/engine.env",
        "log_file": "/var/log/biv100-serving/engine.log"}
    assert only["record"]["args"] == SUB168 and only["problems"] == []
    # engine_visible_devices is kept as written, UUIDs included.
    assert resolve(None, gpus(8), visible_devices="4,5,6,7")[0]["gpus"] == "4,5,6,7"
    assert resolve(None, gpus(8), visible_devices="GPU-1a,GPU-2b")[0]["gpus"] == "GPU-1a,GPU-2b"


def test_the_value_carries_the_command_line_the_environment_and_the_platforms_run_file():
    (only,) = resolve([], gpus(8), env={"VLLM_LOGGING_LEVEL": "INFO"}, api_key_set=True)
    command = only["command"]
    assert command[:3] == ENGINE["command"] and command[command.index("--port") + 1] == "8000"
    assert "--enforce-eager" in command and command[command.index("--max-num-seqs") + 1] == "2"
    assert only["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8,max_split_size_mb:512",
                           "VLLM_LOGGING_LEVEL": "INFO", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    run_file = yaml.safe_load(only["record"]["platform_run"])
    assert run_file["command"][3:] == command[3:] and run_file["secret_env"] == ["VLLM_API_KEY"]
    assert run_file["env"] == {"PYTORCH_CUDA_ALLOC_CONF": only["env"]["PYTORCH_CUDA_ALLOC_CONF"],
                               "VLLM_LOGGING_LEVEL": "INFO"}
    assert only["record"]["api_key_set"] is True and "CUDA_VISIBLE_DEVICES" not in only["record"]["env"]


def test_the_key_given_as_an_argument_or_a_variable_is_a_problem_and_reaches_no_value():
    (only,) = resolve([], gpus(8), args={**SUB168, "api_key": "s3cret"}, env={"VLLM_API_KEY": "s3cret"})
    assert "s3cret" not in repr(only)
    assert [problem.split(" would ")[0] for problem in engine_instance_problems([only], "lab-h5", gpus(8))] == [
        "engine_args.api_key", "engine_env.VLLM_API_KEY"]


def test_listed_instances_get_consecutive_free_groups_ports_and_files_of_their_own():
    first, second = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_args": {"max_num_seqs": 4}}], gpus(8))
    assert (first["gpus"], first["port"], first["env_file"], first["log_file"]) == (
        "0,1,2,3", 8000, "/etc/biv100-serving/vllm-1.env", "/var/log/biv100-serving/vllm-1.log")
    assert (second["gpus"], second["port"], second["env_file"]) == ("4,5,6,7", 8001, "/etc/biv100-serving/vllm-2.env")
    assert second["record"]["args"] == {**SUB168, "max_num_seqs": 4} and first["record"]["args"] == SUB168
    assert (first["label"], second["label"], second["url"]) == ("lab-h5/vllm-1", "lab-h5/vllm-2", "http://127.0.0.1:8001")
    assert "8001" in second["command"] and "4,5,6,7" == second["env"]["CUDA_VISIBLE_DEVICES"]


def test_an_instances_engine_env_is_over_the_roles_for_that_instance_only():
    first, second = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_env": {"X": "2", "Y": "1"}}], gpus(8),
                            env={"X": "1", "Z": "1"})
    assert (first["env"]["X"], "Y" in first["env"], first["record"]["env"]) == ("1", False, {"X": "1", "Z": "1"})
    assert {key: second["env"][key] for key in ("X", "Y", "Z")} == {"X": "2", "Y": "1", "Z": "1"}
    assert second["record"]["env"] == {"X": "2", "Y": "1", "Z": "1"}
    # A rollback runs the instance with the environment its release recorded, not the inventory's.
    (_first, restored) = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_env": {"Y": "1"}}], gpus(8),
                                 restore={"instances": {"vllm-1": {}, "vllm-2": {"env": {}}}})
    assert "Y" not in restored["env"] and restored["record"]["env"] == {}


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
    ([{"name": "vllm-1", "engine_env": ["X=1"]}], r"\(vllm-1\): engine_env is not a dict"),
])
def test_a_malformed_list_is_refused_naming_the_entry(instances, message):
    with pytest.raises(AnsibleFilterError, match=message):
        resolve(instances, gpus(8))


def test_a_release_records_each_instance_by_name_and_one_summary():
    proven = {"vllm": {"engine": {"args": SUB168}, "gates": None, "summary": "75/75 probes passed"}}
    one = resolve([], gpus(8))
    assert instance_record(proven, "engine", one) == {"instances": {"vllm": {"args": SUB168}}}
    assert instance_record(proven, "gates", one) is None
    assert instance_record(proven, "summary", one) == "75/75 probes passed"
    several = {"vllm-1": {"engine": {"args": SUB168}, "gates": {"bench": {"score": 9000}}, "summary": "a"},
               "vllm-2": {"engine": {"args": {**SUB168, "max_num_seqs": 4}}, "gates": None, "summary": "b"}}
    listed = resolve([{"name": "vllm-1"}, {"name": "vllm-2"}], gpus(8))
    assert instance_record(several, "engine", listed) == {"instances": {name: several[name]["engine"] for name in several}}
    assert instance_record(several, "gates", listed) == {"instances": {"vllm-1": {"bench": {"score": 9000}}}}
    assert instance_record(several, "summary", listed) == "vllm-1: a; vllm-2: b"


def test_an_instance_is_read_from_the_records_instances_by_name():
    one = {"args": SUB168, "env": {}}
    assert recorded_instance({"instances": {"vllm-2": one}}, "vllm-2") == one
    assert recorded_instance({"instances": {"vllm-2": one}}, "vllm-1") == {}
    # A record that names no instance holds none (the 0.1 collection never wrote another shape).
    assert recorded_instance(one, "vllm") == {}
    assert recorded_instance(None, "vllm") == {}


def test_an_instance_is_restored_with_what_its_release_recorded_for_it():
    deployed = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_args": {"max_num_seqs": 8}}], gpus(8),
                       env={"X": "1"}, api_key_set=True)
    recorded = {"instances": {instance["name"]: instance["record"] for instance in deployed}}
    first, second = resolve([{"name": "vllm-1"}, {"name": "vllm-2"}], gpus(8), restore=recorded)
    assert first["record"]["args"] == SUB168
    assert second["record"]["args"]["max_num_seqs"] == 8 and second["env"]["X"] == "1"
    # Whether a key is required follows the inventory's key, not the record.
    assert second["record"]["api_key_set"] is False
    (only,) = resolve([], gpus(8), restore={"instances": {"vllm": {"args": {**SUB168, "max_num_seqs": 1}}}})
    assert only["record"]["args"]["max_num_seqs"] == 1


def test_the_arguments_of_each_instance_are_judged_and_named_on_a_host_of_several():
    (only,) = resolve([], gpus(8), args={**SUB168, "max_num_seqs": 0})
    assert engine_instance_problems([only], "lab-h5", gpus(8)) == [
        "engine_args.max_num_seqs is 0: it must be at least 1"]
    listed = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_args": {"dtype": "fp16"}}], gpus(8),
                     allocator={"expandable_segment": True})
    problems = engine_instance_problems(listed, "lab-h5", gpus(8))
    assert [problem for problem in problems if problem.startswith("lab-h5/vllm-2: engine_args.dtype")]
    assert not [problem for problem in problems if problem.startswith("lab-h5/vllm-1: engine_args.dtype")]
    assert sum("expandable_segment" in problem for problem in problems) == 1


def test_engine_visible_devices_beside_a_list_is_refused():
    with pytest.raises(AnsibleFilterError, match="engine_visible_devices applies to the one engine"):
        resolve([{"name": "vllm-1"}], gpus(8), visible_devices="0,1,2,3")


def test_a_rollback_restores_the_layout_its_release_recorded_not_the_inventorys():
    two = resolve([{"name": "vllm-1"}, {"name": "vllm-2"}], gpus(8))
    assert {key: two[1]["record"][key] for key in ("port", "gpus", "env_file", "log_file")} == {
        "port": 8001, "gpus": "4,5,6,7", "env_file": "/etc/biv100-serving/vllm-2.env",
        "log_file": "/var/log/biv100-serving/vllm-2.log"}
    of_two = {"instances": {instance["name"]: instance["record"] for instance in two}}
    (one,) = resolve([], gpus(8))

    # The inventory runs one engine now; the release it goes back to ran two.
    restored = resolve([], gpus(8), restore=of_two)
    assert [(i["name"], i["label"], i["port"], i["gpus"], i["env_file"]) for i in restored] == [
        ("vllm-1", "lab-h5/vllm-1", 8000, "0,1,2,3", "/etc/biv100-serving/vllm-1.env"),
        ("vllm-2", "lab-h5/vllm-2", 8001, "4,5,6,7", "/etc/biv100-serving/vllm-2.env")]
    # And the other way: the inventory lists two (vllm-1 on another port), the release ran one.
    (back,) = resolve([{"name": "vllm-1", "port": 9000}, {"name": "vllm-2"}], gpus(8),
                      restore={"instances": {"vllm": one["record"]}})
    assert (back["name"], back["label"], back["port"], back["gpus"], back["env_file"], back["log_file"]) == (
        "vllm", "lab-h5", 8000, "0,1,2,3", "/etc/biv100-serving/engine.env", "/var/log/biv100-serving/engine.log")
    assert back["command"] == one["command"] and back["env"] == one["env"]
    # What a record lacks of an instance's place, the inventory's entry of that name gives.
    (partial,) = resolve([{"name": "vllm-2", "port": 8005}], gpus(8),
                         restore={"instances": {"vllm-2": {"args": SUB168}}})
    assert (partial["name"], partial["port"], partial["gpus"]) == ("vllm-2", 8005, "0,1,2,3")


def test_a_port_a_foreign_process_listens_on_is_a_problem_naming_it_and_the_collections_own_are_not():
    facts = gpus(8)
    facts["ports"] = [
        {"port": 8000, "address": "0.0.0.0", "pid": 4242, "command": "/usr/bin/python3 -m vllm...", "own": True,
         "instance": "vllm"},
        {"port": 8001, "address": "127.0.0.1", "pid": 777, "command": "python3 -m http.server 8001", "own": False,
         "instance": None},
        {"port": 8002, "address": "::", "pid": None, "command": None, "own": False, "instance": None},
        {"port": 8003, "address": "0.0.0.0", "pid": 9, "command": "x" * 400, "own": False, "instance": None}]
    instances = resolve([{"name": "vllm-1"}, {"name": "vllm-2"}, {"name": "vllm-3", "gpus": [0, 1, 2, 3], "port": 8002},
                         {"name": "vllm-4", "gpus": [4, 5, 6, 7], "port": 8003}], facts)

    problems = [problem for problem in engine_instance_problems(instances, "lab-h5", facts) if "port" in problem]

    assert problems[:3] == [
        "lab-h5/vllm-2: port 8001 held by another process: pid 777 (python3 -m http.server 8001)",
        "lab-h5/vllm-3: port 8002 held by another process: a process the host would not name "
        "(listening on ::; its descriptors need root to read)",
        "lab-h5/vllm-4: port 8003 held by another process: pid 9 (" + "x" * 157 + "...)"]
    assert len(problems) == 3
    # Without GPU facts (the engine phase skipped), no port is judged either.
    assert not [problem for problem in engine_instance_problems(instances, "lab-h5") if "held by" in problem]


def test_instances_in_no_running_engines_way_start_first():
    facts = gpus(8)
    listed = resolve([{"name": "vllm-1"}, {"name": "vllm-2"}], facts)
    # The host runs one engine, vllm, on vllm-1's port and GPUs.
    facts["engines"] = [{"name": "vllm", "pid": 4242, "manager": "pidfile", "ports": [8000], "gpus": [0, 1, 2, 3]}]
    assert [i["name"] for i in engine_start_order(listed, facts)] == ["vllm-2", "vllm-1"]
    # An instance is never in its own way, and a GPU alone is in the way too.
    facts["engines"] = [{"name": "vllm-1", "ports": [8000], "gpus": [0, 1, 2, 3]},
                        {"name": "vllm", "ports": [9000], "gpus": [7]}]
    assert [i["name"] for i in engine_start_order(listed, facts)] == ["vllm-1", "vllm-2"]
    assert engine_start_order(listed, None) == listed


def test_the_filters_are_registered():
    assert set(FilterModule().filters()) == {"engine_instances", "engine_instance_problems", "instance_record",
                                             "recorded_instance", "engine_start_order", "instance_with",
                                             "restored_instances"}


# --- an instance made again from its own value ----------------------------------------------


def test_an_instance_made_again_with_its_own_settings_is_the_same_value():
    for listed in ([], [{"name": "vllm-1"}, {"name": "vllm-2", "engine_args": {"max_num_seqs": 8}}]):
        for instance in resolve(listed, gpus(8), env={"X": "1"}, api_key_set=True, allow_long_max_model_len=True):
            placed = {key: value for key, value in instance.items() if key != "free_left"}
            assert instance_with(instance) == placed


def test_a_candidates_settings_replace_the_instances_whole_as_the_inventory_would_make_them():
    (incumbent,) = resolve([], gpus(8))
    candidate = {"args": {**SUB168, "max_num_seqs": 8}, "allocator": {"expandable_segments": True}, "env": {"Y": "2"}}
    (expected,) = resolve([], gpus(8), args=candidate["args"], allocator=candidate["allocator"], env=candidate["env"])
    expected.pop("free_left")
    assert instance_with(incumbent, candidate) == expected
    # A setting left out (None) stays as it was.
    assert instance_with(incumbent, {"args": candidate["args"], "env": None})["env"] == incumbent["env"]


def test_restored_instances_are_those_engine_instances_restores_from_the_same_record():
    two = resolve([{"name": "vllm-1"}, {"name": "vllm-2", "engine_args": {"max_num_seqs": 8}}], gpus(8),
                  env={"X": "1"})
    of_two = {"instances": {instance["name"]: instance["record"] for instance in two}}
    (one,) = resolve([], gpus(8))
    assert restored_instances([one], of_two) == resolve([], gpus(8), restore=of_two)
    now_two = resolve([{"name": "vllm-1", "port": 9000}, {"name": "vllm-2"}], gpus(8))
    back = {"instances": {"vllm": one["record"]}}
    assert restored_instances(now_two, back) == resolve([{"name": "vllm-1", "port": 9000}, {"name": "vllm-2"}],
                                                        gpus(8), restore=back)
    # A record that names no instance (the vendor's files) leaves the host's as they are.
    assert restored_instances(now_two, None) == now_two and restored_instances(now_two, {}) == now_two
