"""execution-environment.yml makes a build context that names the collection from this checkout and
the controller's pinned Python packages: `ansible-builder create` (no container engine needed) on a
copy of the checkout, then the context's galaxy stage done here as the image build does it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DEFINITION = REPO / "execution-environment.yml"
# The folders of the collection that playbooks use at run time, and its license texts.
CONTENT = ("meta/", "plugins/", "roles/", "playbooks/", "files/", "LICENSE")


def pins(path: Path) -> dict[str, str]:
    """name -> version of each `name==version` line of a requirements file."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = version
    return found


def tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, checkout_copy) -> Path:
    return checkout_copy(tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="module")
def context(checkout, tmp_path_factory) -> Path:
    context = tmp_path_factory.mktemp("ee") / "context"
    done = subprocess.run([tool("ansible-builder"), "create", "--file", str(checkout / DEFINITION.name),
                           "--context", str(context), "--output-filename", "Containerfile"],
                          cwd=checkout, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return context


@pytest.fixture(scope="module")
def installed(context, tmp_path_factory) -> Path:
    """The collection as the image's galaxy stage installs it: ansible-galaxy run in _build, which
    the Containerfile copies to /build and works in, with no other collection path."""
    collections = tmp_path_factory.mktemp("collections")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_GALAXY_DISABLE_GPG_VERIFY="1")
    env.pop("ANSIBLE_CONFIG", None)
    done = subprocess.run([tool("ansible-galaxy"), "collection", "install", "-r", "requirements.yml",
                           "--collections-path", str(collections)], cwd=context / "_build", env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return collections / "ansible_collections" / "biv100" / "serving"


def test_the_containerfile_installs_the_pinned_ansible_and_the_collection(context):
    containerfile = (context / "Containerfile").read_text()
    pinned = pins(REPO / "requirements.txt")

    assert f'ARG ANSIBLE_INSTALL_REFS="ansible-core=={pinned["ansible-core"]} ' \
           f'ansible-runner=={pinned["ansible-runner"]}"' in containerfile
    assert "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml" in containerfile
    assert "--user-pip=requirements.txt --user-bindep=bindep.txt" in containerfile
    assert "LABEL ansible-execution-environment=true" in containerfile


def test_the_context_names_the_collection_from_this_checkout(context):
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert requirements == {"collections": [{"name": "biv100.serving", "type": "dir", "source": "biv100.serving"}]}

    copy = context / "_build" / "biv100.serving"
    galaxy = yaml.safe_load((copy / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("biv100", "serving")
    assert (copy / "meta" / "runtime.yml").is_file() and (copy / "plugins" / "callback" / "ledger.py").is_file()


def test_the_context_carries_the_controllers_python_packages_and_an_ssh_client(context, checkout):
    assert (context / "_build" / "requirements.txt").read_text() == (checkout / "requirements-ee.txt").read_text()
    assert "openssh-clients [platform:rpm]" in (context / "_build" / "bindep.txt").read_text().splitlines()


def test_the_image_gets_the_collection_with_everything_playbooks_use(installed, checkout, tmp_path):
    manifest = yaml.safe_load((installed / "MANIFEST.json").read_text())["collection_info"]
    galaxy = yaml.safe_load((checkout / "galaxy.yml").read_text())
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("biv100", "serving", galaxy["version"])

    # The same files under the content folders as `ansible-galaxy collection build` packs.
    done = subprocess.run([tool("ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(checkout)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    [tarball] = tmp_path.glob("biv100-serving-*.tar.gz")
    with tarfile.open(tarball) as archive:
        packed = {member.name for member in archive.getmembers() if member.isfile()}
    content = {str(path.relative_to(installed)) for path in installed.rglob("*") if path.is_file()}
    for prefix in CONTENT:
        in_tarball = {name for name in packed if name.startswith(prefix)}
        assert in_tarball and in_tarball == {name for name in content if name.startswith(prefix)}, prefix


def test_the_python_packages_are_requirements_txts_pins_and_all_the_controller_needs():
    pinned = pins(REPO / "requirements.txt")
    image = pins(REPO / "requirements-ee.txt")
    definition = yaml.safe_load(DEFINITION.read_text())["dependencies"]

    assert {name: pinned[name] for name in image} == image
    for name in ("ansible_core", "ansible_runner"):
        requirement = Requirement(definition[name]["package_pip"])
        assert str(requirement.specifier) == f"=={pinned[canonicalize_name(requirement.name)]}"
    # jmespath (the probes' expectations), jsonschema (their JSON Schemas and the quality set's),
    # scipy (the canary analysis judge), matplotlib (the report's plots) and what they, ansible-core and ansible-runner need, as
    # installed beside them here: nothing left to whatever the index has on the day of a build.
    # A package needed only below some Python (typing_extensions under 3.13) is pinned too: the
    # image's Python may be older than the one running this test.
    needed, older_pythons = set(), set()
    todo = ["ansible-core", "ansible-runner", "jmespath", "jsonschema", "scipy", "matplotlib"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in needed:
            needed.add(name)
            for requirement in map(Requirement, distribution(name).requires or ()):
                if not requirement.marker or requirement.marker.evaluate({"extra": ""}):
                    todo.append(requirement.name)
                elif "python_version" in str(requirement.marker):
                    older_pythons.add(canonicalize_name(requirement.name))
    assert needed - {"ansible-core", "ansible-runner"} <= set(image)
    assert set(image) - needed <= older_pythons, set(image) - needed
