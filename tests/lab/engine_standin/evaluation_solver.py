"""Honest answers to the quality gate's evaluation set: the stand-in computes them.

The quality set asks its questions in a few fixed forms. When the prompt (the text of the last
message, a user message) is one of them, word for word apart from the values, the answer is
computed from the values in it; nothing is looked up and no answer is stored anywhere. Any other
prompt, or one whose values the form cannot take (a division by zero, a tie for the largest,
February 30), gets the simulated model's usual text. So the quality gate measures what it
should: an engine that answers, through the serving layer under test, what it was asked.

    Compute <expr>. Answer with the number only.
        integers with + - * // and parentheses, evaluated on the syntax tree (never eval)
    Which of these numbers is the largest? A) 12 B) 7 C) 30 D) 3. Answer with the letter only.
        also `smallest`; the letter of the one extreme value
    How many times does the letter 'r' appear in 'strawberry'? Answer with the number only.
        the letter counted in either case (the letter r is the same letter as R)
    Sort these words alphabetically, separated by single spaces: pear apple fig.
        the words in alphabetical order, case aside, joined by single spaces
    Reverse the word 'engine'. Answer with the reversed word only.
    Return a JSON object with keys "name" set to "Ada" and "year" set to 1815, and nothing else.
        any number of `"key" set to <JSON value>` pairs joined by `, `, ` and ` or `, and `;
        the answer is the object as json.dumps writes it: {"name": "Ada", "year": 1815}
    Write the date March 5, 2024 in ISO 8601 format (YYYY-MM-DD), nothing else.
        month names in full or in three letters

A guided answer (response_format json_object or json_schema) is left to the format, as a real
engine's output is constrained by it. The answer then goes through everything any answer goes
through: thinking before it when thinking is on, the token budget (a budget too small cuts it,
finish_reason `length`), stop strings, and the speed model.

Wrong share. BIV100_STANDIN_WRONG_SHARE (0 to 1, default 0) makes that share of the recognised
questions come back wrong but plausible: the number plus one, another letter, two words swapped,
a misspelled word, a JSON object with one value changed, the next day. Which questions is fixed
by the prompt: a question is answered wrongly when the first 8 bytes of the sha256 of its
prompt, as a fraction of 2**64, are below the share. The same engine therefore always gives
the same answers, and a higher share keeps the lower share's wrong answers wrong.
"""

import ast
import datetime
import decimal
import hashlib
import json
import re

from .sampling import GUIDED_FORMATS

WRONG_SHARE_VARIABLE = "BIV100_STANDIN_WRONG_SHARE"
MAX_EXPRESSION_CHARS = 400
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")

COMPUTE = re.compile(r"Compute (?P<expression>[0-9+\-*/() ]+)\. Answer with the number only\.")
EXTREME = re.compile(r"Which of these numbers is the (?P<which>largest|smallest)\? "
                     r"(?P<options>[A-Z]\) -?\d+(?:\.\d+)?(?: [A-Z]\) -?\d+(?:\.\d+)?)+)\. "
                     r"Answer with the letter only\.")
OPTION = re.compile(r"([A-Z])\) (-?\d+(?:\.\d+)?)")
LETTER_COUNT = re.compile(r"How many times does the letter '(?P<letter>[^\W\d_])' appear in "
                          r"'(?P<text>[^']*)'\? Answer with the number only\.")
SORT = re.compile(r"Sort these words alphabetically, separated by single spaces: "
                  r"(?P<words>[\w'-]+(?: [\w'-]+)*)\.")
REVERSE = re.compile(r"Reverse the word '(?P<word>[^'\s]+)'\. Answer with the reversed word "
                     r"only\.")
JSON_OBJECT = re.compile(r"Return a JSON object with keys? (?P<pairs>.+), and nothing else\.",
                         re.S)
DATE = re.compile(r"Write the date (?P<month>[A-Za-z]+) (?P<day>\d{1,2}), (?P<year>\d{1,4}) "
                  r"in ISO 8601 format \(YYYY-MM-DD\), nothing else\.")
PAIR_SEPARATORS = (", and ", " and ", ", ")
SET_TO = " set to "


class WrongShareError(ValueError):
    pass


def wrong_share_from(environ):
    raw = environ.get(WRONG_SHARE_VARIABLE)
    if raw is None or raw == "":
        return 0.0
    try:
        share = float(raw)
    except ValueError:
        share = float("nan")
    if not 0.0 <= share <= 1.0:
        raise WrongShareError(f"{WRONG_SHARE_VARIABLE}={raw} is not a share between 0 and 1")
    return share


def answer(body, wrong_share=0.0):
    """The computed answer to the request's prompt, or None when it is none of the forms."""
    response_format = body.get("response_format") or {}
    if isinstance(response_format, dict) and response_format.get("type") in GUIDED_FORMATS:
        return None
    prompt = prompt_text(body)
    solved = solve(prompt) if prompt is not None else None
    if solved is None:
        return None
    right, wrong = solved
    return wrong if answered_wrongly(prompt, wrong_share) else right


def prompt_text(body):
    """The text of the last message when a user sent it, else None."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "user":
        return None
    content = messages[-1].get("content")
    if isinstance(content, list):
        content = "".join(part.get("text") or "" for part in content
                          if isinstance(part, dict) and part.get("type") == "text")
    return content.strip() if isinstance(content, str) else None


def wrong_fraction(prompt):
    """Where the prompt falls in [0, 1): the first 8 bytes of its sha256 over 2**64."""
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") / 2 ** 64


def answered_wrongly(prompt, wrong_share):
    return wrong_fraction(prompt) < wrong_share


def solve(prompt):
    """(right answer, wrong answer) of a prompt in one of the forms, or None."""
    for form, solver in SOLVERS:
        match = form.fullmatch(prompt)
        if match:
            return solver(match)
    return None


# ---- the forms --------------------------------------------------------------------------------

def _compute(match):
    expression = match.group("expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        value = _integer_value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None
    return str(value), str(value + 1)


ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
              ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b}


def _integer_value(node):
    """An integer expression's value from its syntax tree: literals, + - * //, unary signs."""
    if (isinstance(node, ast.Constant) and isinstance(node.value, int)
            and not isinstance(node.value, bool)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _integer_value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](_integer_value(node.left), _integer_value(node.right))
    raise ValueError(f"not integer arithmetic: {ast.dump(node)}")


def _extreme(match):
    options = [(letter, decimal.Decimal(number))
               for letter, number in OPTION.findall(match.group("options"))]
    letters = [letter for letter, _number in options]
    if len(set(letters)) != len(letters):
        return None
    pick = max if match.group("which") == "largest" else min
    best = pick(number for _letter, number in options)
    winners = [letter for letter, number in options if number == best]
    if len(winners) != 1:
        return None  # a tie has no one right letter
    position = letters.index(winners[0])
    return winners[0], letters[(position + 1) % len(letters)]


def _letter_count(match):
    letter, text = match.group("letter").casefold(), match.group("text").casefold()
    count = text.count(letter)
    return str(count), str(count + 1)


def _sort(match):
    words = sorted(match.group("words").split(" "), key=lambda word: (word.casefold(), word))
    wrong = list(words)
    for position in range(len(wrong) - 1):
        if wrong[position] != wrong[position + 1]:
            wrong[position], wrong[position + 1] = wrong[position + 1], wrong[position]
            break
    else:
        wrong[0] = _misspelled(wrong[0])
    return " ".join(words), " ".join(wrong)


def _reverse(match):
    reversed_word = match.group("word")[::-1]
    return reversed_word, _misspelled(reversed_word)


def _misspelled(word):
    """The word with its first two different neighbouring letters swapped, or one letter more."""
    for position in range(len(word) - 1):
        if word[position] != word[position + 1]:
            return (word[:position] + word[position + 1] + word[position]
                    + word[position + 2:])
    return word + (word[-1] if word else "a")


def _json_object(match):
    pairs = _json_pairs(match.group("pairs"))
    if not pairs:
        return None
    right = dict(pairs)
    first_key = pairs[0][0]
    wrong = dict(right, **{first_key: _changed(right[first_key])})
    return json.dumps(right, ensure_ascii=False), json.dumps(wrong, ensure_ascii=False)


def _json_pairs(text):
    """[(key, value)] of `"key" set to <JSON value>` pairs joined by the separators, or None."""
    decoder = json.JSONDecoder()
    pairs, position = [], 0
    try:
        while True:
            key, position = decoder.raw_decode(text, position)
            if not isinstance(key, str) or not text.startswith(SET_TO, position):
                return None
            value, position = decoder.raw_decode(text, position + len(SET_TO))
            pairs.append((key, value))
            if position == len(text):
                return pairs
            separator = next((separator for separator in PAIR_SEPARATORS
                              if text.startswith(separator, position)), None)
            if separator is None:
                return None
            position += len(separator)
    except ValueError:
        return None


def _changed(value):
    """A plausible other value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return _misspelled(value)
    if isinstance(value, list):
        return value[:-1] if value else [0]
    if isinstance(value, dict):
        return {} if value else {"value": 0}
    return 0  # null


def _date(match):
    month = _month_number(match.group("month"))
    if month is None:
        return None
    try:
        day = datetime.date(int(match.group("year")), month, int(match.group("day")))
    except ValueError:
        return None
    one_day = datetime.timedelta(days=1)
    other = day + one_day if day < datetime.date.max else day - one_day
    return day.isoformat(), other.isoformat()


def _month_number(name):
    name = name.casefold()
    for number, month in enumerate(MONTHS, 1):
        if name in (month, month[:3]):
            return number
    return None


SOLVERS = ((COMPUTE, _compute), (EXTREME, _extreme), (LETTER_COUNT, _letter_count),
           (SORT, _sort), (REVERSE, _reverse), (JSON_OBJECT, _json_object), (DATE, _date))
