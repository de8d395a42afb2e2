"""The HTTP side: vLLM 0.10.1.1's OpenAI routes on the standard library's threaded server.

Chat answers leave as the engine's steps make their tokens (engine_steps.py, speed_model.py), and
every response carries SIMULATED_HEADER, which no real vLLM sends: whoever measures this engine
can tell it is the stand-in (the bench marks its figures simulated when it sees the header).
"""

import contextlib
import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import chat, engine_steps, speed_model

logger = logging.getLogger("vllm.entrypoints.openai.api_server")

# uvicorn writes its own lines without the vLLM prefix.
UVICORN_PREFIX = "INFO:     "
SIMULATED_HEADER = ("x-biv100-simulated", "engine stand-in")


class EngineState:
    """What every request handler shares: the engine's settings, its steps and its counters."""

    def __init__(self, config, model_path, version, api_keys, crash_after, steps):
        self.config = config
        # The engine's steps on the machine's clock (engine_steps.py): when each token is made.
        self.engine = engine_steps.LiveEngine(steps)
        self.kv_cache_tokens = steps.kv_tokens
        self.model_path = model_path
        self.version = version
        self.api_keys = api_keys
        self.crash_after = crash_after  # chat requests answered before the engine dies, or None
        self.started = int(time.time())
        self.lock = threading.Lock()
        self.chat_requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = {}  # finish_reason -> count

    @contextlib.contextmanager
    def running(self, completion, arrived):
        """The answer's request in the engine from its arrival: yields its key, for
        LiveEngine.work. A long prompt that begins beside another on an allocator that
        fragments finds no block for its prefill: chat.ApiError, when it begins."""
        choice_tokens = [choice.completion_tokens for choice in completion.choices]
        key = self.engine.submit(speed_model.work_of(completion.prompt_tokens, choice_tokens,
                                                     self.config.max_num_seqs), arrived)
        try:
            failed = self.engine.work(key).failed
            if failed is not None:
                speed_model.wait_until(lambda: failed[0], self.engine.clock, self.engine.wait)
                logger.error("torch.OutOfMemoryError: %s (simulated: a long prompt's prefill beside "
                             "another on a fragmented cache, see PYTORCH_CUDA_ALLOC_CONF)", failed[1])
                raise chat.ApiError(500, failed[1], "InternalServerError")
            yield key
            self.record(completion)
        finally:
            self.engine.done(key)

    def record(self, completion):
        with self.lock:
            self.prompt_tokens += completion.prompt_tokens
            for choice in completion.choices:
                self.generation_tokens += choice.completion_tokens
                self.finished[choice.finish_reason] = (
                    self.finished.get(choice.finish_reason, 0) + 1)


def model_list(state):
    """ModelList of 0.10.1.1's show_available_models."""
    cards = [{"id": name, "object": "model", "created": state.started, "owned_by": "vllm",
              "root": state.model_path, "parent": None,
              "max_model_len": state.config.max_model_len,
              "permission": [_permission(state.started)]}
             for name in state.config.served_names]
    return {"object": "list", "data": cards}


def _permission(created):
    return {"id": f"modelperm-{os.urandom(16).hex()}", "object": "model_permission",
            "created": created, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None,
            "is_blocking": False}


def metrics_text(state):
    """A few of vLLM's V0 Prometheus series, labelled by the first served name."""
    label = f'model_name="{state.config.served_names[0]}"'
    running, waiting, held = state.engine.gauges()
    usage = float(held / state.kv_cache_tokens) if state.kv_cache_tokens else 0.0
    with state.lock:
        lines = [
            "# HELP vllm:num_requests_running Number of requests currently running on GPU.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} {float(waiting)}",
            "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            f"vllm:gpu_cache_usage_perc{{{label}}} {usage}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{label}}} {float(state.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {float(state.generation_tokens)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        lines += [f'vllm:request_success_total{{finished_reason="{reason}",{label}}} '
                  f"{float(count)}" for reason, count in sorted(state.finished.items())]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def version_string(self):
        return "uvicorn"

    def send_response(self, code, message=None):
        super().send_response(code, message)
        self.send_header(*SIMULATED_HEADER)

    @property
    def state(self):
        return self.server.engine_state

    def do_GET(self):
        routes = {"/health": self._empty_ok, "/ping": self._empty_ok,
                  "/version": lambda: self._json(200, {"version": self.state.version}),
                  "/metrics": self._metrics,
                  "/v1/models": lambda: self._json(200, model_list(self.state))}
        self._dispatch(routes)

    def do_POST(self):
        self._dispatch({"/ping": self._empty_ok, "/v1/chat/completions": self._chat,
                        "/v1/completions": self._completions,
                        "/tokenize": lambda: self._answer_json(chat.tokenize),
                        "/detokenize": lambda: self._answer_json(chat.detokenize)})

    def _dispatch(self, routes):
        path = self.path.split("?", 1)[0]
        if path.startswith("/v1") and not self._authorized():
            self._read_body()
            self._json(401, {"error": "Unauthorized"})
        elif path in routes:
            routes[path]()
        else:
            self._read_body()
            self._json(404, {"detail": "Not Found"})

    def _authorized(self):
        """AuthenticationMiddleware: /v1 routes need one of the keys as a bearer token."""
        keys = self.state.api_keys
        return not keys or self.headers.get("Authorization") in [f"Bearer {key}"
                                                                 for key in keys]

    def _empty_ok(self):
        self._read_body()
        self._send(200, b"", None)  # FastAPI's bare Response has no Content-Type

    def _metrics(self):
        self._send(200, metrics_text(self.state).encode(), "text/plain; version=0.0.4")

    def _chat(self):
        arrived = time.monotonic()
        try:
            body = json.loads(self._read_body() or b"null")
        except ValueError as error:
            self._json(400, chat.json_decode_error(error).body())
            return
        self._answer_chat(body, arrived)
        self._count_chat_request()

    def _read_json(self):
        """(True, the request's JSON), or (False, None) once a body that is not JSON has had
        its 400."""
        try:
            return True, json.loads(self._read_body() or b"null")
        except ValueError as error:
            self._json(400, chat.json_decode_error(error).body())
            return False, None

    def _answer_json(self, handle):
        """/tokenize and /detokenize: a JSON answer computed at once."""
        readable, body = self._read_json()
        if not readable:
            return
        try:
            self._json(200, handle(body, self.state.config))
        except chat.ApiError as error:
            self._json(error.status, error.body())

    def _completions(self):
        """/v1/completions; the route turns an unexpected error into a JSON 500."""
        arrived = time.monotonic()
        readable, body = self._read_json()
        if not readable:
            return
        try:
            completion = chat.complete_text(body, self.state.config)
        except chat.ApiError as error:
            self._json(error.status, error.body())
            return
        except Exception as error:
            logger.exception("Exception in /v1/completions")
            self._json(500, {"error": {"message": str(error), "type": "Internal Server Error",
                                       "param": None, "code": 500}})
            return
        self._answer_on_schedule(completion, body, arrived, chat.text_stream_chunks,
                                 chat.text_response_body)

    def _answer_chat(self, body, arrived):
        try:
            completion = chat.complete(body, self.state.config)
        except chat.ApiError as error:
            self._json(error.status, error.body())
            return
        except Exception:
            # What uvicorn does with an unhandled exception: log it, answer a bare 500.
            logger.exception("Exception in ASGI application")
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        self._answer_on_schedule(completion, body, arrived, chat.stream_chunks,
                                 chat.response_body)

    def _answer_on_schedule(self, completion, body, arrived, stream_chunks, response_body):
        """Send a computed answer as the engine's steps make its tokens (engine_steps.py)."""
        if body.get("stream"):
            # The headers go at once, as Starlette's StreamingResponse sends them; the chunks
            # wait for their tokens, and an engine error is the stream's last event.
            self._start_stream()
            try:
                with self.state.running(completion, arrived) as key:
                    self._paced_stream(completion, body, key, stream_chunks)
            except chat.ApiError as error:
                # The stream generator's create_streaming_error_response, with its defaults.
                failed = chat.ApiError(400, error.message, "BadRequestError")
                self._write_chunk(f"data: {json.dumps(failed.body())}\n\n".encode())
            self._end_stream()
            return
        try:
            with self.state.running(completion, arrived) as key:
                last_token = max(choice.completion_tokens for choice in completion.choices)
                speed_model.wait_until(lambda: self._due(key, last_token), self.state.engine.clock,
                                       self.state.engine.wait)
        except chat.ApiError as error:
            self._json(error.status, error.body())
            return
        self._json(200, response_body(completion, body))

    def _due(self, key, token):
        return self.state.engine.work(key).token_time(token)

    def _paced_stream(self, completion, body, key, stream_chunks):
        schedule = speed_model.stream_schedule(
            list(stream_chunks(completion, body)),
            [choice.completion_tokens for choice in completion.choices])
        continuous = speed_model.continuous_usage(body)
        engine = self.state.engine
        for batch in speed_model.paced(schedule, lambda token: self._due(key, token),
                                       clock=engine.clock, sleep=engine.wait):
            events = []
            for out, chunk in speed_model.merged(batch):
                if continuous and out is not None:
                    chunk = speed_model.with_usage(chunk, completion.prompt_tokens, out)
                events.append(f"data: {json.dumps(chunk)}\n\n".encode())
            self._write_chunk(b"".join(events))

    def _count_chat_request(self):
        """BIV100_STANDIN_CRASH_AFTER: the engine dies once it has answered that many."""
        with self.state.lock:
            self.state.chat_requests += 1
            crash = (self.state.crash_after is not None
                     and self.state.chat_requests >= self.state.crash_after)
        if crash:
            logger.error("Engine process (simulated) died after %d chat requests "
                         "(BIV100_STANDIN_CRASH_AFTER)", self.state.chat_requests)
            logging.shutdown()
            sys.stdout.flush()
            os._exit(1)

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, status, payload):
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status, data, content_type):
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # Server-sent events in HTTP/1.1 chunked encoding, ending with [DONE].
    def _start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _end_stream(self):
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, format, *args):
        # uvicorn's access log line: client - "request line" status phrase
        if len(args) == 3 and str(args[1]).isdigit():
            status = int(args[1])
            phrase = self.responses.get(status, ("",))[0]
            sys.stdout.write(f'{UVICORN_PREFIX}{self.client_address[0]}:'
                             f'{self.client_address[1]} - "{args[0]}" {status} {phrase}\n')
            sys.stdout.flush()


class EngineHTTPServer(ThreadingHTTPServer):
    """Binds at construction, listens only when `serve` is called, as vLLM's API server."""

    daemon_threads = True
    allow_reuse_address = True
    # uvicorn's backlog. socketserver's default of 5 let a burst of clients (a bench's max_num_seqs
    # connecting at once) overflow the accept queue: the kernel drops the SYNs past it, and those
    # clients wait for TCP's one-second retransmission, a stall the real engine does not have.
    request_queue_size = 2048

    def __init__(self, address):
        super().__init__(address, Handler, bind_and_activate=False)
        self.engine_state = None
        self.server_bind()

    def serve(self, engine_state):
        self.engine_state = engine_state
        self.server_activate()
        self.serve_forever()
