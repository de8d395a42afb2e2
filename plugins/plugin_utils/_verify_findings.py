# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every way a host differs from what its last deploy left, one sentence each: what verify.yml
reports. An engine instance's own findings are made as its checks end (the run record keeps
them); the host's are made from the host's checks and those.

Controller side only: standard library.
"""

from __future__ import annotations


def host_findings(checks: dict) -> list[str]:
    """Sentences from the host's checks (guard, release; `instances`: {name: an instance's
    findings, or its engine and probes results}; `engines`, the collection's running engines as
    gpu_facts lists them); empty when the host is as deployed and its engines pass the probes.
    On a host of several instances each instance's sentences start with its name."""
    found = [*_guard(checks.get("guard") or {}), *_release(checks.get("release") or {})]
    instances = checks.get("instances") or {}
    for name, instance in instances.items():
        prefix = f"{name}: " if len(instances) > 1 else ""
        found.extend(prefix + sentence for sentence in _of_instance(instance or {}))
    found.extend(_outside_the_layout(checks.get("engines") or [], list(instances)))
    return found


def instance_findings(engine: dict, probes: dict) -> list[str]:
    """An engine instance's sentences: its process and env file (engine_process, state status)
    against the desired ones, and its failed probes (engine_probe)."""
    return [*_engine(engine or {}), *_probes(probes or {})]


def healthy_line(label: str, engine: dict, probes: dict) -> str:
    """What verify.yml says of a healthy instance."""
    return f"{label}: engine pid {(engine or {}).get('pid')}, {(probes or {}).get('summary') or 'no probes'}"


def _of_instance(instance: dict) -> list[str]:
    if "findings" in instance:
        return list(instance["findings"])
    return instance_findings(instance.get("engine") or {}, instance.get("probes") or {})


def _outside_the_layout(engines: list, layout: list) -> list[str]:
    """The collection's engines that run although the host's layout names none of that name:
    left by a layout a deploy has not yet replaced, they hold GPUs and a port."""
    return [f"engine {engine['name']} runs outside the host's layout ({', '.join(layout)}): pid "
            f"{engine.get('pid')}, {engine.get('manager')}, port(s) "
            f"{', '.join(str(port) for port in engine.get('ports') or []) or 'none'}; a deploy retires it"
            for engine in engines if engine.get("name") not in layout]


def _guard(result: dict) -> list[str]:
    clean = result.get("guard") and not result["guard"].get("mismatches")
    return [] if clean else [f"model layer: {result.get('msg', 'the guard did not run')}"]


def _release(result: dict) -> list[str]:
    if result.get("failed"):
        return [f"release: {result.get('msg')}"]
    if not result.get("release"):
        return ["release: none deployed on this host"]
    return [f"serving file drift from release {result['release']}: {sentence}"
            for sentence in result.get("drift", [])]


def _engine(result: dict) -> list[str]:
    if result.get("failed"):
        return [f"engine: {result.get('msg')}"]
    found = [] if result.get("env_file_matches", True) else [
        f"env file {result.get('env_file', 'of the engine')}: differs from the desired one"]
    if not result.get("running"):
        return ["engine: not running", *found]
    return [f"engine drift: {sentence}" for sentence in result.get("drift", [])] + found


def _probes(result: dict) -> list[str]:
    if "probes" not in result:
        return [f"probes did not run: {result.get('msg', 'no result')}"]
    failed = [probe for probe in result["probes"] if not probe["passed"]]
    return [f"probe {probe['name']} failed (guards: {probe['guards']}): expected "
            f"{probe['failed_expectation']}" for probe in failed]
