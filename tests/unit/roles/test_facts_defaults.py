"""The facts role finds the collection's own engines by the pid files engine_process writes."""

from pathlib import Path

import jinja2
import yaml
from ansible.plugins.filter.core import regex_replace

REPO = Path(__file__).resolve().parents[3]


def pid_files(**variables) -> list:
    defaults = yaml.safe_load((REPO / "roles" / "facts" / "defaults" / "main.yml").read_text())
    environment = jinja2.Environment()
    environment.filters["regex_replace"] = regex_replace
    return environment.from_string(defaults["facts_engine_pid_files"]).render(**variables)


def test_the_engine_pid_file_follows_the_engines_name():
    # engine_process's default: /run/biv100-serving/<name>.pid, name engine_name (vllm).
    assert pid_files() == "['/run/biv100-serving/vllm.pid']"
    assert pid_files(engine_name="qwen35") == "['/run/biv100-serving/qwen35.pid']"


def test_a_host_of_several_instances_has_a_pid_file_for_each():
    instances = [{"name": "vllm-1"}, {"name": "vllm-2", "port": 8001}]
    assert pid_files(engine_instances=instances, engine_name="vllm") == (
        "['/run/biv100-serving/vllm-1.pid', '/run/biv100-serving/vllm-2.pid']")
