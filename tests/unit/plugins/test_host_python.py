"""Host-side code runs on the host's Python: nothing newer than 3.8 may be used there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
HOST_SIDE = [REPO_ROOT / "plugins" / "modules", REPO_ROOT / "plugins" / "module_utils"]
VERMIN = [
    str(Path(sys.executable).with_name("vermin")),
    "-q",
    "--no-tips",
    "-t=3.8-",
    "--violations",
]


def test_host_side_code_needs_nothing_newer_than_python_3_8():
    result = subprocess.run(
        VERMIN + [str(path) for path in HOST_SIDE], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (0, "")


def test_vermin_does_flag_newer_apis(tmp_path):
    # Guards the test above against passing vacuously (a wrong flag, an empty scan).
    (tmp_path / "newer.py").write_text('print("vllm-0.8.5".removeprefix("vllm-"))\n')
    result = subprocess.run(VERMIN + [str(tmp_path)], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "str.removeprefix" in result.stdout
