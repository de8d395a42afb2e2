"""vLLM 0.10.1.1's sampling extras that load generators rely on: ignore_eos and min_tokens.

ignore_eos: true makes the model write on past the end of its answer until the token budget
(max_tokens or max_completion_tokens, else the rest of the context) is spent; vLLM's benchmark
sends it so that every answer has exactly the length it asked for. min_tokens keeps the model
writing until that many tokens are out, and vLLM's StopChecker looks for stop strings only from
the min_tokens-th token on (see chat.cut_output). Either way the model goes on in its own words.

A guided answer (a named or required tool choice, a json_object or json_schema format) ends
where its JSON ends: the grammar lets nothing follow it.
"""

from . import simulated_model as model

GUIDED_FORMATS = ("json_object", "json_schema")


def min_tokens(body):
    return body.get("min_tokens") or 0


def ignores_eos(body):
    return body.get("ignore_eos") is True


def guided(body):
    choice = body.get("tool_choice")
    if body.get("tools") and (isinstance(choice, dict) or choice == "required"):
        return True
    response_format = body.get("response_format") or {}
    return isinstance(response_format, dict) and response_format.get("type") in GUIDED_FORMATS


def lengthen(text, body, budget, stream):
    """The model's raw text, written on to the length ignore_eos or min_tokens asks for.

    Past the budget when the end of text may not come before it: the budget then cuts the
    answer, finish_reason `length`, as vLLM's max_tokens does.
    """
    wanted = min_tokens(body)
    if ignores_eos(body) or wanted >= budget:
        wanted = budget + 1
    if guided(body):
        return text
    missing = wanted - len(model.split_tokens(text))
    while missing > 0:
        # Every vocabulary word is one token; a space before it keeps it one.
        text += " " + stream.words(missing)
        missing = wanted - len(model.split_tokens(text))
    return text
