"""The facts role finds the collection's own engine by the pid file engine_process writes."""

from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[3]


def pid_file(**variables) -> str:
    defaults = yaml.safe_load((REPO / "roles" / "facts" / "defaults" / "main.yml").read_text())
    return jinja2.Template(defaults["facts_engine_pid_file"]).render(**variables)


def test_the_engine_pid_file_follows_the_engines_name():
    # engine_process's default: /run/biv100-serving/<name>.pid, name engine_name (vllm).
    assert pid_file() == "/run/biv100-serving/vllm.pid"
    assert pid_file(engine_name="qwen35") == "/run/biv100-serving/qwen35.pid"
