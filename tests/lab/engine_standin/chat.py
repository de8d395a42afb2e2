"""/v1/chat/completions of vLLM 0.10.1.1, answered by the simulated model.

A request goes the way it goes in vLLM: the protocol's validators (400 "Bad Request"), the
served-model check (404), the serving layer's checks (400 "BadRequestError"), the context
length, then generation. Generation writes the raw text a Qwen3 model would write
(`<think>...</think>` when thinking, `<tool_call>` blocks for tool calls), cuts it at the
token budget and at stop strings, and then reads it back with the logic of the qwen3 reasoning
parser and the qwen3_coder tool parser, so truncation has the consequences it has on the real
engine (thinking that uses up the budget leaves no tool call).
"""

import json
import re
import time
import uuid

from . import simulated_model as model

FUNCTION_BLOCK = re.compile(r"<function=([^>\n]+)>\n(.*?)</function>", re.S)
PARAMETER_BLOCK = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>", re.S)
INTEGER_FIELDS = ("n", "max_tokens", "max_completion_tokens", "top_logprobs", "seed")
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


def invalid_request(message):
    """A ValueError of a ChatCompletionRequest validator, as FastAPI's handler reports it."""
    return ApiError(400, f"1 validation error for ChatCompletionRequest\n  Value error, "
                         f"{message}", "Bad Request")


class ServingConfig:
    """What the chat endpoint needs to know about the running engine."""

    def __init__(self, served_names, max_model_len, max_num_seqs, enable_auto_tools,
                 tool_parser, reasoning_parser, fixes, broken):
        self.served_names = served_names
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.enable_auto_tools = enable_auto_tools
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.fixes = fixes
        self.broken = broken  # the one BIV100_STANDIN_BREAK kind, or None


# ---- the request, as the protocol's validators leave it ---------------------------------

def validate_request(body, config):
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise invalid_request("Field required: messages")
    if not all(isinstance(message, dict) and "role" in message
               for message in body["messages"]):
        raise invalid_request("messages: each message needs a role")
    _check_integer_fields(body)
    if config.broken == "max_completion_tokens" and "max_completion_tokens" in body:
        raise invalid_request("Extra inputs are not permitted: max_completion_tokens")
    if body.get("stream_options") and not body.get("stream"):
        raise invalid_request("Stream options can only be defined when `stream=True`.")
    _check_top_logprobs(body)
    if config.fixes["thinking_off_for_tools"]:
        _disable_thinking_for_tool_calls(body)
    _check_tool_usage(body)
    return body


def _check_integer_fields(body):
    for name in INTEGER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise invalid_request(f"{name}: Input should be a valid integer")


def _check_top_logprobs(body):
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is None:
        return
    if top_logprobs < 0:
        raise invalid_request("`top_logprobs` must be a positive value.")
    if top_logprobs > 0 and not body.get("logprobs"):
        raise invalid_request("when using `top_logprobs`, `logprobs` must be set to true.")


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
        raise invalid_request("When using `tool_choice`, `tools` must be set.")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise invalid_request(f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                              '"none", "auto" or "required" are supported.')
    if choice == "required" and body["tools"] == []:
        body["tool_choice"] = "none"
        del body["tools"]
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in [tool["function"]["name"] for tool in body["tools"]]:
            raise invalid_request("The tool specified in `tool_choice` does not match any "
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
        raise bad_request(
            f"This model's maximum context length is {config.max_model_len} tokens. However, "
            f"your request has {prompt_tokens} input tokens. Please reduce the length of the "
            "input messages.")
    if requested is not None and prompt_tokens + requested > config.max_model_len:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {config.max_model_len} tokens and your request has "
            f"{prompt_tokens} input tokens ({requested} > {config.max_model_len} - "
            f"{prompt_tokens}).")
    n = body.get("n") if body.get("n") is not None else 1
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.")
    if requested is not None and requested < 1:
        raise bad_request(f"max_tokens must be at least 1, got {requested}.")
    default = config.max_model_len - prompt_tokens
    return default if requested is None else min(default, requested)


# ---- generation -------------------------------------------------------------------------

def thinking_enabled(body):
    """Qwen3's chat template thinks unless enable_thinking is false."""
    template_kwargs = body.get("chat_template_kwargs") or {}
    return template_kwargs.get("enable_thinking", True) is not False


def calls_a_tool(body):
    return bool(body.get("tools")) and body.get("tool_choice") not in (None, "none")


def raw_output(body, stream, budget, config):
    """What the model writes, before the budget and stop strings cut it."""
    answer = _tool_call_text(body, stream) if calls_a_tool(body) else _answer_text(body, stream)
    if not thinking_enabled(body):
        return answer
    if config.broken == "thinking_tools" and calls_a_tool(body):
        reasoning = stream.words(budget + 1)  # thinks past the whole budget
    else:
        reasoning = stream.sentence(model.REASONING_TOKENS)
    separator = "" if calls_a_tool(body) else "\n\n"
    return f"{model.THINK_START}\n{reasoning}\n{model.THINK_END}{separator}{answer}"


def _answer_text(body, stream):
    response_format = body.get("response_format") or {}
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


def cut_output(text, budget, stop):
    """(text, completion tokens, finish_reason, stop_reason) after stop strings and budget."""
    tokens = model.split_tokens(text)
    finish_reason, stop_reason = "stop", None
    if len(tokens) > budget:
        tokens, finish_reason = tokens[:budget], "length"
    text = "".join(tokens)
    found = [(text.find(stop_string), stop_string)
             for stop_string in ([stop] if isinstance(stop, str) else stop or [])
             if stop_string and stop_string in text]
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
    text = raw_output(body, stream, budget, config)
    choice = Choice(index, *cut_output(text, budget, body.get("stop")))
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
        for delta in _content_deltas(choice):
            yield _chunk(completion, choice.index, delta)
        yield _chunk(completion, choice.index, {}, choice.finish_reason, choice.stop_reason)
    stream_options = body.get("stream_options") or {}
    if stream_options.get("include_usage"):
        yield dict(_chunk(completion, 0, {}), choices=[], usage=completion.usage())


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
    return {"id": completion.id, "object": "chat.completion.chunk",
            "created": completion.created, "model": completion.model_name,
            "choices": [{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason, "stop_reason": stop_reason}]}
