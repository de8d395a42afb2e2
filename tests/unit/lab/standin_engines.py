"""Stand-in engines for the tests: a host-like folder (the vllm files the stand-in reads, the
lab's ixsmi, a model) and the stand-in serving it on loopback, as the lab runs it."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ansible_collections.biv100.serving.plugins.plugin_utils._allocator_conf import allocator_conf
from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS

CHECKOUT = Path(__file__).resolve().parents[3]
LAB_DIR = CHECKOUT / "tests" / "lab"
STANDIN_DIR = LAB_DIR / "engine_standin"
PATCHES = CHECKOUT / "files" / "serving" / "patches"
SERVING_FIX_PATCHES = ("serving_chat-n-within-max-num-seqs.patch",
                       "protocol-thinking-off-for-tools.patch")
READ_FILES = ("entrypoints/openai/serving_chat.py", "entrypoints/openai/protocol.py",
              "model_executor/models/registry.py")
MODEL_CONFIG = {"architectures": ["Qwen3MoeForCausalLM"], "max_position_embeddings": 4096,
                "num_attention_heads": 32}
SERVED = "qwen3"
ENGINE_FLAGS = ["--served-model-name", SERVED, "--max-num-seqs", "2", "-tp", "4",
                "--dtype", "half", "--enable-chunked-prefill", "--enforce-eager",
                "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                "--reasoning-parser", "qwen3"]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}
# How long a start, an exit or a stop may take: only a failure waits it out, and a loaded
# machine takes seconds to start Python.
START_TIMEOUT = 60


def make_host(root, base_vllm, patched=False, gpus=4, architecture=None):
    """A host-like folder: site-packages with the read vllm files, ixsmi, a model."""
    site = root / "site-packages"
    for relative in READ_FILES:
        target = site / "vllm" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(base_vllm / relative, target)
    (site / "vllm" / "__init__.py").write_text("")
    dist_info = site / "vllm-0.10.1.1+corex.4.3.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\n"
                                        "Version: 0.10.1.1+corex.4.3.0\n")
    if patched:
        for patch in SERVING_FIX_PATCHES:
            subprocess.run(["patch", "-s", "-p1", "-d", str(site), "-i", str(PATCHES / patch)],
                           check=True)
    corex_bin = root / "corex" / "bin"
    corex_bin.mkdir(parents=True)
    shutil.copy(LAB_DIR / "ixsmi.py", corex_bin / "ixsmi")
    (corex_bin / "ixsmi").chmod(0o755)
    (root / "corex" / "ixsmi-lab.json").write_text(json.dumps({"gpus": [
        {"index": index, "name": "Iluvatar BI-V100", "uuid": f"GPU-{index}",
         "memory_total_mib": 32768, "memory_used_mib": 0, "utilization_gpu_pct": 0,
         "temperature_gpu_c": 34} for index in range(gpus)], "compute_processes": []}))
    model = root / "model"
    model.mkdir()
    config = dict(MODEL_CONFIG, architectures=[architecture or MODEL_CONFIG["architectures"][0]])
    (model / "config.json").write_text(json.dumps(config))
    return root


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Engine:
    """One stand-in process on 127.0.0.1."""

    def __init__(self, host, flags, env=None, load_seconds="0.1"):
        self.port = free_port()
        self.log = host / f"engine-{self.port}.log"
        environ = dict(os.environ, PYTHONPATH=str(LAB_DIR),
                       BIV100_STANDIN_VLLM_ROOT=str(host / "site-packages" / "vllm"),
                       BIV100_STANDIN_IXSMI=str(host / "corex" / "bin" / "ixsmi"),
                       BIV100_STANDIN_LOAD_SECONDS=load_seconds)
        environ.pop("CUDA_VISIBLE_DEVICES", None)
        # The allocator options a deploy gives the engine: without them, long prompts side by
        # side run out of memory (speed_model.py, "Fragmentation").
        environ["PYTORCH_CUDA_ALLOC_CONF"] = allocator_conf(DEFAULT_ALLOCATOR_OPTIONS)
        environ.update(env or {})
        command = [sys.executable, "-m", "engine_standin", str(host / "model"),
                   "--host", "127.0.0.1", "--port", str(self.port)] + flags
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, env=environ, stdout=log,
                                            stderr=subprocess.STDOUT)

    def output(self):
        return self.log.read_text()

    def wait_started(self):
        return self.wait_logged("Application startup complete.")

    def wait_logged(self, line):
        """Wait for the engine to log a line: the engine's own word that it got there, where a
        fixed sleep would guess how long a loaded machine takes to start Python."""
        deadline = time.monotonic() + START_TIMEOUT
        while line not in self.output():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)
        return self

    def wait_exit(self):
        return self.process.wait(timeout=START_TIMEOUT)

    def stop(self):
        if self.process.poll() is None:
            os.kill(self.process.pid, 15)
            self.process.wait(timeout=START_TIMEOUT)

    def request(self, method, path, body=None, raw=None, headers=None):
        """(status, parsed JSON or text) of one loopback request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def chat(self, **body):
        body.setdefault("model", SERVED)
        body.setdefault("messages", [{"role": "user", "content": "What is the weather?"}])
        return self.request("POST", "/v1/chat/completions", body)

    def stream(self, **body):
        """The data objects of a streamed chat answer, and whether it ended with [DONE]."""
        status, text = self.chat(stream=True, **body)
        assert status == 200, text
        events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
        return [json.loads(event) for event in events[:-1]], events[-1] == "[DONE]"


def metric(engine, name):
    """The value of one of the engine's gauges or counters, as /metrics gives it now."""
    text = engine.request("GET", "/metrics")[1]
    (line,) = [line for line in text.splitlines() if line.startswith(f"{name}{{")]
    return float(line.rsplit(" ", 1)[1])


def gauges_show(engine, running, waiting, seconds=10):
    """Whether the engine's gauges show `running` and `waiting` requests at once within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (metric(engine, "vllm:num_requests_running"), metric(engine, "vllm:num_requests_waiting")) == (
                running, waiting):
            return True
        time.sleep(0.01)
    return False
