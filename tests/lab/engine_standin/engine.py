"""Start-up of the simulated engine, in the order of vLLM 0.10.1.1's run_server.

setup_server parses and validates the arguments and binds the port; building the engine then
reads the model config (context length, architecture), starts the tensor-parallel workers (GPU
count) and allocates on the GPU (PYTORCH_CUDA_ALLOC_CONF); only then does uvicorn listen.
A failure after parsing is an uncaught exception in vLLM: its message and exit status 1.
"""

import logging
import os
import signal
import sys
import threading
import time

from . import chat, cli, engine_steps, evaluation_solver, memory_model, settings, speed_model, startup
from .server import UVICORN_PREFIX, EngineHTTPServer, EngineState

logger = logging.getLogger("vllm.entrypoints.openai.api_server")
BASE_VERSION = "0.10.1.1"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # EngineArgs.model's default
# How far the stand-in raises its scheduling priority (lowers its nice value) as it starts.
PRIORITY_BOOST = 5
BREAK_KINDS = ("n", "tools", "max_completion_tokens", "tool_content_none", "thinking_tools",
               "fragmentation", "json_object")


def configure_logging():
    """vLLM's line format: `INFO 11-29 18:00:00 [file.py:123] message`."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(
        "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


class StandinOptions:
    """The BIV100_STANDIN_* environment, read once."""

    def __init__(self, environ):
        self.load_seconds = float(environ.get("BIV100_STANDIN_LOAD_SECONDS", "2"))
        self.never_healthy = environ.get("BIV100_STANDIN_NEVER_HEALTHY") == "1"
        crash_after = environ.get("BIV100_STANDIN_CRASH_AFTER")
        self.crash_after = int(crash_after) if crash_after else None
        self.broken = environ.get(speed_model.BREAK_VARIABLE) or None
        if self.broken not in (None,) + BREAK_KINDS:
            raise startup.StartupError(
                f"BIV100_STANDIN_BREAK={self.broken} is none of {', '.join(BREAK_KINDS)}")
        try:
            speed_model.Rates.from_environ(environ)  # a bad rate stops the start here
            self.wrong_share = evaluation_solver.wrong_share_from(environ)
        except ValueError as error:
            raise startup.StartupError(str(error)) from None


def main(argv):
    configure_logging()
    try:
        args = cli.parse_args(argv)  # argparse exits with status 2 on its own errors
        settings.apply_resolved_defaults(args)
        return run(args, os.environ)
    except (cli.ServeArgsError, startup.StartupError, memory_model.StartFailure) as error:
        # vLLM ends with the exception's last traceback line on stderr.
        print(error, file=sys.stderr)
        return 1


def run(args, environ):
    _run_ahead()
    options = StandinOptions(environ)
    vllm_root = startup.installed_vllm_root(environ)
    version = installed_version(vllm_root)
    logger.info("vLLM API server version %s (biv100 lab simulated engine)", version)
    logger.info("non-default args: %s", {name: value for name, value in vars(args).items()
                                         if value not in (None, False)})
    server = EngineHTTPServer((args.host or "", args.port))
    state, memory = build_engine(args, environ, options, vllm_root, version)
    _exit_cleanly_on_sigterm(server)
    load(options, memory)
    allocate_cache(memory)
    listen_address = f"http://{args.host or '0.0.0.0'}:{args.port}"
    logger.info("Starting vLLM API server 0 on %s", listen_address)
    print(f"{UVICORN_PREFIX}Started server process [{os.getpid()}]", flush=True)
    print(f"{UVICORN_PREFIX}Waiting for application startup.", flush=True)
    print(f"{UVICORN_PREFIX}Application startup complete.", flush=True)
    server.serve(state)
    return 0


def _run_ahead():
    """Run before the machine's other work: the stand-in's figures are its simulated speeds only
    while it keeps their pace, and on the lab's two shared cores the real engine and the test
    runs beside it would otherwise hold it up, as a serving host's engine on its own GPUs is not.
    Every thread started after this inherits it. A user who may not raise a priority (no
    CAP_SYS_NICE) runs it as it is."""
    try:
        os.nice(-PRIORITY_BOOST)
    except OSError:
        pass


def build_engine(args, environ, options, vllm_root, version):
    """Every check building the real engine makes before it loads the weights, then the serving
    state and the memory the start will find (checked once the weights are loaded)."""
    model_path = args.model_tag or args.model or DEFAULT_MODEL
    model_config = startup.read_model_config(model_path)
    max_model_len = startup.resolve_max_model_len(args.max_model_len, model_config, environ)
    startup.check_architecture(model_config, vllm_root)
    startup.check_engine_limits(args, model_config, max_model_len)
    startup.check_tensor_parallel_size(args.tensor_parallel_size, environ)
    startup.check_allocator_config(environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    engine_settings = settings.EngineSettings.from_args(args, model_config, max_model_len, environ)
    memory = memory_model.MemoryPlan(memory_model.ModelShape.from_config(model_config),
                                     engine_settings)
    fixes = startup.serving_fixes(vllm_root)
    logger.info("serving layer in %s: %s", vllm_root, fixes)
    config = chat.ServingConfig(
        served_names=args.served_model_name or [model_path], max_model_len=max_model_len,
        max_num_seqs=args.max_num_seqs, enable_auto_tools=bool(args.enable_auto_tool_choice),
        tool_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
        fixes=fixes, broken=options.broken, wrong_share=options.wrong_share)
    rates = speed_model.Rates.from_environ(environ)
    steps = speed_model.engine_for(engine_settings, memory, rates, environ)
    logger.info("simulated speed: %s for a sequence alone; steps of %d tokens at most (%s), a "
                "decode step of n sequences (1 + %g (n - 1)) times one's, at most %d sequences "
                "and %d KV cache tokens at once; long prompts (over %d tokens) %s; evaluation "
                "answers wrong for a share of %g", rates, engine_settings.max_num_batched_tokens,
                "chunked prefill" if engine_settings.chunked_prefill else "whole prompts",
                engine_steps.BATCH_SLOWDOWN, args.max_num_seqs, memory.kv_tokens,
                memory_model.FRAGMENTATION_PROMPT_TOKENS,
                "run out of memory side by side (fragmented allocator)" if steps.fragments
                else "fit side by side", options.wrong_share)
    api_keys = [key for key in (args.api_key or [environ.get("VLLM_API_KEY")]) if key]
    state = EngineState(config, model_path, version, api_keys, options.crash_after, steps)
    return state, memory


def installed_version(vllm_root):
    """The version in the package's dist-info, as vllm.__version__ would report it."""
    for metadata in sorted(vllm_root.parent.glob("vllm-*.dist-info/METADATA")):
        for line in metadata.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return BASE_VERSION


def load(options, memory):
    """The time the real engine spends loading weights, with the port bound and not served."""
    logger.info("Loading model weights (simulated, %.1f s)", options.load_seconds)
    if options.never_healthy:
        logger.warning("BIV100_STANDIN_NEVER_HEALTHY=1: the engine never finishes loading")
        threading.Event().wait()
    time.sleep(options.load_seconds)
    logger.info("Model loading took %.2f GiB and %.6f seconds (simulated)",
                memory.weights / memory_model.GIB, options.load_seconds)


def allocate_cache(memory):
    """The memory profile and the KV cache, as the V0 worker and executor log them; a start the
    memory does not allow raises StartFailure."""
    logger.info("%s", memory.profile_line())
    memory.check()
    logger.info("# cuda blocks: %d, # CPU blocks: %d", memory.blocks, memory.cpu_blocks)
    logger.info("Maximum concurrency for %d tokens per request: %.2fx",
                memory.settings.max_model_len, memory.max_concurrency)


def _exit_cleanly_on_sigterm(server):
    def stop(signum, frame):
        print(f"{UVICORN_PREFIX}Shutting down", flush=True)
        server.server_close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
