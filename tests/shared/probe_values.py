"""The values the probe role gives the suites' ${...} placeholders, computed by the role's own
formulas (roles/probe/vars/main.yml) for an engine's arguments, so that a test filling probes by
hand fills them as a deploy does."""

from __future__ import annotations

from pathlib import Path

import yaml
from jinja2.nativetypes import NativeEnvironment

ROLE_VARS = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "roles" / "probe" / "vars" / "main.yml").read_text())


def probe_values(args: dict, served_model_name: str) -> dict:
    """{placeholder: value} for an instance serving `served_model_name` with engine `args`
    (snake_case, as the instance's record holds them)."""
    context = {"probe_instance": {"served_model_name": served_model_name, "record": {"args": args}},
               "probe_engine_args": args}
    environment = NativeEnvironment()
    return {name: environment.from_string(formula).render(context)
            for name, formula in ROLE_VARS["probe_values"].items()}
