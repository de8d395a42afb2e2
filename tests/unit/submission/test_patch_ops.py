"""patch_ops.sh, rendered from its template and run under dash against bundles and vllm trees
made here: it installs exactly a variant's payload, recognises the variant by the vendor's
digests, puts the vendor's tree back, and refuses a hostile bundle or tree with nothing changed."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils import _patch_ops

RELEASE = "sub510"
SERVING_CHAT = "entrypoints/openai/serving_chat.py"
PROTOCOL = "entrypoints/openai/protocol.py"
REGISTRY = "model_executor/models/registry.py"
# New in a folder the vendor lacks: the payload makes both.
NEW_PARSER = "entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py"

# A vendor's vllm package, small: model-layer files beside the serving layer's.
VENDOR = {
    "__init__.py": b"",
    "sequence.py": b"class Sequence:\n    pass\n",
    "engine/llm_engine.py": b"class LLMEngine:\n    pass\n",
    "model_executor/layers/sampler.py": b"class Sampler:\n    pass\n",
    REGISTRY: b"_MODELS = {'llama': 'LlamaForCausalLM'}\n",
    PROTOCOL: b"class ChatCompletionRequest:\n    pass\n",
    SERVING_CHAT: b"class OpenAIServingChat:\n    pass\n",
}
# Not the default mode: an install must keep a file's own.
VENDOR_MODES = {SERVING_CHAT: 0o640}
# The other base the fleet ran on: the same release with another model registry.
VENDOR_B = {**VENDOR, REGISTRY: b"_MODELS = {'qwen2': 'Qwen2ForCausalLM'}\n"}

PAYLOAD = {
    SERVING_CHAT: b"class OpenAIServingChat:\n    tools = True\n",
    PROTOCOL: b"class ChatCompletionRequest:\n    thinking = False\n",
    NEW_PARSER: b"class Qwen3CoderToolParser:\n    pass\n",
    REGISTRY: b"_MODELS = {'llama': 'LlamaForCausalLM', 'qwen3_5': 'Qwen3_5'}\n",
}
# Variant B leaves protocol.py the vendor's: a "keep" row.
PAYLOAD_B = {
    SERVING_CHAT: PAYLOAD[SERVING_CHAT],
    NEW_PARSER: PAYLOAD[NEW_PARSER],
    REGISTRY: b"_MODELS = {'qwen2': 'Qwen2ForCausalLM', 'qwen3_5': 'Qwen3_5'}\n",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Variant:
    vendor: dict
    payload: dict  # path -> new bytes, or None for "absent once patched"
    version: str = "0.8.5"
    hosts: tuple = ("lab-1",)

    def base(self, path: str) -> str:
        return sha(self.vendor[path]) if path in self.vendor else "-"

    def result(self, path: str) -> str:
        if path not in self.payload:
            return self.base(path)
        return "-" if self.payload[path] is None else sha(self.payload[path])


def variant_id(variant: Variant, paths: list[str]) -> str:
    return sha("".join(sorted(f"{path}\t{variant.base(path)}\n" for path in paths)).encode())[:12]


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def sign(folder: Path) -> None:
    """SHA256SUMS of every other file of the bundle, as the builder writes it."""
    names = sorted((path.relative_to(folder).as_posix() for path in folder.rglob("*")
                    if not path.is_dir() and path.name != "SHA256SUMS"), key=str.encode)
    (folder / "SHA256SUMS").write_text("".join(f"{sha((folder / name).read_bytes())}  {name}\n" for name in names))


def snapshot(top: Path) -> dict:
    """Every entry under top and what it is: a folder's mode, a file's mode and bytes, a link's text."""
    entries = {}
    for directory, folders, files in os.walk(top):
        for name in folders + files:
            path = Path(directory, name)
            info = path.lstat()
            key = path.relative_to(top).as_posix()
            if stat.S_ISLNK(info.st_mode):
                entries[key] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                entries[key] = ("folder", stat.S_IMODE(info.st_mode))
            else:
                entries[key] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
    return entries


class Case:
    """A vllm tree and a bundle in tmp_path, both below folders whose names hold a space."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.root = tmp_path / "site packages" / "vllm"
        self.folder = tmp_path / "my bundles" / RELEASE
        self.backup = Path(f"{self.root}.patch-ops-backup")
        # python3 and python on PATH that find no vllm, whatever the machine has installed.
        self.plain_pythons = tmp_path / "plain-pythons"
        self.plain_pythons.mkdir()
        for name in ("python3", "python"):
            (self.plain_pythons / name).symlink_to(sys.executable)

    def tree(self, files: dict | None = None, root: Path | None = None) -> Path:
        root = root or self.root
        for path, data in (VENDOR if files is None else files).items():
            write(root / path, data, VENDOR_MODES.get(path, 0o644))
        return root

    def bundle(self, variants: list[Variant] | None = None, interpreters=()) -> list[str]:
        """Writes the bundle; returns the variants' ids, in the order given."""
        variants = variants or [Variant(VENDOR, PAYLOAD)]
        paths = sorted({path for variant in variants for path in variant.payload}, key=str.encode)
        ids = [variant_id(variant, paths) for variant in variants]
        manifest = [f"# biv100.serving submission {RELEASE}: read by patch_ops.sh; see README.md"]
        manifest += ["\t".join(("variant", vid, variant.version, ",".join(variant.hosts)))
                     for vid, variant in sorted(zip(ids, variants))]
        for vid, variant in sorted(zip(ids, variants)):
            for path in paths:
                base, result = variant.base(path), variant.result(path)
                manifest.append("\t".join(("file", vid, path, base, result)))
                # A hostile path gets no payload: writing it would land outside the bundle.
                if result not in (base, "-") and not path.startswith("/") and ".." not in path.split("/"):
                    write(self.folder / "files" / vid / path, variant.payload[path])
        write(self.folder / "MANIFEST", ("\n".join(manifest) + "\n").encode())
        write(self.folder / "patch_ops.sh", _patch_ops.render(RELEASE, interpreters).encode(), 0o755)
        write(self.folder / "README.md", b"# A test bundle\n")
        sign(self.folder)
        return ids

    def run(self, *arguments, locate: bool = False, python: str | None = sys.executable):
        """patch_ops.sh under dash, with a umask that would show any mode it does not set itself;
        given the tree with --vllm-root unless it is to locate one itself."""
        environment = {"PATH": f"{self.plain_pythons}:{os.environ['PATH']}", "HOME": str(self.tmp)}
        if python:
            environment["PYTHON"] = python
        command = ["dash", str(self.folder / "patch_ops.sh")]
        if not locate:
            command += ["--vllm-root", str(self.root)]
        return subprocess.run(command + [str(argument) for argument in arguments], env=environment,
                              capture_output=True, text=True, umask=0o077, timeout=60, check=False)

    def state(self) -> tuple:
        """Everything a run may touch: the tree, the bundle, and whether a backup exists."""
        return snapshot(self.root), snapshot(self.folder), self.backup.exists()


@pytest.fixture
def case(tmp_path):
    return Case(tmp_path)


def lines(output: str) -> list[str]:
    return output.splitlines()


def wrapper(path: Path, body: str) -> Path:
    """An interpreter for --python: a sh script that ends by running this Python."""
    write(path, f"#!/bin/sh\n{body}\nexec {sys.executable} \"$@\"\n".encode(), 0o755)
    return path


# --- installing -------------------------------------------------------------------------------


def test_apply_installs_exactly_the_payload_and_a_second_run_changes_nothing(case):
    case.tree()
    [vid] = case.bundle()
    pristine = snapshot(case.root)

    first = case.run()

    assert first.returncode == 0, first.stderr
    assert [line for line in lines(first.stdout) if line.startswith("  ")] == [
        f"  installed {path}" for path in sorted(PAYLOAD, key=str.encode)]
    assert lines(first.stdout)[-1] == f"patch_ops: {RELEASE} variant {vid}: 4 installed, 0 unchanged - OK"
    expected = dict(pristine)
    expected.update({path: ("file", 0o644, data) for path, data in PAYLOAD.items()})
    expected[SERVING_CHAT] = ("file", 0o640, PAYLOAD[SERVING_CHAT])
    expected["entrypoints/openai/tool_parsers"] = ("folder", 0o755)
    installed = snapshot(case.root)
    assert installed == expected
    backup = snapshot(case.backup)
    assert backup["originals/" + SERVING_CHAT] == ("file", 0o640, VENDOR[SERVING_CHAT])
    assert backup["originals/" + REGISTRY] == ("file", 0o644, VENDOR[REGISTRY])
    assert (case.backup / "absent").read_text() == NEW_PARSER + "\n"

    second = case.run()

    assert second.returncode == 0, second.stderr
    assert [line for line in lines(second.stdout) if line.startswith("  ")] == [
        f"  unchanged {path}" for path in sorted(PAYLOAD, key=str.encode)]
    assert lines(second.stdout)[-1] == f"patch_ops: {RELEASE} variant {vid}: 0 installed, 4 unchanged - OK"
    assert snapshot(case.root) == installed
    assert snapshot(case.backup) == backup


@pytest.mark.parametrize("which", [0, 1])
def test_the_variant_is_the_one_made_for_the_vendors_files(case, which):
    vendors, payloads = (VENDOR, VENDOR_B), (PAYLOAD, PAYLOAD_B)
    case.tree(vendors[which])
    ids = case.bundle([Variant(VENDOR, PAYLOAD, hosts=("lab-1", "lab-2")), Variant(VENDOR_B, PAYLOAD_B, "0.8.5+b")])

    result = case.run()

    assert result.returncode == 0, result.stderr
    assert f"patch_ops: variant {ids[which]} " in result.stdout
    assert (case.root / REGISTRY).read_bytes() == payloads[which][REGISTRY]
    assert (case.root / PROTOCOL).read_bytes() == payloads[which].get(PROTOCOL, VENDOR[PROTOCOL])
    assert ("  kept      " + PROTOCOL in lines(result.stdout)) == (which == 1)


def test_a_tree_of_no_variant_is_refused_naming_the_path_and_both_digests(case):
    other_registry = b"_MODELS = {}\n"
    case.tree({**VENDOR, REGISTRY: other_registry})
    case.bundle([Variant(VENDOR, PAYLOAD), Variant(VENDOR_B, PAYLOAD_B)])
    before = case.state()

    result = case.run()

    assert result.returncode == 1
    for vendor in (VENDOR, VENDOR_B):
        assert f"{REGISTRY} is sha256 {sha(other_registry)} here, the variant needs sha256 {sha(vendor[REGISTRY])}" \
            in result.stderr
    assert "patch_ops: FAILED, nothing changed: " in result.stderr
    assert case.state() == before


def test_dry_run_lists_and_changes_nothing(case):
    case.tree()
    [vid] = case.bundle()
    before = case.state()

    result = case.run("--dry-run")

    assert result.returncode == 0, result.stderr
    assert [line for line in lines(result.stdout) if line.startswith("  ")] == [
        f"  would install {path}" for path in sorted(PAYLOAD, key=str.encode)]
    assert lines(result.stdout)[-1] == (
        f"patch_ops: {RELEASE} variant {vid}: 4 to install, 0 unchanged - DRY RUN, nothing changed")
    assert case.state() == before
    assert not case.backup.exists()


# --- restoring --------------------------------------------------------------------------------


def test_restore_brings_back_the_vendors_tree_byte_for_byte(case):
    case.tree()
    case.bundle()
    pristine = snapshot(case.root)
    assert case.run().returncode == 0
    installed = snapshot(case.root)

    listed = case.run("--restore", "--dry-run")
    restored = case.run("--restore")
    again = case.run("--restore")

    assert listed.returncode == 0, listed.stderr
    assert f"  would remove {NEW_PARSER}" in lines(listed.stdout)
    assert f"  would restore {SERVING_CHAT}" in lines(listed.stdout)
    assert restored.returncode == 0, restored.stderr
    assert lines(restored.stdout)[-1] == f"patch_ops: {RELEASE}: restored 4 file(s) - OK"
    assert f"  removed   {NEW_PARSER}" in lines(restored.stdout)
    assert snapshot(case.root) == pristine != installed
    # The backup goes once the vendor's files are back: nothing is left to restore.
    assert not case.backup.exists()
    assert again.returncode == 0, again.stderr
    assert lines(again.stdout)[-1] == f"patch_ops: no backup at {case.backup}: nothing to restore"


def test_restore_without_a_backup_changes_nothing(case):
    case.tree()
    case.bundle()
    before = case.state()

    result = case.run("--restore")

    assert result.returncode == 0, result.stderr
    assert f"patch_ops: no backup at {case.backup}: nothing to restore" in lines(result.stdout)
    assert case.state() == before


# --- refusing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path, reason", [
    ("entrypoints/../sequence.py", "breaks the path rules"),
    ("/tmp/evil.py", "breaks the path rules"),
    ("sequence.py", "protected file"),
    ("model_executor/layers/sampler.py", "protected file"),
    ("engine/foo.py", "outside the serving layer"),
])
def test_a_hostile_manifest_path_is_refused_with_nothing_changed(case, path, reason):
    case.tree()
    case.bundle([Variant(VENDOR, {**PAYLOAD, path: b"x = 1\n"})])
    before = case.state()

    result = case.run()

    assert result.returncode == 1
    assert "patch_ops: FAILED, nothing changed: MANIFEST line" in result.stderr
    assert path in result.stderr and reason in result.stderr
    assert case.state() == before


def test_a_vendor_file_the_result_removes_is_refused(case):
    case.tree()
    case.bundle([Variant(VENDOR, {**PAYLOAD, PROTOCOL: None})])
    before = case.state()

    result = case.run()

    assert result.returncode == 1
    assert f"{PROTOCOL} would be removed from the vendor's tree" in result.stderr
    assert case.state() == before


def tamper_payload(folder: Path, payload: Path) -> str:
    payload.write_bytes(b"import os\nos.system('id')\n")
    return "does not match its SHA256SUMS: files/"


def add_unlisted_file(folder: Path, payload: Path) -> str:
    write(payload.parent / "extra.py", b"pass\n")
    return "extra.py is not listed in SHA256SUMS"


def link_payload(folder: Path, payload: Path) -> str:
    # Same bytes behind the link, so SHA256SUMS alone would not see it.
    twin = folder.parent / "twin.py"
    twin.write_bytes(payload.read_bytes())
    payload.unlink()
    payload.symlink_to(twin)
    return f"{payload.relative_to(folder).as_posix()} is a symbolic link"


@pytest.mark.parametrize("hostile", [tamper_payload, add_unlisted_file, link_payload])
def test_a_changed_bundle_is_refused_with_nothing_changed(case, hostile):
    case.tree()
    [vid] = case.bundle()
    expected = hostile(case.folder, case.folder / "files" / vid / SERVING_CHAT)
    tree_before = snapshot(case.root)

    result = case.run()

    assert result.returncode == 1
    assert "patch_ops: FAILED, nothing changed: " in result.stderr
    assert expected in result.stderr
    assert snapshot(case.root) == tree_before
    assert not case.backup.exists()


@pytest.mark.parametrize("linked", ["entrypoints/openai", SERVING_CHAT])
def test_a_symbolic_link_on_a_targets_path_is_refused(case, linked):
    case.tree()
    case.bundle()
    # The real entry moves elsewhere and a link takes its place, with the same content behind it.
    elsewhere = case.tmp / "elsewhere" / Path(linked).name
    elsewhere.parent.mkdir()
    (case.root / linked).rename(elsewhere)
    (case.root / linked).symlink_to(elsewhere)
    before = case.state(), snapshot(elsewhere.parent)

    result = case.run()

    assert result.returncode == 1
    assert f"{case.root}/{linked} is a symbolic link" in result.stderr
    assert (case.state(), snapshot(elsewhere.parent)) == before


def test_a_payload_that_does_not_compile_is_refused_before_anything_changes(case):
    case.tree()
    [vid] = case.bundle([Variant(VENDOR, {**PAYLOAD, SERVING_CHAT: b"def broken(:\n    pass\n"})])
    before = case.state()

    result = case.run()

    assert result.returncode == 1
    assert f"files/{vid}/{SERVING_CHAT} does not compile" in result.stderr
    assert "FAILED, nothing changed" in result.stderr
    assert case.state() == before


def test_a_model_layer_change_during_the_run_fails_and_restores_everything(case):
    case.tree()
    case.bundle()
    before = snapshot(case.root)
    # The compile check of the installed files names them under the root: that call changes a
    # model-layer file, as anything else on the machine could while the files go in.
    interpreter = wrapper(case.tmp / "bin" / "python", f"""
for argument in "$@"; do
    case $argument in
        '{case.root}'/*) printf '# changed\\n' >> '{case.root}/sequence.py' ;;
    esac
done""")

    result = case.run("--python", interpreter)

    assert result.returncode == 1
    assert "patch_ops: FAILED, restored 4 file(s): the model layer" in result.stderr
    assert "file sequence.py sha256" in result.stderr
    after = snapshot(case.root)
    assert after.pop("sequence.py") != before.pop("sequence.py")
    assert after == before
    assert not case.backup.exists()


# --- locating vllm ----------------------------------------------------------------------------


def site_with_vllm(case) -> Path:
    """A vllm package only an interpreter with PYTHONPATH=<site> finds, and that interpreter."""
    site = case.tmp / "site"
    case.tree(VENDOR, site / "vllm")
    return wrapper(case.tmp / "bin" / "python-with-site", f"PYTHONPATH={site}\nexport PYTHONPATH")


def test_vllm_is_located_through_python_and_no_byte_code_is_written(case):
    interpreter = site_with_vllm(case)
    case.bundle()

    result = case.run("--python", interpreter, locate=True)

    root = case.tmp / "site" / "vllm"
    assert result.returncode == 0, result.stderr
    assert f"patch_ops: vllm package {root} (found by {interpreter})" in lines(result.stdout)
    assert (root / SERVING_CHAT).read_bytes() == PAYLOAD[SERVING_CHAT]
    assert Path(f"{root}.patch-ops-backup/originals/{SERVING_CHAT}").read_bytes() == VENDOR[SERVING_CHAT]
    assert [path for path in case.tmp.rglob("*") if path.name == "__pycache__" or path.suffix == ".pyc"] == []


def test_vllm_is_located_through_the_fleets_interpreters(case):
    interpreter = site_with_vllm(case)
    case.bundle(interpreters=[str(interpreter)])

    found = case.run(locate=True, python=None)
    case.bundle()
    not_found = case.run(locate=True, python=None)

    assert found.returncode == 0, found.stderr
    assert f"patch_ops: vllm package {case.tmp}/site/vllm (found by {interpreter})" in lines(found.stdout)
    assert not_found.returncode == 1
    assert "no interpreter finds a vllm package (tried python3 (no vllm package), python (no vllm package))" \
        in not_found.stderr


# --- usage and the script itself ---------------------------------------------------------------


@pytest.mark.parametrize("arguments", [["--bogus"], ["--python"], ["--backup-dir="], ["stray"]])
def test_bad_usage_exits_2(case, arguments):
    case.tree()
    case.bundle()
    before = case.state()

    result = case.run(*arguments)

    assert result.returncode == 2
    assert "Usage: patch_ops.sh" in result.stderr
    assert case.state() == before


def test_help_describes_the_options(case):
    case.bundle()

    result = case.run("--help", locate=True)

    assert result.returncode == 0
    assert all(option in result.stdout for option in ("--dry-run", "--restore", "--vllm-root", "--python",
                                                      "--backup-dir"))


def test_the_rendered_script_passes_shellcheck_and_dash(tmp_path):
    scripts = []
    for name, interpreters in (("bare", []), ("fleet", ["/usr/local/corex/bin/python3", "/usr/bin/python3"])):
        scripts.append(tmp_path / f"patch_ops-{name}.sh")
        scripts[-1].write_text(_patch_ops.render(RELEASE, interpreters))

    # The renderings differ only inside one quoted string, so one is shellchecked (a second
    # would double the test's time).
    checked = subprocess.run(["shellcheck", "-s", "sh", str(scripts[1])], capture_output=True, text=True,
                             check=False)
    parsed = [subprocess.run(["dash", "-n", str(script)], capture_output=True, text=True, check=False)
              for script in scripts]

    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")
    assert [(result.returncode, result.stderr) for result in parsed] == [(0, "")] * 2
    assert not [placeholder for placeholder in ("RELEASE", "INTERPRETERS", "SERVING_PATTERNS", "PROTECTED_PATTERNS")
                if f"@{placeholder}@" in scripts[1].read_text()]
