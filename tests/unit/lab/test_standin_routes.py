"""The stand-in's routes besides chat, and the sampling checks it shares with chat, as vLLM
0.10.1.1 answers them: /v1/completions, /tokenize, /detokenize, SamplingParams' ranges."""

import json

import pytest

from standin_engines import ENGINE_FLAGS, SERVED, Engine, make_host


@pytest.fixture(scope="module")
def engine(tmp_path_factory, base_vllm):
    host = make_host(tmp_path_factory.mktemp("routes"), base_vllm, patched=True)
    started = Engine(host, ENGINE_FLAGS).wait_started()
    yield started
    started.stop()


def completion(engine, **body):
    body.setdefault("model", SERVED)
    return engine.request("POST", "/v1/completions", body)


# ---- /v1/completions -----------------------------------------------------------------------

def test_a_completion_has_vllms_shape_and_16_tokens_by_default(engine):
    status, body = completion(engine, prompt="The capital of France is")

    assert status == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason",
                           "prompt_logprobs"}
    assert body["usage"]["completion_tokens"] <= 16  # CompletionRequest.max_tokens
    assert body["usage"]["total_tokens"] == (body["usage"]["prompt_tokens"]
                                             + body["usage"]["completion_tokens"])


def test_a_completion_is_the_same_for_the_same_request_and_n_choices_differ(engine):
    first = completion(engine, prompt="Once", max_tokens=8, n=2, temperature=0.5, seed=1)[1]
    again = completion(engine, prompt="Once", max_tokens=8, n=2, temperature=0.5, seed=1)[1]

    assert [choice["index"] for choice in first["choices"]] == [0, 1]
    assert [choice["text"] for choice in first["choices"]] == \
        [choice["text"] for choice in again["choices"]]
    assert first["choices"][0]["text"] != first["choices"][1]["text"]


def test_a_batch_of_prompts_gets_one_choice_each_and_echo_repeats_the_prompt(engine):
    status, body = completion(engine, prompt=["One", "Two"], max_tokens=4, echo=True)

    assert status == 200
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert body["choices"][0]["text"].startswith("One")
    assert body["choices"][1]["text"].startswith("Two")


def test_completion_logprobs_are_per_token(engine):
    choice = completion(engine, prompt="Hi", max_tokens=4, logprobs=2)[1]["choices"][0]
    logprobs = choice["logprobs"]

    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == len(
        logprobs["top_logprobs"])
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


def test_a_streamed_completion_is_text_chunks_then_usage_when_asked(engine):
    status, text = completion(engine, prompt="Once", max_tokens=5, stream=True,
                              stream_options={"include_usage": True})
    events = [json.loads(line[len("data: "):]) for line in text.splitlines()
              if line.startswith("data: {")]

    assert status == 200 and text.rstrip().endswith("data: [DONE]")
    assert {event["object"] for event in events} == {"text_completion"}
    assert len({event["id"] for event in events}) == 1
    finishing = [event for event in events if event["choices"]
                 and event["choices"][0]["finish_reason"]]
    assert len(finishing) == 1 and finishing[0]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("body, status, message", [
    ({"max_tokens": 8}, 400, "At least one of `prompt` or `prompt_embeds` must be set."),
    ({"prompt": "Hi", "suffix": "!"}, 400, "suffix is not currently supported"),
    ({"prompt": "Hi", "model": "other"}, 404, "The model `other` does not exist."),
    ({"prompt": "Hi", "stream_options": {"include_usage": True}}, 400,
     "Stream options can only be defined when `stream=True`."),
    ({"prompt": "Hi", "max_tokens": 5000}, 400, "'max_tokens' or 'max_completion_tokens' is too "
                                                "large: 5000."),
    ({"prompt": "Hi", "n": 0}, 400, "n must be at least 1, got 0."),
    ({"prompt": "Hi", "top_p": 0}, 400, "top_p must be in (0, 1], got 0.0."),
    ({"prompt": {"text": "Hi"}}, 400, "'loc': ('body', 'prompt'), 'msg': 'Input should be a valid string"),
])
def test_a_bad_completion_request_is_refused_as_vllm_refuses_it(engine, body, status, message):
    answered, error = completion(engine, **body)
    assert answered == status and message in error["error"]["message"]
    assert error["error"]["code"] == status


# ---- /tokenize and /detokenize --------------------------------------------------------------

def test_tokenize_counts_what_chat_counts_for_the_same_messages(engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    tokenized = engine.request("POST", "/tokenize", {"messages": messages})[1]
    chatted = engine.chat(messages=messages, max_tokens=4)[1]

    assert tokenized["count"] == len(tokenized["tokens"]) == chatted["usage"]["prompt_tokens"]
    assert tokenized["max_model_len"] == 4096 and tokenized["token_strs"] is None


def test_tokenized_ids_detokenize_back_to_the_text(engine):
    tokenized = engine.request("POST", "/tokenize", {"prompt": "Hello, world!",
                                                     "return_token_strs": True})[1]

    assert tokenized["token_strs"] == ["Hello", ",", " world", "!"]
    assert all(0 <= token < 151643 for token in tokenized["tokens"])
    assert engine.request("POST", "/detokenize", {"tokens": tokenized["tokens"]}) == \
        (200, {"prompt": "Hello, world!"})


@pytest.mark.parametrize("path, body, status", [
    ("/tokenize", {}, 400),
    ("/tokenize", {"prompt": 5}, 400),
    ("/tokenize", {"prompt": "Hi", "model": "other"}, 404),
    ("/detokenize", {"tokens": "1 2"}, 400),
    ("/detokenize", {"tokens": [-1]}, 400),
])
def test_bad_tokenizer_requests_are_refused(engine, path, body, status):
    answered, error = engine.request("POST", path, body)
    assert answered == status and error["error"]["code"] == status


def test_the_tokenizer_routes_need_no_key_and_completions_do(start):
    keyed = start(ENGINE_FLAGS + ["--api-key", "secret"], patched=True)

    assert keyed.request("POST", "/tokenize", {"prompt": "Hi"})[0] == 200
    assert completion(keyed, prompt="Hi")[0] == 401
    assert keyed.request("POST", "/v1/completions", {"prompt": "Hi"},
                         headers={"Authorization": "Bearer secret",
                                  "Content-Type": "application/json"})[0] == 200


# ---- SamplingParams' ranges, shared by chat and completions ---------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("presence_penalty", 3, "presence_penalty must be in [-2, 2], got 3.0."),
    ("frequency_penalty", -2.5, "frequency_penalty must be in [-2, 2], got -2.5."),
    ("repetition_penalty", 0, "repetition_penalty must be greater than zero, got 0.0."),
    ("temperature", -1, "temperature must be non-negative, got -1.0."),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5."),
    ("top_k", -2, "top_k must be 0 (disable), or at least 1, got -2."),
    ("min_p", 2, "min_p must be in [0, 1], got 2.0."),
])
def test_a_sampling_value_out_of_range_is_a_400_naming_it(engine, field, value, message):
    status, body = engine.chat(**{field: value, "max_tokens": 4})
    assert (status, body["error"]["message"], body["error"]["type"]) == \
        (400, message, "BadRequestError")


@pytest.mark.parametrize("field, value", [("temperature", "hot"), ("top_p", [1]),
                                          ("top_k", 2.5), ("top_k", "many")])
def test_a_sampling_value_of_the_wrong_type_is_a_validation_error(engine, field, value):
    status, body = engine.chat(**{field: value, "max_tokens": 4})
    assert status == 400 and body["error"]["type"] == "Bad Request"
    assert field in body["error"]["message"]


def test_sampling_values_in_range_and_numeric_strings_pass(engine):
    status, _body = engine.chat(temperature="0.7", top_p=1, top_k=-1, min_p=0,
                                presence_penalty=-2, frequency_penalty=2,
                                repetition_penalty=1.1, max_tokens=4)
    assert status == 200
