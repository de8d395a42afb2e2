"""The stand-in's answers to the quality gate's evaluation set: computed from the question,
wrong on request for a fixed share of the questions, and the usual text for anything else."""

import json

import pytest
from engine_standin import evaluation_solver as solver
from engine_standin import simulated_model as model

from standin_engines import ENGINE_FLAGS, Engine, make_host

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
COMPUTE = "Compute 17 * 23. Answer with the number only."
JSON_QUESTION = ('Return a JSON object with keys "name" set to "Ada" and "year" set to 1815, '
                 "and nothing else.")

# (prompt, right answer, wrong answer)
FORMS = [
    (COMPUTE, "391", "392"),
    ("Compute (12 + 30) // 4 - -3. Answer with the number only.", "13", "14"),
    ("Compute 2 - 5 * 3. Answer with the number only.", "-13", "-12"),
    ("Which of these numbers is the largest? A) 12 B) 7 C) 30 D) 3. Answer with the letter "
     "only.", "C", "D"),
    ("Which of these numbers is the smallest? A) 12 B) 7 C) 30 D) 3. Answer with the letter "
     "only.", "D", "A"),
    ("Which of these numbers is the largest? A) -1.5 B) -2. Answer with the letter only.",
     "A", "B"),
    ("How many times does the letter 'r' appear in 'strawberry'? Answer with the number only.",
     "3", "4"),
    ("How many times does the letter 's' appear in 'Mississippi'? Answer with the number only.",
     "4", "5"),
    ("Sort these words alphabetically, separated by single spaces: pear apple fig.",
     "apple fig pear", "fig apple pear"),
    ("Reverse the word 'engine'. Answer with the reversed word only.", "enigne", "neigne"),
    ("Reverse the word 'level'. Answer with the reversed word only.", "level", "elvel"),
    (JSON_QUESTION, '{"name": "Ada", "year": 1815}', '{"name": "dAa", "year": 1815}'),
    ('Return a JSON object with keys "a" set to 1, "b" set to [1, 2] and "c" set to '
     '{"d": null}, and nothing else.', '{"a": 1, "b": [1, 2], "c": {"d": null}}',
     '{"a": 2, "b": [1, 2], "c": {"d": null}}'),
    ('Return a JSON object with keys "title" set to "Salt and Pepper", "ok" set to true, and '
     '"n" set to 2, and nothing else.', '{"title": "Salt and Pepper", "ok": true, "n": 2}',
     '{"title": "aSlt and Pepper", "ok": true, "n": 2}'),
    ("Write the date March 5, 2024 in ISO 8601 format (YYYY-MM-DD), nothing else.",
     "2024-03-05", "2024-03-06"),
    ("Write the date February 28, 2023 in ISO 8601 format (YYYY-MM-DD), nothing else.",
     "2023-02-28", "2023-03-01"),
    ("Write the date Dec 31, 999 in ISO 8601 format (YYYY-MM-DD), nothing else.",
     "0999-12-31", "1000-01-01"),
]

NOT_FORMS = [
    "Compute 2 ** 10. Answer with the number only.",     # no powers
    "Compute 7 / 2. Answer with the number only.",       # integer division only
    "Compute 1 // 0. Answer with the number only.",
    "Compute 17 * 23.",
    "compute 17 * 23. Answer with the number only.",
    "Please compute 17 * 23. Answer with the number only.",
    "Which of these numbers is the largest? A) 3 B) 3. Answer with the letter only.",  # a tie
    "Which of these numbers is the largest? A) 3. Answer with the letter only.",
    "How many times does the letter 'rr' appear in 'strawberry'? Answer with the number only.",
    "Sort these words alphabetically: pear apple fig.",
    'Return a JSON object with keys "a" set to undefined, and nothing else.',
    'Return a JSON object with keys "a" is 1, and nothing else.',
    "Write the date February 30, 2024 in ISO 8601 format (YYYY-MM-DD), nothing else.",
    "Write the date Smarch 5, 2024 in ISO 8601 format (YYYY-MM-DD), nothing else.",
    "What is the weather?",
]


def ask(prompt, **extra):
    return dict({"messages": [{"role": "user", "content": prompt}]}, **extra)


# ---- the solver ---------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, right, wrong", FORMS)
def test_each_form_is_computed(prompt, right, wrong):
    assert solver.solve(prompt) == (right, wrong)
    assert solver.answer(ask(prompt)) == right
    assert solver.answer(ask(prompt), wrong_share=1.0) == wrong


@pytest.mark.parametrize("prompt", NOT_FORMS)
def test_anything_else_is_not_answered(prompt):
    assert solver.solve(prompt) is None
    assert solver.answer(ask(prompt), wrong_share=1.0) is None


def test_the_prompt_is_the_last_user_message():
    system = {"role": "system", "content": "Be brief."}
    assert solver.answer({"messages": [system, {"role": "user", "content": f"  {COMPUTE}\n"}]}) \
        == "391"
    parts = [{"type": "text", "text": "Compute 17 * 23. "},
             {"type": "text", "text": "Answer with the number only."}]
    assert solver.answer({"messages": [{"role": "user", "content": parts}]}) == "391"
    assert solver.answer({"messages": [{"role": "user", "content": COMPUTE},
                                       {"role": "assistant", "content": "391"}]}) is None


def test_guided_formats_are_left_to_the_format():
    assert solver.answer(ask(JSON_QUESTION, response_format={"type": "json_object"})) is None
    assert solver.answer(ask(COMPUTE, response_format={"type": "text"})) == "391"


def test_the_wrong_share_picks_questions_by_the_hash_of_their_prompt():
    prompts = [f"Compute {number} + {number}. Answer with the number only."
               for number in range(200)]
    wrong_at = {}
    for share in (0.0, 0.3, 0.6, 1.0):
        wrong_at[share] = {prompt for prompt in prompts
                           if solver.answer(ask(prompt), share) != solver.solve(prompt)[0]}
        assert wrong_at[share] == {prompt for prompt in prompts
                                   if solver.wrong_fraction(prompt) < share}
    assert wrong_at[0.0] == set() and wrong_at[1.0] == set(prompts)
    assert 0.2 * 200 < len(wrong_at[0.3]) < 0.4 * 200
    assert wrong_at[0.3] < wrong_at[0.6]  # a higher share keeps the lower share's wrong answers
    assert 0 <= min(map(solver.wrong_fraction, prompts)) < max(map(solver.wrong_fraction,
                                                                   prompts)) < 1


@pytest.mark.parametrize("raw, share", [(None, 0.0), ("", 0.0), ("0.25", 0.25), ("1", 1.0)])
def test_wrong_share_from_the_environment(raw, share):
    environ = {} if raw is None else {"BIV100_STANDIN_WRONG_SHARE": raw}
    assert solver.wrong_share_from(environ) == share


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "half", "nan"])
def test_wrong_share_must_be_a_share(raw):
    with pytest.raises(solver.WrongShareError, match="BIV100_STANDIN_WRONG_SHARE"):
        solver.wrong_share_from({"BIV100_STANDIN_WRONG_SHARE": raw})


# ---- through the stand-in -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tmp_path_factory, base_vllm):
    host = make_host(tmp_path_factory.mktemp("solver"), base_vllm)
    running = Engine(host, ENGINE_FLAGS).wait_started()
    yield running
    running.stop()


@pytest.mark.parametrize("prompt, right, _wrong", FORMS[::3])
def test_the_engine_answers_with_the_computed_answer(engine, prompt, right, _wrong):
    status, answer = engine.chat(**ask(prompt, max_tokens=200, **THINKING_OFF))
    choice = answer["choices"][0]
    assert status == 200 and choice["message"]["content"] == right
    assert choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(model.split_tokens(right))


def test_thinking_comes_before_the_computed_answer(engine):
    message = engine.chat(**ask(COMPUTE, max_tokens=200))[1]["choices"][0]["message"]
    assert message["reasoning_content"].strip()
    # The qwen3 parser leaves what follows </think>, the blank line included, as content.
    assert message["content"] == "\n\n391"


def test_streamed_answer_is_the_computed_answer(engine):
    chunks, done = engine.stream(**ask(JSON_QUESTION, max_tokens=200, **THINKING_OFF))
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks
                      if chunk["choices"])
    assert done and json.loads(content) == {"name": "Ada", "year": 1815}


def test_a_small_budget_cuts_the_computed_answer(engine):
    choice = engine.chat(**ask(JSON_QUESTION, max_tokens=3, **THINKING_OFF))[1]["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == '{"name'


def test_other_prompts_get_the_usual_text(engine):
    body = ask("What is the capital of France?", max_tokens=200, **THINKING_OFF)
    content = engine.chat(**body)[1]["choices"][0]["message"]["content"]
    words = content.rstrip(".").lower().split()
    assert content.endswith(".") and set(words) <= set(model.VOCABULARY)
    assert engine.chat(**body)[1]["choices"][0]["message"]["content"] == content


def test_an_engine_told_to_be_wrong_is_wrong(start):
    wrong = start(ENGINE_FLAGS, env={"BIV100_STANDIN_WRONG_SHARE": "1"})
    content = wrong.chat(**ask(COMPUTE, max_tokens=200, **THINKING_OFF))[1]["choices"][0]
    assert content["message"]["content"] == "392"


def test_a_wrong_share_outside_0_to_1_stops_the_start(start):
    engine = start(env={"BIV100_STANDIN_WRONG_SHARE": "2"}, wait=False)
    assert engine.wait_exit() == 1
    assert "BIV100_STANDIN_WRONG_SHARE=2 is not a share between 0 and 1" in engine.output()
