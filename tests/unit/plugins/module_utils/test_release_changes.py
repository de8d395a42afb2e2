"""What a release changed against the last good one, each change with its mapping."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.module_utils._release_changes import release_changes

CHAT = "entrypoints/openai/serving_chat.py"
PROTOCOL = "entrypoints/openai/protocol.py"
BASE = {CHAT: "vendor-chat", PROTOCOL: "vendor-protocol"}
N_WITHIN = {"entry": "n-within", "source": "refuse n above max_num_seqs", "place": "serving_chat.py",
            "change": "patch", "proven_by": ["n-above-max-num-seqs"], "paths": [CHAT]}
THINKING = {"entry": "thinking-off", "source": "thinking off for tools", "place": "protocol.py",
            "change": "patch", "proven_by": [], "paths": [PROTOCOL]}
SUB168 = {"max_model_len": 256000, "max_num_seqs": 2, "dtype": "half"}
DECLARED = [
    {"settings": ["engine_args.max_model_len", "engine_args.max_num_seqs"], "source": "device_reduce policy_selector",
     "place": "computility-run.yaml params", "change": "launch parameters aligned with Sub168", "proven_by": []},
    {"settings": ["engine_args.dtype"], "source": "tuning_find_bound_sorted_values", "change": "type-size adaptation",
     "proven_by": []},
    {"settings": ["engine_allocator"], "source": "buddy_allocator.cu", "proven_by": ["two-long-prompts-at-once"]},
]


def release(digests, mappings, args=None, allocator=None, env=None, entries=None):
    return {"digests": digests, "mappings": mappings,
            "entries": entries if entries is not None else [mapping["entry"] for mapping in mappings],
            "engine": {"instances": {"vllm": {"args": dict(args or SUB168), "allocator": dict(allocator or {}),
                                              "env": dict(env or {})}}}}


def test_against_the_vendors_base_every_entry_and_every_setting_is_a_change_each_with_its_mapping():
    first = release({CHAT: "ours"}, [N_WITHIN], allocator={"max_split_size_mb": 512})

    changes = release_changes(first, None, DECLARED, BASE)

    assert changes == [
        {"kind": "file", "source": "refuse n above max_num_seqs", "place": "serving_chat.py", "change": "patch",
         "proven_by": ["n-above-max-num-seqs"], "what": CHAT, "entry": "n-within"},
        {"kind": "setting", "source": "device_reduce policy_selector", "place": "computility-run.yaml params",
         "change": "launch parameters aligned with Sub168", "proven_by": [],
         "what": "max_model_len = 256000; max_num_seqs = 2",
         "settings": ["engine_args.max_model_len", "engine_args.max_num_seqs"]},
        {"kind": "setting", "source": "tuning_find_bound_sorted_values", "place": "computility-run.yaml parameters",
         "change": "type-size adaptation", "proven_by": [], "what": "dtype = half", "settings": ["engine_args.dtype"]},
        {"kind": "setting", "source": "buddy_allocator.cu", "place": "computility-run.yaml env PYTORCH_CUDA_ALLOC_CONF",
         "change": "PYTORCH_CUDA_ALLOC_CONF", "proven_by": ["two-long-prompts-at-once"],
         "what": "max_split_size_mb = 512", "settings": ["engine_allocator.max_split_size_mb"]},
    ]


def test_against_the_last_good_release_only_what_differs_is_a_change():
    good = release({CHAT: "ours"}, [N_WITHIN], allocator={"max_split_size_mb": 512})
    same = release({CHAT: "ours"}, [N_WITHIN], allocator={"max_split_size_mb": 512})
    assert release_changes(same, good, DECLARED, BASE) == []

    moved = release({CHAT: "ours", PROTOCOL: "ours too"}, [N_WITHIN, THINKING], args=dict(SUB168, max_num_seqs=4),
                    allocator={"max_split_size_mb": 512, "expandable_segments": True}, env={"VLLM_LOGGING_LEVEL": "DEBUG"})

    changes = release_changes(moved, good, DECLARED, BASE)

    assert [(row["kind"], row["source"], row["what"]) for row in changes] == [
        ("file", "thinking off for tools", PROTOCOL),
        ("setting", "device_reduce policy_selector", "max_num_seqs 2 -> 4"),
        ("setting", "buddy_allocator.cu", "expandable_segments = true"),
        # Nothing maps it: recorded with an empty source, so that it stands out.
        ("setting", "", "VLLM_LOGGING_LEVEL = DEBUG"),
    ]
    assert changes[-1]["place"] == "computility-run.yaml env" and changes[-1]["change"] == "environment variable"


def test_an_entry_the_release_dropped_and_a_file_no_entry_claims_are_changes_too():
    good = release({CHAT: "ours", PROTOCOL: "ours too"}, [N_WITHIN, THINKING])
    # thinking-off dropped: protocol.py goes back to the vendor's; a stray file the manifest maps nowhere.
    later = release({CHAT: "ours", PROTOCOL: "vendor-protocol", "entrypoints/openai/extra.py": "x"}, [N_WITHIN])

    changes = release_changes(later, good, [], BASE)

    assert [(row["source"], row["change"], row["what"]) for row in changes] == [
        ("thinking off for tools", "removed: patch", PROTOCOL),
        ("", "file", "entrypoints/openai/extra.py"),
    ]


def test_a_record_whose_mappings_name_no_files_counts_an_entry_new_to_the_last_good_release():
    old_shape = dict(N_WITHIN)
    del old_shape["paths"]
    good = release({CHAT: "ours"}, [old_shape])
    later = release({CHAT: "ours"}, [old_shape, dict(THINKING, paths=None)], entries=["n-within", "thinking-off"])
    del later["mappings"][1]["paths"]

    assert [row["entry"] for row in release_changes(later, good, [], BASE)] == ["thinking-off"]
