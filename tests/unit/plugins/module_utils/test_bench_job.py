"""engine_bench's job (module_utils/_bench_job.py) on its own: what the worker returns when its
measurement raises, each job's folder its own. The module's calls are tested with the module
(tests/unit/plugins/modules/test_engine_bench.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ansible_collections.biv100.serving.plugins.module_utils import _bench_job

REPO = Path(__file__).resolve().parents[4]
# A process of its own starts the job, as the module does: the worker is a fork of its starter.
STARTER = textwrap.dedent("""\
    import json, sys
    from ansible_collections.biv100.serving.plugins.module_utils import _bench_job

    def measure(progress_file):
        if sys.argv[1] == "raise":
            raise RuntimeError("the engine's address is gone")
        return {"changed": False, "progress_file": progress_file}

    print(json.dumps(_bench_job.start(measure)))
    """)


def start(tmp_path, how):
    done = subprocess.run([sys.executable, "-c", STARTER, how], capture_output=True, text=True, check=True, timeout=30,
                          env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(REPO / "collections")))
    job_dir, pid = json.loads(done.stdout)
    return job_dir, pid


def test_a_measurement_that_raises_is_the_jobs_failed_result(tmp_path):
    job_dir, _pid = start(tmp_path, "raise")
    found = _bench_job.status(job_dir, wait=10)
    assert found["finished"] is True
    result = found["result"]
    assert result["failed"] is True and result["msg"] == "the benchmark worker failed: the engine's address is gone"
    assert "RuntimeError" in result["exception"]
    assert not os.path.exists(job_dir)


def test_each_job_has_a_private_folder_and_its_progress_there(tmp_path):
    first, _pid = start(tmp_path, "measure")
    second, _pid = start(tmp_path, "measure")
    assert first != second and {Path(first).parent, Path(second).parent} == {tmp_path}
    found = _bench_job.status(first, wait=10)
    assert found == {"finished": True, "result": {"changed": False,
                                                  "progress_file": os.path.join(first, _bench_job.PROGRESS)}}
    assert not os.path.exists(first) and os.path.exists(second)
    assert _bench_job.status(second, wait=10)["finished"] and not os.path.exists(second)
