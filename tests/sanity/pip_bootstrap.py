"""Stand-in for the get-pip.py that ansible-test downloads to bootstrap pip into its venvs.

ansible-test (2.19 and 2.21) bootstraps pip into each venv it makes by running get-pip.py, which it
downloads from Ansible's CI file server unless ~/.ansible/test/cache/get_pip_<version>.py
is already there (ansible_test/_util/target/setup/requirements.py, ``bootstrap``). That host is
out of reach of the team's machines; the package index is not.

``python tests/sanity/pip_bootstrap.py --seed`` (``make lint`` and ``make sanity-2.21`` run it,
each with the Python of its ansible-test) puts this file in that cache under the name that
ansible-test looks for. There it takes what ansible-test passes to
get-pip.py (pip options, the pinned ``pip==<version>``, ``--no-setuptools``, ``--no-wheel``):
the interpreter's own ``ensurepip`` puts a pip in the empty venv with no download, and that
pip installs the requested packages from the package index, as get-pip.py would.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import types

# get-pip.py's own switches: what else not to install; pip does not know them.
GET_PIP_FLAGS = {'--no-setuptools': 'setuptools', '--no-wheel': 'wheel'}
# Where ansible-test looks before it downloads; the same expanduser, so the same HOME.
CACHE = '~/.ansible/test/cache'
# The Pythons of ansible-test 2.19 (3.8 to 3.13) and 2.21 (3.9 to 3.14); each may pin its own pip.
PYTHON_VERSIONS = ('3.8', '3.9', '3.10', '3.11', '3.12', '3.13', '3.14')


def installed() -> set[str]:
    """Return the names of the distributions installed in this interpreter's environment."""
    return {(dist.metadata['Name'] or '').lower() for dist in importlib.metadata.distributions()}


def bootstrap(argv: list[str]) -> None:
    """Bootstrap pip with ensurepip, then install what ansible-test asked for."""
    args = [arg for arg in argv if arg not in GET_PIP_FLAGS]
    unwanted = {GET_PIP_FLAGS[arg] for arg in argv if arg in GET_PIP_FLAGS}
    before = installed()

    # In a child process: ensurepip clears the PIP_* settings and pip's configuration file of the
    # process it runs in, and the install below needs them (index, proxy, certificates).
    subprocess.run([sys.executable, '-m', 'ensurepip', '--upgrade'], check=True)

    # ensurepip also brings setuptools on some Pythons; get-pip.py leaves out what it was told to.
    extra = sorted(name for name in unwanted & (installed() - before))

    if extra:
        subprocess.run([sys.executable, '-m', 'pip', 'uninstall', '--yes', '--quiet', *extra], check=True)

    subprocess.run([sys.executable, '-m', 'pip', 'install', '--upgrade', *args], check=True)


def pip_versions() -> set[str]:
    """Return the pip versions the installed ansible-test bootstraps, over every Python it supports."""
    # Imported here: as get-pip.py this file runs in venvs that have no ansible-test.
    from ansible_test._internal.python_requirements import get_venv_packages

    return {get_venv_packages(types.SimpleNamespace(version=version))['pip'] for version in PYTHON_VERSIONS}


def seed(cache: str = CACHE) -> list[str]:
    """Copy this file to where ansible-test looks for get-pip.py; return the paths written.

    A get-pip.py already there that is not a copy of this file (one downloaded by hand) is left
    alone; an older copy of this file is replaced.
    """
    with open(__file__, 'rb') as stream:
        ours = stream.read()

    marker = ours.splitlines()[0]
    written = []

    for version in sorted(pip_versions()):
        path = os.path.join(os.path.expanduser(cache), 'get_pip_%s.py' % version.replace('.', '_'))

        if os.path.exists(path):
            with open(path, 'rb') as stream:
                there = stream.read()

            if there == ours or not there.startswith(marker):
                continue

        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = path + '.seed'
        shutil.copyfile(__file__, temporary)
        os.replace(temporary, path)
        written.append(path)

    return written


def main() -> None:
    """Seed ansible-test's cache with --seed; otherwise act as get-pip.py."""
    if sys.argv[1:] == ['--seed']:
        for path in seed():
            print('ansible-test pip bootstrap: %s' % path)
    else:
        bootstrap(sys.argv[1:])


if __name__ == '__main__':
    main()
