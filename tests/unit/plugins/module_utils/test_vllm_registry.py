"""Registry parsing and model checks, over the real vLLM releases and synthetic registries."""

from __future__ import annotations

import ast
import json
import textwrap

import pytest

from ansible_collections.biv100.serving.plugins.module_utils import _vllm_registry as registry
from vllm_sources import LAYOUT_VERSIONS

REGISTRY = "model_executor/models/registry.py"

# (has_qwen3_5, plausible number of architectures, entries that must be there) per release.
EXPECTED_REGISTRIES = {
    "0.8.5": (False, range(120, 200), {"LlamaForCausalLM": ["llama", "LlamaForCausalLM"]}),
    "0.10.1.1": (False, range(150, 250), {"Qwen3ForCausalLM": ["qwen3", "Qwen3ForCausalLM"]}),
    "0.11.0": (
        False,
        range(150, 280),
        {"Qwen3NextForCausalLM": ["qwen3_next", "Qwen3NextForCausalLM"]},
    ),
    "0.33.0": (
        True,
        range(300, 600),
        {
            "Qwen3_5ForConditionalGeneration": ["qwen3_5", "Qwen3_5ForConditionalGeneration"],
            "Qwen3_5ForCausalLM": ["qwen3_5", "Qwen3_5ForCausalLM"],
            "Qwen3_5MTP": ["qwen3_5_mtp", "Qwen3_5MTP"],
        },
    ),
}


@pytest.fixture(scope="module")
def registries(vllm_trees):
    return {
        version: registry.registry_facts(str(root), REGISTRY)
        for version, root in vllm_trees.items()
    }


@pytest.mark.parametrize("version", LAYOUT_VERSIONS)
def test_real_registries_parse_completely(registries, version):
    has_qwen3_5, plausible_count, known_entries = EXPECTED_REGISTRIES[version]
    facts = registries[version]
    assert facts["error"] is None and facts["unresolved"] == []
    assert facts["has_qwen3_5"] is has_qwen3_5
    assert len(facts["architectures"]) in plausible_count
    for name, module_and_class in known_entries.items():
        assert facts["architectures"][name] == module_and_class


@pytest.mark.parametrize("version", LAYOUT_VERSIONS)
def test_real_registries_match_what_python_builds_from_their_tables(
    registries, vllm_trees, version
):
    # The oracle: Python itself evaluating the registry's *_MODELS assignments, which are pure
    # literals and comprehensions over them (the rest of the file, with its imports, is left out).
    source = (vllm_trees[version] / REGISTRY).read_text()
    namespace = {}
    for statement in ast.parse(source).body:
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if targets and all(isinstance(t, ast.Name) and t.id.endswith("_MODELS") for t in targets):
            code = compile(ast.Module(body=[statement], type_ignores=[]), REGISTRY, "exec")
            exec(code, namespace)  # noqa: S102
    expected = {name: list(pair) for name, pair in namespace["_VLLM_MODELS"].items()}
    assert registries[version]["architectures"] == expected


def parse(source):
    return registry.parse_registry(textwrap.dedent(source), REGISTRY)


def test_merges_follow_source_order_and_later_entries_win():
    architectures, unresolved = parse("""
        _TEXT = {"A": ("a", "A"), "B": ("b", "B")}
        _EMBED = {"B": ("b_embed", "BEmbed")}
        _VLLM_MODELS = {**_TEXT, **_EMBED, "C": ("c", "C")}
        _TEXT["D"] = ("d", "D")
        """)
    assert architectures == {"A": ["a", "A"], "B": ["b_embed", "BEmbed"], "C": ["c", "C"]}
    assert unresolved == []


def test_comprehension_conditions_are_evaluated():
    architectures, unresolved = parse("""
        _TEXT = {"L": ("llama", "LlamaForCausalLM"), "M": ("llama", "LlamaForCausalLM"),
                 "Q": ("qwen3", "Qwen3ForCausalLM")}
        _EMBED: dict = {
            **{k: (mod, arch) for k, (mod, arch) in _TEXT.items()
               if arch == "LlamaForCausalLM" and not k in ("M",)},
        }
        _VLLM_MODELS = {**_EMBED}
        """)
    assert architectures == {"L": ["llama", "LlamaForCausalLM"]}
    assert unresolved == []


def test_a_condition_it_cannot_evaluate_keeps_every_entry_and_is_reported():
    architectures, unresolved = parse("""
        _TEXT = {"L": ("llama", "LlamaForCausalLM"), "Q": ("qwen3", "Qwen3ForCausalLM")}
        _VLLM_MODELS = {**{k: v for k, v in _TEXT.items() if k.startswith("L")}}
        """)
    assert sorted(architectures) == ["L", "Q"]
    assert unresolved == [
        REGISTRY + ' line 3: condition not evaluated, every entry kept k.startswith("L")'
    ]


def test_what_it_cannot_evaluate_is_left_out_and_reported_with_its_line():
    architectures, unresolved = parse("""
        _VERSIONS = {"Old": "0.9.2"}
        _VLLM_MODELS = {
            "A": ("a", "A"),
            **_plugin_models(),
            **_VERSIONS,
            "B": ("b", _CLASS_NAME),
            "C": ("c", "C", "extra"),
        }
        """)
    assert architectures == {"A": ["a", "A"]}
    assert unresolved == [
        REGISTRY + " line 5: cannot expand ** _plugin_models()",
        REGISTRY + " line 6: cannot expand ** _VERSIONS",
        REGISTRY + ' line 7: not an "Arch": ("module", "Class") entry "B"',
        REGISTRY + ' line 8: not an "Arch": ("module", "Class") entry "C"',
    ]


def test_a_syntax_error_is_named_with_its_line():
    with pytest.raises(
        registry.RegistryError, match=r"^model_executor/models/registry.py line 3: "
    ):
        parse("""
            _VLLM_MODELS = {
                "A": ("a", "A")
                "B": ("b", "B"),
            }
            """)


def test_a_registry_without_the_merged_table_is_an_error():
    with pytest.raises(registry.RegistryError, match="no module-level _VLLM_MODELS dict"):
        parse('_MODELS = {"A": ("a", "A")}')


def test_a_registry_with_qwen3_5_added_to_the_real_0_10_1_1_one(vllm_trees, tmp_path):
    # The vendor base: a V0-era registry with the Qwen3.5 architectures added to its text table.
    source = (vllm_trees["0.10.1.1"] / REGISTRY).read_text()
    vendor = source.replace(
        "_TEXT_GENERATION_MODELS = {\n",
        "_TEXT_GENERATION_MODELS = {\n"
        '    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),\n',
        1,
    )
    registry_file = tmp_path / REGISTRY
    registry_file.parent.mkdir(parents=True)
    registry_file.write_text(vendor)
    facts = registry.registry_facts(str(tmp_path), REGISTRY)
    assert facts["has_qwen3_5"] is True
    assert facts["architectures"]["Qwen3_5ForConditionalGeneration"] == [
        "qwen3_5",
        "Qwen3_5ForConditionalGeneration",
    ]


def test_registry_problems_are_facts_not_exceptions(tmp_path):
    missing = registry.registry_facts(str(tmp_path), None)
    assert missing["error"] == "model_executor/models/registry.py: not found in the vllm package"
    registry_file = tmp_path / REGISTRY
    registry_file.parent.mkdir(parents=True)
    registry_file.write_text("_VLLM_MODELS = {\n    'A': ('a', 'A'),\n    def\n}\n")
    broken = registry.registry_facts(str(tmp_path), REGISTRY)
    assert broken["error"] == REGISTRY + " line 3: invalid syntax"
    assert broken["architectures"] == {} and broken["has_qwen3_5"] is False


def write_config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


SERVED = {"Qwen3ForCausalLM": ["qwen3", "Qwen3ForCausalLM"]}


def test_a_model_the_registry_serves(vllm_trees, tmp_path):
    model = write_config(
        tmp_path, {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 40960}
    )
    facts = registry.model_facts(model, str(vllm_trees["0.10.1.1"]), SERVED)
    assert facts == {
        "path": model,
        "error": None,
        "architectures": ["Qwen3ForCausalLM"],
        "max_position_embeddings": 40960,
        "served": True,
        "missing": [],
        "registrable": {},
        "defined_in": {},
    }


def test_a_model_a_model_file_defines_but_the_registry_lacks(vllm_trees, tmp_path):
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration", "Qwen9ForCausalLM"],
        "text_config": {"max_position_embeddings": 262144},
    }
    facts = registry.model_facts(write_config(tmp_path, config), str(vllm_trees["0.33.0"]), SERVED)
    assert facts["served"] is False
    assert facts["max_position_embeddings"] == 262144
    assert facts["missing"] == ["Qwen3_5ForConditionalGeneration", "Qwen9ForCausalLM"]
    assert facts["registrable"] == {
        "Qwen3_5ForConditionalGeneration": True,
        "Qwen9ForCausalLM": False,
    }
    assert facts["defined_in"] == {
        "Qwen3_5ForConditionalGeneration": "model_executor/models/qwen3_5.py"
    }


@pytest.mark.parametrize(
    "content, error",
    [
        (None, "cannot read {config}: [Errno 2] No such file or directory: '{config}'"),
        ("{not json", "cannot read {config}: Expecting property name enclosed in double quotes"),
        ('{"model_type": "qwen3"}', "{config} declares no architectures"),
        ('["Qwen3ForCausalLM"]', "{config} declares no architectures"),
    ],
)
def test_an_unusable_config_is_an_error_naming_the_file(tmp_path, content, error):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    facts = registry.model_facts(str(tmp_path), str(tmp_path), SERVED)
    assert facts["error"].startswith(error.format(config=tmp_path / "config.json"))
    assert facts["served"] is False and facts["architectures"] == []


def test_class_definitions_are_found_at_top_level_only(tmp_path):
    models = tmp_path / registry.MODELS_DIR
    models.mkdir(parents=True)
    (models / "a.py").write_text("class Helper:\n    class Nested(Base):\n        pass\n")
    (models / "b.py").write_text(
        "class NestedForCausalLM(nn.Module):\n    pass\nclass Nested(Base): ...\n"
    )
    found = registry.find_class_definitions(str(tmp_path), ["Nested", "Absent"])
    assert found == {"Nested": "model_executor/models/b.py"}
