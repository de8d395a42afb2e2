"""Fixtures of the stand-in tests: the release the hosts are made from, and engines started
on fresh host folders and stopped by their PIDs."""

import pytest
import vllm_sources

from standin_engines import ENGINE_FLAGS, Engine, make_host


@pytest.fixture(scope="session")
def base_vllm():
    return vllm_sources.ensure_tree(vllm_sources.LAB_BASE_VERSION) / "vllm"


@pytest.fixture
def start(tmp_path, base_vllm):
    """Start engines on fresh hosts; every process started is stopped by its PID."""
    engines = []

    def start_engine(flags=None, env=None, patched=False, wait=True, **host_options):
        host = make_host(tmp_path / f"host{len(engines)}", base_vllm, patched, **host_options)
        flags = ENGINE_FLAGS if flags is None else flags
        engine = Engine(host, flags, env, **({"load_seconds": env.pop("LOAD")}
                                             if env and "LOAD" in env else {}))
        engines.append(engine)
        return engine.wait_started() if wait else engine

    yield start_engine
    for engine in engines:
        engine.stop()
