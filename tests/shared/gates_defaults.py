"""The serving role's defaults, read from the role: the competition's gates and bounds are defined
there once, and the tests take them from there."""

from __future__ import annotations

from pathlib import Path

import yaml

DEFAULTS = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "roles" / "serving" / "defaults" / "main.yml").read_text())

# {functional: {min_probes}, quality: {bound}, throughput: {score, weights: {output, input}}}
COMPETITION = DEFAULTS["serving_competition"]
WEIGHTS = COMPETITION["throughput"]["weights"]
SCORE_GATE = COMPETITION["throughput"]["score"]
QUALITY_BOUND = COMPETITION["quality"]["bound"]
