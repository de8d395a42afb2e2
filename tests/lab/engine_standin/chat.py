"""/v1/chat/completions of vLLM 0.10.1.1, answered by the simulated model.

A request goes the way it goes in vLLM: the protocol's validators (400 "Bad Request"), the
served-model check (404), the serving layer's checks (400 "BadRequestError"), the context
length, then generation. Generation writes the raw text a Qwen3 model would write
(`<think>...</think>` when thinking, `<tool_call>` blocks for tool calls), cuts it at the
token budget and at stop strings, and then reads it back with the logic of the qwen3 reasoning
parser and the qwen3_coder tool parser, so truncation has the consequences it has on the real
engine (thinking that uses up the budget leaves no tool call).
"""

import hashlib
import json
import re
import time
import uuid

from . import evaluation_solver, sampling
from . import simulated_model as model

FUNCTION_BLOCK = re.compile(r"<function=([^>\n]+)>\n(.*?)</function>", re.S)
PARAMETER_BLOCK = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>", re.S)
INTEGER_FIELDS = ("n", "max_tokens", "max_completion_tokens", "top_logprobs", "seed",
                  "min_tokens")
MESSAGE_OVERHEAD_TOKENS = 5  # <|im_start|>role\n ... <|im_end|>\n of the Qwen chat template
GENERATION_PROMPT_TOKENS = 3  # <|im_start|>assistant\n


class ApiError(Exception):
    """An error answer in 0.10.1.1's ErrorResponse shape."""

    def __init__(self, status, message, error_type):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type

    def body(self):
        return {"error": {"message": self.message, "type": self.error_type, "param": None,
                          "code": self.status}}


def bad_request(message):
    """An error the serving layer returns with create_error_response."""
    return ApiError(400, message, "BadRequestError")


def preprocessing_error(message):
    """A ValueError of the chat route's preprocessing (the context length checks): 0.10.1.1
    answers f"{e} {e.__cause__}", so the message ends in " None"."""
    return bad_request(f"{message} None")


# pydantic's error type for each message the stand-in's validators give.
PYDANTIC_TYPES = (
    ("Field required", "missing"),
    ("Extra inputs are not permitted", "extra_forbidden"),
    ("Input should be a valid number, unable to parse string as a number", "float_parsing"),
    ("Input should be a valid number", "float_type"),
    ("Input should be a valid integer, unable to parse string as an integer", "int_parsing"),
    ("Input should be a valid integer, got a number with a fractional part", "int_from_float"),
    ("Input should be a valid integer", "int_type"),
    ("Input should be a valid list", "list_type"),
    ("Input should be a valid string", "string_type"),
    ("Input should be a valid dictionary", "dict_type"),
)


def validation_error(body, message, field=None):
    """A request that pydantic refuses, as vLLM 0.10.1.1's handler reports FastAPI's
    RequestValidationError: str() of its error list. `message` is pydantic's msg for `field`,
    or for the whole body; the stand-in reports the first error only."""
    error_type = next((kind for prefix, kind in PYDANTIC_TYPES if message.startswith(prefix)),
                      "value_error")
    if field is None or error_type == "missing":
        value = body  # what pydantic had when it found the field missing, or the model invalid
    else:
        value = body.get(field) if isinstance(body, dict) else None
    error = {"type": error_type, "loc": ("body",) if field is None else ("body", field),
             "msg": message, "input": value}
    return ApiError(400, str([error]), "Bad Request")


def invalid_request(body, message):
    """A ValueError of a request model's validator, as FastAPI's handler reports it."""
    error = {"type": "value_error", "loc": ("body",), "msg": f"Value error, {message}",
             "input": body, "ctx": {"error": ValueError(message)}}
    return ApiError(400, str([error]), "Bad Request")


def json_decode_error(error):
    """A body that is not JSON: FastAPI's json_invalid error at the character it stopped at."""
    # A body that is not UTF-8 has no position: FastAPI reports it at the start.
    error = {"type": "json_invalid", "loc": ("body", getattr(error, "pos", 0)),
             "msg": "JSON decode error", "input": {}, "ctx": {"error": getattr(error, "msg", str(error))}}
    return ApiError(400, str([error]), "Bad Request")


class ServingConfig:
    """What the chat endpoint needs to know about the running engine."""

    def __init__(self, served_names, max_model_len, max_num_seqs, enable_auto_tools,
                 tool_parser, reasoning_parser, fixes, broken, wrong_share=0.0):
        self.served_names = served_names
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.enable_auto_tools = enable_auto_tools
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.fixes = fixes
        self.broken = broken  # the one BIV100_STANDIN_BREAK kind, or None
        self.wrong_share = wrong_share  # BIV100_STANDIN_WRONG_SHARE (evaluation_solver)


# ---- the request, as the protocol's validators leave it ---------------------------------

def validate_request(body, config):
    if not isinstance(body, dict):
        raise validation_error(body, "Input should be a valid dictionary")
    if "messages" not in body:
        raise validation_error(body, "Field required", "messages")
    if not isinstance(body["messages"], list):
        raise validation_error(body, "Input should be a valid list", "messages")
    if not all(isinstance(message, dict) and "role" in message
               for message in body["messages"]):
        raise validation_error(body, "Input should be a message with a role", "messages")
    _check_integer_fields(body)
    _check_number_fields(body)
    if config.broken == "max_completion_tokens" and "max_completion_tokens" in body:
        raise validation_error(body, "Extra inputs are not permitted", "max_completion_tokens")
    if body.get("stream_options") and not body.get("stream"):
        raise invalid_request(body, "Stream options can only be defined when `stream=True`.")
    _check_top_logprobs(body)
    if config.fixes["thinking_off_for_tools"]:
        _disable_thinking_for_tool_calls(body)
    _check_tool_usage(body)
    return body


def _check_integer_fields(body):
    for name in INTEGER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise validation_error(body, "Input should be a valid integer", name)


# Float fields of the request; top_k is an integer one.
NUMBER_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


def _check_number_fields(body):
    """Pydantic's lax parsing: a number, a boolean or a numeric string passes."""
    for name in NUMBER_FIELDS + ("top_k",):
        value = body.get(name)
        kind, parse = ("integer", int) if name == "top_k" else ("number", float)
        if value is None or isinstance(value, int):  # a boolean is an int
            continue
        if isinstance(value, float):
            if parse is int and not value.is_integer():
                raise validation_error(body, "Input should be a valid integer, got a number "
                                       "with a fractional part", name)
            continue
        if not isinstance(value, str):
            raise validation_error(body, f"Input should be a valid {kind}", name)
        try:
            parse(value)
        except ValueError:
            article = "an" if parse is int else "a"
            raise validation_error(body, f"Input should be a valid {kind}, unable to parse "
                                   f"string as {article} {kind}", name) from None


def _sampling_value(body, name):
    value = body.get(name)
    return None if value is None else float(value)


def _check_sampling_ranges(body):
    """SamplingParams._verify_args on the values a request gives, in its order (the model's
    defaults pass); its ValueError is serving_chat's 400."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = _sampling_value(body, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise bad_request(f"{name} must be in [-2, 2], got {value}.")
    value = _sampling_value(body, "repetition_penalty")
    if value is not None and value <= 0.0:
        raise bad_request(f"repetition_penalty must be greater than zero, got {value}.")
    value = _sampling_value(body, "temperature")
    if value is not None and value < 0.0:
        raise bad_request(f"temperature must be non-negative, got {value}.")
    value = _sampling_value(body, "top_p")
    if value is not None and not 0.0 < value <= 1.0:
        raise bad_request(f"top_p must be in (0, 1], got {value}.")
    if body.get("top_k") is not None and int(body["top_k"]) < -1:
        raise bad_request(f"top_k must be 0 (disable), or at least 1, got {int(body['top_k'])}.")
    value = _sampling_value(body, "min_p")
    if value is not None and not 0.0 <= value <= 1.0:
        raise bad_request(f"min_p must be in [0, 1], got {value}.")


def _check_top_logprobs(body):
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is None:
        return
    if top_logprobs < 0:
        raise invalid_request(body, "`top_logprobs` must be a positive value.")
    if top_logprobs > 0 and not body.get("logprobs"):
        raise invalid_request(body, "when using `top_logprobs`, `logprobs` must be set to true.")


def _disable_thinking_for_tool_calls(body):
    """The team's protocol.py validator: tool requests render with thinking off."""
    template_kwargs = body.get("chat_template_kwargs") or {}
    if (not body.get("tools") or not isinstance(template_kwargs, dict)
            or "enable_thinking" in template_kwargs):
        return
    body["chat_template_kwargs"] = dict(template_kwargs, enable_thinking=False)


def _check_tool_usage(body):
    if "tool_choice" not in body and body.get("tools"):
        body["tool_choice"] = "auto"
    choice = body.get("tool_choice")
    if choice is None or choice == "none":
        return
    if body.get("tools") is None:
        raise invalid_request(body, "When using `tool_choice`, `tools` must be set.")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise invalid_request(body, f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                              '"none", "auto" or "required" are supported.')
    if choice == "required" and body["tools"] == []:
        body["tool_choice"] = "none"
        del body["tools"]
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in [tool["function"]["name"] for tool in body["tools"]]:
            raise invalid_request(body, "The tool specified in `tool_choice` does not match any "
                                  "of the specified `tools`")


# ---- the serving layer's checks ---------------------------------------------------------

def check_serving(body, config):
    model_name = body.get("model")
    if model_name and model_name not in config.served_names:
        raise ApiError(404, f"The model `{model_name}` does not exist.", "NotFoundError")
    if config.broken == "tool_content_none" and _has_assistant_tool_calls_without_content(body):
        raise ApiError(500, "'NoneType' object is not iterable", "Internal Server Error")
    n = body.get("n") or 1
    if config.fixes["n_within_max_num_seqs"] and n > config.max_num_seqs:
        raise bad_request(f"n={n} exceeds this server's max_num_seqs ({config.max_num_seqs}): "
                          f"ask for at most {config.max_num_seqs} choices")
    if body.get("tool_choice") == "auto" and not (config.enable_auto_tools and
                                                  config.tool_parser):
        raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and '
                          "--tool-call-parser to be set")


def _has_assistant_tool_calls_without_content(body):
    return any(message.get("role") == "assistant" and message.get("content") is None
               and message.get("tool_calls") for message in body["messages"])


def prompt_token_count(body):
    """Tokens of the messages as the Qwen chat template lays them out, tools included."""
    total = GENERATION_PROMPT_TOKENS
    for message in body["messages"]:
        total += MESSAGE_OVERHEAD_TOKENS + model.count_tokens(_message_text(message))
        if message.get("tool_calls"):
            total += model.count_tokens(json.dumps(message["tool_calls"]))
    if body.get("tools"):
        total += model.count_tokens(json.dumps(body["tools"]))
    return total


def _message_text(message):
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    return json.dumps(content)  # a list of content parts


def token_budget(body, prompt_tokens, config):
    """get_max_tokens of 0.10.1.1, after its context-length and SamplingParams checks."""
    requested = body.get("max_completion_tokens") or body.get("max_tokens")
    if prompt_tokens >= config.max_model_len:
        raise preprocessing_error(
            f"This model's maximum context length is {config.max_model_len} tokens. However, "
            f"your request has {prompt_tokens} input tokens. Please reduce the length of the "
            "input messages.")
    if requested is not None and prompt_tokens + requested > config.max_model_len:
        raise preprocessing_error(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {config.max_model_len} tokens and your request has "
            f"{prompt_tokens} input tokens ({requested} > {config.max_model_len} - "
            f"{prompt_tokens}).")
    n = body.get("n") if body.get("n") is not None else 1
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.")
    _check_sampling_ranges(body)
    if requested is not None and requested < 1:
        raise bad_request(f"max_tokens must be at least 1, got {requested}.")
    default = config.max_model_len - prompt_tokens
    budget = default if requested is None else min(default, requested)
    min_tokens = sampling.min_tokens(body)
    if min_tokens < 0:
        raise bad_request(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > budget:
        raise bad_request(f"min_tokens must be less than or equal to max_tokens={budget}, "
                          f"got {min_tokens}.")
    return budget


# ---- generation -------------------------------------------------------------------------

def thinking_enabled(body):
    """Qwen3's chat template thinks unless enable_thinking is false."""
    template_kwargs = body.get("chat_template_kwargs") or {}
    return template_kwargs.get("enable_thinking", True) is not False


def calls_a_tool(body):
    return bool(body.get("tools")) and body.get("tool_choice") not in (None, "none")


def raw_output(body, stream, budget, config):
    """What the model writes, before the budget and stop strings cut it."""
    if calls_a_tool(body):
        answer = _tool_call_text(body, stream)
    else:  # an evaluation-set question gets its computed answer
        answer = (evaluation_solver.answer(body, config.wrong_share)
                  or _answer_text(body, stream, config))
    if not thinking_enabled(body):
        return answer
    if config.broken == "thinking_tools" and calls_a_tool(body):
        reasoning = stream.words(budget + 1)  # thinks past the whole budget
    else:
        reasoning = stream.sentence(model.REASONING_TOKENS)
    separator = "" if calls_a_tool(body) else "\n\n"
    return f"{model.THINK_START}\n{reasoning}\n{model.THINK_END}{separator}{answer}"


def _answer_text(body, stream, config):
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_object" and config.broken == "json_object":
        # Guided decoding not applied: braces around prose, which is not JSON.
        return "{" + stream.sentence(model.ANSWER_TOKENS) + "}"
    if response_format.get("type") == "json_object":
        return json.dumps({"answer": stream.sentence(model.ANSWER_TOKENS)})
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return json.dumps(model.value_for_schema(schema, stream))
    return stream.sentence(model.ANSWER_TOKENS)


def _tool_call_text(body, stream):
    """Named and required choices are guided JSON in vLLM; auto is the model's own format."""
    tools = {tool["function"]["name"]: tool["function"] for tool in body["tools"]}
    choice = body["tool_choice"]
    if isinstance(choice, dict):
        function = tools[choice["function"]["name"]]
        return json.dumps(model.value_for_schema(function.get("parameters"), stream))
    names = sorted(tools)
    function = tools[names[stream.draw(len(names))]]
    arguments = model.value_for_schema(function.get("parameters"), stream)
    if choice == "required":
        return json.dumps([{"name": function["name"], "parameters": arguments}])
    return model.qwen3_coder_call_text(function["name"], arguments)


def cut_output(text, budget, stop, min_tokens=0):
    """(text, completion tokens, finish_reason, stop_reason) after stop strings and budget.

    vLLM checks stop strings in the newest token's text, and only from the min_tokens-th token
    on: a stop string ending in an earlier token is never seen.
    """
    tokens = model.split_tokens(text)
    finish_reason, stop_reason = "stop", None
    if len(tokens) > budget:
        tokens, finish_reason = tokens[:budget], "length"
    text = "".join(tokens)
    unchecked = len("".join(tokens[:max(min_tokens - 1, 0)]))
    found = [(position, stop_string)
             for stop_string in ([stop] if isinstance(stop, str) else stop or []) if stop_string
             for position in [text.find(stop_string, max(unchecked - len(stop_string) + 1, 0))]
             if position >= 0]
    if found:
        position, stop_reason = min(found)  # the first stop string the model would reach
        text, finish_reason = text[:position], "stop"
    return text, len(model.split_tokens(text)), finish_reason, stop_reason


class Choice:
    """One choice as vLLM's serving_chat builds its ChatMessage."""

    def __init__(self, index, text, completion_tokens, finish_reason, stop_reason):
        self.index = index
        self.completion_tokens = completion_tokens
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.reasoning_content = None
        self.content = text
        self.tool_calls = []

    def message(self):
        return {"role": "assistant", "content": self.content, "refusal": None,
                "annotations": None, "audio": None, "function_call": None,
                "tool_calls": self.tool_calls, "reasoning_content": self.reasoning_content}


def read_back(choice, body, config):
    """Apply the reasoning parser and the tool-call handling of serving_chat."""
    if config.reasoning_parser:
        choice.reasoning_content, choice.content = _extract_reasoning(choice.content)
    if config.broken == "tools" and calls_a_tool(body):
        return  # the tool call stays in the content as text
    choice_kind = body.get("tool_choice")
    if isinstance(choice_kind, dict):
        choice.tool_calls = [_tool_call(choice_kind["function"]["name"], choice.content or "")]
        choice.content = ""
    elif choice_kind == "required":
        calls = json.loads(choice.content or "[]")
        choice.tool_calls = [_tool_call(call["name"], json.dumps(call["parameters"]))
                             for call in calls]
        choice.content = ""
    elif choice_kind == "auto" and body.get("tools"):
        _extract_qwen3_coder_calls(choice)


def _extract_reasoning(text):
    """Qwen3ReasoningParser.extract_reasoning_content: both tags, or nothing is reasoning."""
    if model.THINK_START not in text or model.THINK_END not in text:
        return None, text
    reasoning, _end, content = text.partition(model.THINK_START)[2].partition(model.THINK_END)
    return reasoning, content or None


def _extract_qwen3_coder_calls(choice):
    text = choice.content or ""
    calls = FUNCTION_BLOCK.findall(text)
    if not calls:
        return
    choice.tool_calls = [_tool_call(name, json.dumps(_parameters(block)))
                         for name, block in calls]
    content = text[:text.find("<tool_call>")]
    choice.content = content or None
    choice.finish_reason = "tool_calls"


def _parameters(block):
    arguments = {}
    for key, raw in PARAMETER_BLOCK.findall(block):
        try:
            arguments[key] = json.loads(raw)
        except ValueError:
            arguments[key] = raw
    return arguments


def _tool_call(name, arguments):
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def logprobs_of(text, top_logprobs):
    """ChatCompletionLogProbs for the content tokens; values are fixed stand-ins."""
    entries = []
    for position, token in enumerate(model.split_tokens(text)):
        alternatives = [{"token": token, "logprob": -0.01 * (rank + 1),
                         "bytes": list(token.encode())}
                        for rank in range(top_logprobs)] if top_logprobs else []
        entries.append({"token": token, "logprob": -0.01 - position % 3 * 0.001,
                        "bytes": list(token.encode()), "top_logprobs": alternatives})
    return {"content": entries}


class Completion:
    """The outcome of one chat request, rendered whole or as a stream."""

    def __init__(self, model_name, prompt_tokens, choices):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model_name = model_name
        self.prompt_tokens = prompt_tokens
        self.choices = choices

    def usage(self):
        completion = sum(choice.completion_tokens for choice in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "total_tokens":
                self.prompt_tokens + completion, "completion_tokens": completion,
                "prompt_tokens_details": None}


def complete(body, config):
    """Run one chat request to its Completion, or raise ApiError."""
    body = validate_request(body, config)
    check_serving(body, config)
    prompt_tokens = prompt_token_count(body)
    budget = token_budget(body, prompt_tokens, config)
    n = body.get("n") or 1
    if config.broken == "n" and n > 1:
        n -= 1
    key = model.request_key(body)
    choices = [_generate_choice(index, body, key, budget, config) for index in range(n)]
    return Completion(body.get("model") or config.served_names[0], prompt_tokens, choices)


def _generate_choice(index, body, key, budget, config):
    stream = model.TokenStream(key, index)
    text = sampling.lengthen(raw_output(body, stream, budget, config), body, budget, stream)
    choice = Choice(index, *cut_output(text, budget, body.get("stop"),
                                       sampling.min_tokens(body)))
    read_back(choice, body, config)
    return choice


def response_body(completion, body):
    choices = []
    for choice in completion.choices:
        logprobs = (logprobs_of(choice.content, body.get("top_logprobs") or 0)
                    if body.get("logprobs") else None)
        choices.append({"index": choice.index, "message": choice.message(),
                        "logprobs": logprobs, "finish_reason": choice.finish_reason,
                        "stop_reason": choice.stop_reason})
    return {"id": completion.id, "object": "chat.completion", "created": completion.created,
            "model": completion.model_name, "choices": choices, "service_tier": None,
            "system_fingerprint": None, "usage": completion.usage(), "prompt_logprobs": None,
            "kv_transfer_params": None}


def stream_chunks(completion, body):
    """The chat.completion.chunk objects of a streamed answer, in vLLM's order."""
    for choice in completion.choices:
        yield _chunk(completion, choice.index, {"role": "assistant", "content": ""})
    for choice in completion.choices:
        deltas = list(_content_deltas(choice)) or [{}]
        for delta in deltas[:-1]:
            yield _chunk(completion, choice.index, delta)
        # The last token's delta comes with the finish reason, as the engine's last output does.
        yield _chunk(completion, choice.index, deltas[-1], choice.finish_reason, choice.stop_reason)
    # StreamOptions.include_usage defaults to true once stream_options is given; vLLM dumps the
    # usage chunk without its None fields.
    stream_options = body.get("stream_options")
    if isinstance(stream_options, dict) and stream_options.get("include_usage", True):
        usage = {name: value for name, value in completion.usage().items() if value is not None}
        yield dict(_chunk(completion, 0, {}), choices=[], usage=usage)


def _content_deltas(choice):
    for token in model.split_tokens(choice.reasoning_content):
        yield {"reasoning_content": token}
    for token in model.split_tokens(choice.content):
        yield {"content": token}
    for position, call in enumerate(choice.tool_calls):
        yield {"tool_calls": [{"index": position, "id": call["id"], "type": "function",
                               "function": {"name": call["function"]["name"],
                                            "arguments": ""}}]}
        yield {"tool_calls": [{"index": position,
                               "function": {"arguments": call["function"]["arguments"]}}]}


def _chunk(completion, index, delta, finish_reason=None, stop_reason=None):
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        # vLLM dumps chunks without unset fields: stop_reason is set on the finish chunk only.
        choice["stop_reason"] = stop_reason
    return {"id": completion.id, "object": "chat.completion.chunk",
            "created": completion.created, "model": completion.model_name, "choices": [choice]}


# ---- /v1/completions, /tokenize and /detokenize -------------------------------------------
#
# The same simulated model behind vLLM's other generation and tokenizer routes. Token ids come
# from a simulated tokenizer: each token (simulated_model's rule) gets a stable id below the
# Qwen vocabulary's size, and the chat template's markers get Qwen's own ids.

VOCAB_SIZE = 151643  # the Qwen tokenizer's ordinary tokens; its special ones follow
IM_START, IM_END, NEWLINE = 151644, 151645, 198
SPECIAL_TOKENS = {151643: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
TOKEN_TEXTS = {NEWLINE: "\n"}  # id -> text of every token tokenized here, for /detokenize
COMPLETION_INTEGER_FIELDS = ("n", "max_tokens", "logprobs", "seed", "min_tokens")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens


def token_ids(text):
    ids = []
    for token in model.split_tokens(text):
        token_id = int(hashlib.sha256(token.encode()).hexdigest()[:12], 16) % VOCAB_SIZE
        TOKEN_TEXTS.setdefault(token_id, token)
        ids.append(token_id)
    return ids


def token_text(token_id):
    """What the tokenizer decodes an id to; an id it never saw is some word of the vocabulary,
    and one past the vocabulary is nothing, as Hugging Face's decode skips it."""
    if token_id in SPECIAL_TOKENS:
        return SPECIAL_TOKENS[token_id]
    if token_id in TOKEN_TEXTS:
        return TOKEN_TEXTS[token_id]
    return " " + model.VOCABULARY[token_id % len(model.VOCABULARY)] if token_id < VOCAB_SIZE else ""


def chat_token_ids(body):
    """The messages as prompt_token_count lays them out: <|im_start|>, the role, a newline, the
    text, <|im_end|> and a newline per message, the tools, then the generation prompt."""
    ids = []
    for message in body["messages"]:
        ids += [IM_START] + token_ids(str(message["role"]))[:1] + [NEWLINE]
        ids += token_ids(_message_text(message)) + [IM_END, NEWLINE]
        if message.get("tool_calls"):
            ids += token_ids(json.dumps(message["tool_calls"]))
    if body.get("tools"):
        ids += token_ids(json.dumps(body["tools"]))
    if body.get("add_generation_prompt", True):
        ids += [IM_START] + token_ids("assistant") + [NEWLINE]
    return ids


def _check_model(body, config):
    """OpenAIServing._check_model: a named model must be a served one."""
    model_name = body.get("model")
    if model_name and model_name not in config.served_names:
        raise ApiError(404, f"The model `{model_name}` does not exist.", "NotFoundError")


def tokenize(body, config):
    """/tokenize: a prompt, or messages laid out by the chat template (TokenizeRequest)."""
    if not isinstance(body, dict) or ("prompt" not in body and "messages" not in body):
        raise validation_error(body, "Field required", "prompt")
    if "messages" in body:
        if not isinstance(body["messages"], list) or not all(
                isinstance(message, dict) and "role" in message for message in body["messages"]):
            raise validation_error(body, "Input should be a valid list of messages with a role",
                                   "messages")
        if body.get("continue_final_message") and body.get("add_generation_prompt"):
            raise invalid_request(body, "Cannot set both `continue_final_message` and "
                                  "`add_generation_prompt` to True.")
    elif not isinstance(body["prompt"], str):
        raise validation_error(body, "Input should be a valid string", "prompt")
    _check_model(body, config)
    ids = chat_token_ids(body) if "messages" in body else token_ids(body["prompt"])
    return {"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids,
            "token_strs": ([token_text(token_id) for token_id in ids]
                           if body.get("return_token_strs") else None)}


def detokenize(body, config):
    """/detokenize: the text of token ids (DetokenizeRequest)."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(
            isinstance(token, int) and not isinstance(token, bool) for token in tokens):
        raise validation_error(body, "Input should be a valid list of integers", "tokens")
    _check_model(body, config)
    if any(token < 0 for token in tokens):
        # The tokenizer's OverflowError, which the route turns into a validation error.
        raise ApiError(400, "['out of range integral type conversion attempted']",
                       "Bad Request")
    return {"prompt": "".join(token_text(token) for token in tokens)}


def _prompts(body):
    """CompletionRequest.prompt: a text, a list of texts, token ids or lists of token ids."""
    def ids(value):
        return isinstance(value, list) and all(
            isinstance(item, int) and not isinstance(item, bool) for item in value)

    prompt = body.get("prompt")
    if isinstance(prompt, str) or ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(item, str) or ids(item)
                                                   for item in prompt):
        return prompt
    raise validation_error(body, "Input should be a valid string or list of strings or token "
                           "ids", "prompt")


def complete_text(body, config):
    """Run one /v1/completions request to its Completion, or raise ApiError: the protocol's
    validators, the served-model check, suffix, the context length, SamplingParams, then one
    choice per prompt and n."""
    if not isinstance(body, dict):
        raise validation_error(body, "Input should be a valid dictionary")
    for name in COMPLETION_INTEGER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise validation_error(body, "Input should be a valid integer", name)
    _check_number_fields(body)
    if body.get("logprobs") is not None and body["logprobs"] < 0:
        raise invalid_request(body, "`logprobs` must be a positive value.")
    if body.get("stream_options") and not body.get("stream"):
        raise invalid_request(body, "Stream options can only be defined when `stream=True`.")
    if body.get("prompt") is None and body.get("prompt_embeds") is None:
        raise invalid_request(body, "At least one of `prompt` or `prompt_embeds` must be set.")
    prompts = _prompts(body)
    _check_model(body, config)
    if body.get("suffix") is not None:
        raise bad_request("suffix is not currently supported")
    requested = body.get("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
    n = body.get("n", 1)
    if n is None:
        raise validation_error(body, "Input should be a valid integer", "n")
    lengths = [len(prompt) if isinstance(prompt, list) else len(token_ids(prompt))
               for prompt in prompts]
    for tokens in lengths:  # every prompt is checked before any is sampled
        if tokens >= config.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {config.max_model_len} tokens. "
                f"However, your request has {tokens} input tokens. Please reduce the length "
                "of the input messages.")
        if requested is not None and tokens + requested > config.max_model_len:
            raise bad_request(
                f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This "
                f"model's maximum context length is {config.max_model_len} tokens and your "
                f"request has {tokens} input tokens ({requested} > {config.max_model_len} - "
                f"{tokens}).")
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.")
    _check_sampling_ranges(body)
    if requested is not None and requested < 1:
        raise bad_request(f"max_tokens must be at least 1, got {requested}.")
    choices = []
    for prompt, tokens in zip(prompts, lengths):
        budget = config.max_model_len - tokens if requested is None else requested
        text = prompt if isinstance(prompt, str) else "".join(map(token_text, prompt))
        key = model.request_key({"messages": prompt, "seed": body.get("seed"),
                                 "temperature": body.get("temperature")})
        for index in range(n):
            stream = model.TokenStream(key, index)
            written = sampling.lengthen(stream.sentence(model.ANSWER_TOKENS), body, budget,
                                        stream)  # ignore_eos, min_tokens
            choice = Choice(len(choices), *cut_output(written, budget, body.get("stop"),
                                                      sampling.min_tokens(body)))
            choice.prompt_text = text
            choices.append(choice)
    completion = Completion(body.get("model") or config.served_names[0], sum(lengths), choices)
    completion.id = f"cmpl-{uuid.uuid4().hex}"
    return completion


def _completion_logprobs(text, count, offset=0):
    """CompletionLogProbs of a text: per token its logprob and up to `count` alternatives (the
    sampled token among them); values are fixed stand-ins."""
    tokens = model.split_tokens(text)
    offsets = [offset + len("".join(tokens[:position])) for position in range(len(tokens))]
    logprobs = [-0.01 - position % 3 * 0.001 for position in range(len(tokens))]
    top = [dict([(token, logprob)] + [(f"{token}#{rank}", logprob - 0.5 * rank)
                                      for rank in range(1, count)])
           for token, logprob in zip(tokens, logprobs)]
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens,
            "top_logprobs": top}


def text_response_body(completion, body):
    """CompletionResponse of vLLM 0.10.1.1."""
    choices = []
    for choice in completion.choices:
        text = (choice.prompt_text if body.get("echo") else "") + choice.content
        choices.append({"index": choice.index, "text": text,
                        "logprobs": (_completion_logprobs(text, body["logprobs"])
                                     if body.get("logprobs") is not None else None),
                        "finish_reason": choice.finish_reason,
                        "stop_reason": choice.stop_reason, "prompt_logprobs": None})
    return {"id": completion.id, "object": "text_completion", "created": completion.created,
            "model": completion.model_name, "choices": choices, "service_tier": None,
            "system_fingerprint": None, "usage": completion.usage(),
            "kv_transfer_params": None}


def text_stream_chunks(completion, body):
    """The CompletionStreamResponse objects of a streamed completion: one per token, the last
    one of a choice with its finish_reason, then the usage when stream_options asks."""
    for choice in completion.choices:
        tokens = model.split_tokens(choice.content) or [""]
        offset = 0
        for position, token in enumerate(tokens):
            last = position == len(tokens) - 1
            if position == 0 and body.get("echo"):
                token = choice.prompt_text + token
            yield {"id": completion.id, "object": "text_completion",
                   "created": completion.created, "model": completion.model_name,
                   "choices": [{"index": choice.index, "text": token,
                                "logprobs": (_completion_logprobs(token, body["logprobs"],
                                                                  offset)
                                             if body.get("logprobs") is not None else None),
                                "finish_reason": choice.finish_reason if last else None,
                                "stop_reason": choice.stop_reason if last else None}],
                   "usage": None}
            offset += len(token)
    stream_options = body.get("stream_options")
    if isinstance(stream_options, dict) and stream_options.get("include_usage", True):
        usage = {name: value for name, value in completion.usage().items() if value is not None}
        yield {"id": completion.id, "object": "text_completion", "created": completion.created,
               "model": completion.model_name, "choices": [], "usage": usage}
