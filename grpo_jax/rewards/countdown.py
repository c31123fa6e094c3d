"""Countdown reward: 1 when the answer is an arithmetic expression that uses each of the sample's numbers
exactly once and equals its target, computed exactly; else 0 with the reason in `info["reason"]`.

The answer is the answer segment of `format.split_response` (as for `math`): the text of the answer
blocks, or with no answer tag the text after `</think>`; an unclosed `<think>` leaves no answer. Text
outside the answer blocks is ignored here and judged by the `format` reward. Several non-empty answer
blocks come back joined by line breaks, so a line break in the answer is `multiple_answers`.

The expression language, read by a small recursive-descent parser (model text never reaches `eval`):
    expr := term (("+" | "-") term)*      term := factor (("*" | "/") factor)*
    factor := integer | "(" expr ")"      spaces and tabs anywhere between tokens
- Unary minus is not allowed (`unary_minus`), nor unary plus: the game combines the given numbers with
  binary operators only, and `-3` would be a number the sample does not give.
- A literal must be written as the sample writes its number (decimal digits, no sign, no leading zero),
  and the literals must be the sample's numbers as a multiset: a reused, missing or foreign number is
  `wrong_numbers`. A literal over MAX_LITERAL_DIGITS digits is `wrong_numbers` before any arithmetic.
- Arithmetic is exact (`fractions.Fraction`, no float). Non-integer and negative intermediate values
  are allowed: the value is exact, so `6/(1-(3/4))` is 24 with 6, 1, 3, 4. The task's solver never
  writes such intermediates (its traces keep positive integers), so it counts a subset of what scores 1.
- Anything after the expression (`(5*3)+8=23`, `**`, letters) is a `parse_error`.
Bounds, so that no model output is slow: the answer is at most MAX_ANSWER_CHARS characters
(`too_long`), parentheses nest at most MAX_DEPTH deep (`too_deep`), and arithmetic only runs once the
literals are the sample's own numbers, so values stay as small as the sample's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Union

from grpo_jax.rewards.base import RewardInputError, RewardResult, require, reward
from grpo_jax.rewards.format import split_response

COUNTDOWN_VERSION = "1"
MAX_ANSWER_CHARS = 200  # a 4-number answer is ~15 characters; far longer is no expression of the numbers
MAX_LITERAL_DIGITS = 6  # a sample's numbers are below 10**6 (checked), so a longer literal is foreign
MAX_DEPTH = 32  # parenthesis nesting; bounds the parser's recursion

_TOKEN_RE = re.compile(r"[ \t]*(?:([0-9]+)|([-+*/()]))")  # [0-9], not \d: other scripts' digits are not literals
_PRECEDENCE_OPS = (("+", "-"), ("*", "/"))

Node = Union[str, tuple[str, "Node", "Node"]]  # a literal's text, or (operator, left, right)


class _Reject(Exception):
    """The answer is not a valid countdown expression; `reason` is the short identifier reported."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def tokenize(text: str) -> list[str]:
    """The tokens of `text` (integers, operators, parentheses); raises _Reject on any other character."""
    tokens, pos, end = [], 0, len(text.rstrip(" \t"))
    while pos < end:
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise _Reject("parse_error")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens; collects the literals it reads."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos, self.literals = tokens, 0, []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise _Reject("parse_error")  # the expression ends where an operand must come
        self.pos += 1
        return token

    def binary(self, level: int, depth: int) -> Node:
        """expr (level 0) or term (level 1): operands joined by this level's operators, left-associative."""
        operand = (lambda: self.binary(1, depth)) if level == 0 else (lambda: self.factor(depth))
        node = operand()
        while self.peek() in _PRECEDENCE_OPS[level]:
            op = self.take()
            node = (op, node, operand())
        return node

    def factor(self, depth: int) -> Node:
        token = self.take()
        if token == "(":
            if depth >= MAX_DEPTH:
                raise _Reject("too_deep")
            node = self.binary(0, depth + 1)
            if self.take() != ")":
                raise _Reject("parse_error")
            return node
        if token == "-":
            raise _Reject("unary_minus")
        if not token[0].isdigit():  # an operator or ")" where an operand must come
            raise _Reject("parse_error")
        self.literals.append(token)
        return token


def parse(text: str) -> tuple[Node, list[str]]:
    """(syntax tree, literal texts in order) of a whole expression; raises _Reject with the reason."""
    parser = _Parser(tokenize(text))
    tree = parser.binary(0, 0)
    if parser.peek() is not None:
        raise _Reject("parse_error")  # trailing text: an unmatched ")" or two operands in a row
    return tree, parser.literals


def evaluate(node: Node) -> Fraction:
    """The exact value of a syntax tree; raises _Reject("division_by_zero")."""
    if isinstance(node, str):
        return Fraction(int(node))
    op, left, right = node
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        raise _Reject("division_by_zero")
    return a / b


def _sample_problem(sample: Mapping[str, Any]) -> tuple[list[int], int]:
    """(numbers, target) of the sample; a malformed field is a data bug and raises RewardInputError."""
    numbers = require(sample, "numbers", (list, tuple))
    target = require(sample, "target", int)
    ok = all(not isinstance(n, bool) and isinstance(n, int) and 0 <= n < 10**MAX_LITERAL_DIGITS for n in numbers)
    if not numbers or not ok:
        raise RewardInputError(f"sample field 'numbers' must be a non-empty list of ints in "
                               f"[0, 10**{MAX_LITERAL_DIGITS}), got {numbers!r}")
    if isinstance(target, bool):
        raise RewardInputError(f"sample field 'target' must be an int, got {target!r}")
    return list(numbers), target


def _uses_numbers(literals: Sequence[str], numbers: Sequence[int]) -> bool:
    """The literals are the numbers as a multiset, each written as the sample writes it."""
    return all(len(t) <= MAX_LITERAL_DIGITS for t in literals) and Counter(literals) == Counter(map(str, numbers))


def check_expression(text: str, numbers: Sequence[int], target: int) -> str:
    """'correct', or the reason `text` (one answer expression) is not a solution of numbers -> target."""
    if len(text) > MAX_ANSWER_CHARS:
        return "too_long"
    if "\n" in text:
        return "multiple_answers"
    try:
        tree, literals = parse(text)
        if not _uses_numbers(literals, numbers):
            return "wrong_numbers"
        return "correct" if evaluate(tree) == target else "wrong_value"
    except _Reject as e:
        return e.reason


@reward("countdown", COUNTDOWN_VERSION)
def countdown_reward(
    response: str, sample: Mapping[str, Any], *, think_tag: str = "think", answer_tag: str = "answer"
) -> RewardResult:
    """1 if the answer uses `sample["numbers"]` exactly once each and equals `sample["target"]` (module
    docstring), else 0 with `info["reason"]`: no_answer, too_long, multiple_answers, parse_error,
    unary_minus, too_deep, wrong_numbers, division_by_zero, wrong_value."""
    numbers, target = _sample_problem(sample)
    segment = split_response(response, think_tag=think_tag, answer_tag=answer_tag).answer.strip()
    if not segment:
        return RewardResult(0.0, {"reason": "no_answer"})
    reason = check_expression(segment, numbers, target)
    return RewardResult(float(reason == "correct"), {"reason": reason, "expression": segment[:200]})
