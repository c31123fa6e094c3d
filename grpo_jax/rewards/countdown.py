"""Countdown rewards, four binary dimensions of one completion (each 1, or 0 with `info["reason"]`):
- `countdown`: the answer is an arithmetic expression that uses each of the sample's numbers exactly
  once and equals its target, computed exactly;
- `countdown_numbers`: the answer is such an expression over exactly the sample's numbers, whatever its
  value (the `countdown` checks up to and including `wrong_numbers`; no arithmetic runs);
- `countdown_steps`: the thinking is a valid trace over the sample's numbers (below), whatever its
  final value;
- `countdown_ops`: the answer is an expression over exactly the sample's numbers using only the operators of
  `ops` (default + and *), whatever its value: a style that any attempt can meet and a correct answer only
  where the problem has a solution in those operators; with `uses`, the answer must also use those operators
  (`uses="*"`: it multiplies).
At equal weight their sum ties different failures (a valid trace with a right-numbers wrong-value
answer and a correct answer after a broken trace both score 2): that is what a multi-reward
advantage estimator has to tell apart, and why they are separate dimensions.

Every reward reads the whole assistant turn (`format.assistant_turn`: "<think>" in front of the completion
when the row's prompt opened the think block). The answer is the answer segment of `format.split_response` (as
for `math`): the text of the answer
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

The trace (`countdown_steps`) is the thinking segment of `split_response`: the first think block, or all
of an unclosed one (a cut-off response may still hold a whole trace; the other rewards judge the rest).
    thought := step ("," step)*          step := number op number "=" number
    number := "0" | [1-9][0-9]*          op := "+" | "-" | "*" | "/"     spaces and tabs between tokens
- Every number is a non-negative integer written without sign or leading zero, so negative and
  fractional intermediates cannot be written (`3-5=-2` and `7/2=3.5` are `parse_error`): the task's
  traces keep positive integers; here a zero result (`5-5=0`) is allowed too.
- A step's result must be its exact value (`-` not below zero, `/` exact and not by zero), else
  `wrong_arithmetic`; then each operand must be available, else `unavailable_operand`. Available: the
  sample's numbers and earlier results, as a multiset; a step removes its operands and adds its result.
- A valid trace ends with exactly one number left: fewer steps than len(numbers) - 1 is `numbers_left`,
  more is `too_many_steps` (no trace can have them). Its final value is `countdown`'s business.
- With `first=k` only a trace's start is judged: at least k steps (else `too_few_steps`), the first k
  each exact on available operands; what follows them, and the numbers left, are not checked.
- Reasons in order: no_think (empty thinking), too_long (over MAX_THOUGHT_CHARS), parse_error,
  too_many_steps, (too_few_steps), then per step wrong_arithmetic / unavailable_operand, then numbers_left. Work is
  bounded by MAX_THOUGHT_CHARS: every integer is written in the thought, so none is longer than it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Union

from grpo_jax.rewards.base import RewardInputError, RewardResult, require, reward
from grpo_jax.rewards.format import assistant_turn, split_response

# 2: a row with think_prefilled=True is read as "<think>" + completion (`format.assistant_turn`)
COUNTDOWN_VERSION = "2"
COUNTDOWN_NUMBERS_VERSION = "2"
COUNTDOWN_STEPS_VERSION = "2"
COUNTDOWN_OPS_VERSION = "1"
MAX_ANSWER_CHARS = 200  # a 4-number answer is ~15 characters; far longer is no expression of the numbers
MAX_LITERAL_DIGITS = 6  # a sample's numbers are below 10**6 (checked), so a longer literal is foreign
MAX_DEPTH = 32  # parenthesis nesting; bounds the parser's recursion
MAX_THOUGHT_CHARS = 400  # a 4-number trace is ~25 characters; far longer is no trace of the numbers

_TOKEN_RE = re.compile(r"[ \t]*(?:([0-9]+)|([-+*/()]))")  # [0-9], not \d: other scripts' digits are not literals
_PRECEDENCE_OPS = (("+", "-"), ("*", "/"))
_NUMBER = "(0|[1-9][0-9]*)"  # a trace number: no sign, no leading zero, ASCII digits only
_STEP_RE = re.compile(rf"[ \t]*{_NUMBER}[ \t]*([-+*/])[ \t]*{_NUMBER}[ \t]*=[ \t]*{_NUMBER}[ \t]*")

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


def _tree_over(text: str, numbers: Sequence[int]) -> Node:
    """The syntax tree of `text` (one answer expression) when its literals are exactly `numbers`; raises
    _Reject with the reason (too_long, multiple_answers, the parser's reasons, wrong_numbers)."""
    if len(text) > MAX_ANSWER_CHARS:
        raise _Reject("too_long")
    if "\n" in text:
        raise _Reject("multiple_answers")
    tree, literals = parse(text)
    if not _uses_numbers(literals, numbers):
        raise _Reject("wrong_numbers")
    return tree


def check_expression(text: str, numbers: Sequence[int], target: int) -> str:
    """'correct', or the reason `text` (one answer expression) is not a solution of numbers -> target."""
    try:
        return "correct" if evaluate(_tree_over(text, numbers)) == target else "wrong_value"
    except _Reject as e:
        return e.reason


def check_numbers(text: str, numbers: Sequence[int]) -> str:
    """'ok', or the reason `text` (one answer expression) is not an expression over exactly `numbers`."""
    try:
        _tree_over(text, numbers)
    except _Reject as e:
        return e.reason
    return "ok"


def operators(node: Node) -> set[str]:
    """The operators of a syntax tree."""
    if isinstance(node, str):
        return set()
    op, left, right = node
    return {op} | operators(left) | operators(right)


def check_operators(text: str, numbers: Sequence[int], ops: str, uses: str = "") -> str:
    """'ok' when `text` is an expression over exactly `numbers` whose operators are all in `ops` and include every
    operator of `uses`, else the reason (`check_numbers`'s, 'other_operator' or 'missing_operator')."""
    try:
        tree = _tree_over(text, numbers)
    except _Reject as e:
        return e.reason
    found = operators(tree)
    if not found <= set(ops):
        return "other_operator"
    return "ok" if set(uses) <= found else "missing_operator"


def _chain(node: Node, op: str) -> list[Node]:
    """The operands of the maximal `op` chain rooted at `node` (a + (b + c) -> [a, b, c])."""
    if isinstance(node, str) or node[0] != op:
        return [node]
    return _chain(node[1], op) + _chain(node[2], op)


def canonical(node: Node) -> str:
    """A syntax tree written so that two writings of one solution are one string: + and * chains flattened and
    their operands sorted ((b+a)+c, a+(c+b) -> (a+b+c)), - and / kept as written, every compound in parentheses.
    Regrouping across - or / is a different solution here (a-(b-c) is not (a+c)-b), as it is a different
    first step of the task's traces."""
    if isinstance(node, str):
        return node
    op = node[0]
    if op in "+*":
        return "(" + op.join(sorted((canonical(x) for x in _chain(node, op)), key=lambda t: (len(t), t))) + ")"
    return f"({canonical(node[1])}{op}{canonical(node[2])})"


def canonical_answer(response: str, sample: Mapping[str, Any], *, think_tag: str = "think",
                     answer_tag: str = "answer") -> str | None:
    """The canonical form (`canonical`) of a completion's answer when it is an expression over exactly the
    sample's numbers, else None: what counts distinct solutions rather than distinct strings."""
    numbers, _ = _sample_problem(sample)
    segment = _answer(response, sample, think_tag, answer_tag)
    try:
        return canonical(_tree_over(segment, numbers)) if segment else None
    except _Reject:
        return None


def parse_steps(thought: str) -> list[tuple[int, str, int, int]]:
    """(left, op, right, result) of each comma-separated step of `thought`; raises _Reject("parse_error")."""
    steps = []
    for piece in thought.split(","):
        m = _STEP_RE.fullmatch(piece)
        if m is None:
            raise _Reject("parse_error")
        steps.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))))
    return steps


def step_value(left: int, op: str, right: int) -> int | None:
    """The exact value of `left op right` when it is a non-negative integer, else None."""
    if op == "+":
        return left + right
    if op == "*":
        return left * right
    if op == "-":
        return left - right if left >= right else None
    return left // right if right and left % right == 0 else None


def check_trace(thought: str, numbers: Sequence[int], first: int | None = None) -> dict[str, Any]:
    """{"reason": "ok" or why `thought` is not a valid trace over `numbers` (module docstring)}, plus
    "step" (1-based) for a step that fails and "value", the number left, for a valid trace. With `first` = k,
    only the first k steps are judged (a trace that starts right: at least k steps, each exact on available
    operands; `numbers_left` is not checked, and "value" is absent)."""
    if not thought:
        return {"reason": "no_think"}
    if len(thought) > MAX_THOUGHT_CHARS:
        return {"reason": "too_long"}
    try:
        steps = parse_steps(thought)
    except _Reject as e:
        return {"reason": e.reason}
    if len(steps) > len(numbers) - 1:
        return {"reason": "too_many_steps"}
    if first is not None and len(steps) < first:
        return {"reason": "too_few_steps"}
    available = Counter(numbers)
    for index, (left, op, right, result) in enumerate(steps[:first], start=1):
        if step_value(left, op, right) != result:
            return {"reason": "wrong_arithmetic", "step": index}
        for operand in (left, right):
            if available[operand] == 0:
                return {"reason": "unavailable_operand", "step": index}
            available[operand] -= 1
        available[result] += 1
    if first is not None:
        return {"reason": "ok"}
    left_over = +available  # drops the used-up numbers
    if sum(left_over.values()) != 1:
        return {"reason": "numbers_left"}
    return {"reason": "ok", "value": next(iter(left_over))}


def _answer(response: str, sample: Mapping[str, Any], think_tag: str, answer_tag: str) -> str:
    """The answer segment the answer rewards read (module docstring), of the whole assistant turn."""
    turn = assistant_turn(response, sample, think_tag=think_tag)
    return split_response(turn, think_tag=think_tag, answer_tag=answer_tag).answer.strip()


def _judged(response: str, sample: Mapping[str, Any], think_tag: str, answer_tag: str, check, ok: str) -> RewardResult:
    """An answer reward: `check(segment, numbers, target)` -> a reason; 1 when it is `ok`, else 0 with it."""
    numbers, target = _sample_problem(sample)
    segment = _answer(response, sample, think_tag, answer_tag)
    if not segment:
        return RewardResult(0.0, {"reason": "no_answer"})
    reason = check(segment, numbers, target)
    return RewardResult(float(reason == ok), {"reason": reason, "expression": segment[:200]})


@reward("countdown", COUNTDOWN_VERSION)
def countdown_reward(
    response: str, sample: Mapping[str, Any], *, think_tag: str = "think", answer_tag: str = "answer"
) -> RewardResult:
    """1 if the answer uses `sample["numbers"]` exactly once each and equals `sample["target"]` (module
    docstring), else 0 with `info["reason"]`: no_answer, too_long, multiple_answers, parse_error,
    unary_minus, too_deep, wrong_numbers, division_by_zero, wrong_value."""
    return _judged(response, sample, think_tag, answer_tag, check_expression, "correct")


@reward("countdown_numbers", COUNTDOWN_NUMBERS_VERSION)
def countdown_numbers_reward(
    response: str, sample: Mapping[str, Any], *, think_tag: str = "think", answer_tag: str = "answer"
) -> RewardResult:
    """1 if the answer is an expression whose literals are exactly `sample["numbers"]` (as a multiset),
    whatever its value, else 0 with `info["reason"]`: no_answer, too_long, multiple_answers, parse_error,
    unary_minus, too_deep, wrong_numbers. Nothing is evaluated, so `8/(3-3)` over 3, 3, 8 scores 1.
    `sample["target"]` is required and checked as for `countdown`, so the three rewards read the same rows."""
    return _judged(response, sample, think_tag, answer_tag, lambda a, numbers, _: check_numbers(a, numbers), "ok")


@reward("countdown_steps", COUNTDOWN_STEPS_VERSION)
def countdown_steps_reward(
    response: str, sample: Mapping[str, Any], *, think_tag: str = "think", answer_tag: str = "answer",
    first: int | None = None,
) -> RewardResult:
    """1 if the thinking is a valid trace over `sample["numbers"]` (module docstring), whatever its final
    value, else 0 with `info["reason"]`: no_think, too_long, parse_error, too_many_steps,
    wrong_arithmetic, unavailable_operand, numbers_left. `sample["target"]` is required as for `countdown`.
    `first` = k: 1 when the trace starts right, its first k steps valid (`too_few_steps` with fewer)."""
    if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 1):
        raise RewardInputError(f"countdown_steps: first must be a positive int or None, got {first!r}")
    numbers, _ = _sample_problem(sample)
    turn = assistant_turn(response, sample, think_tag=think_tag)
    thought = split_response(turn, think_tag=think_tag, answer_tag=answer_tag).thinking
    info = check_trace(thought, numbers, first)
    return RewardResult(float(info["reason"] == "ok"), info)


@reward("countdown_ops", COUNTDOWN_OPS_VERSION)
def countdown_ops_reward(
    response: str, sample: Mapping[str, Any], *, ops: str = "+*", uses: str = "", think_tag: str = "think",
    answer_tag: str = "answer",
) -> RewardResult:
    """1 if the answer is an expression over exactly `sample["numbers"]` that uses only the operators in `ops`
    (default "+*": no subtraction or division) and each operator in `uses` at least once (default none), whatever
    its value, else 0 with `info["reason"]`: no_answer, the reasons of `countdown_numbers`, other_operator,
    missing_operator. A style dimension: any attempt can meet it, a correct answer only on the problems that have a
    solution of that shape (`ops="+-*/", uses="*"`: the answer multiplies)."""
    for name, value, empty_ok in (("ops", ops, False), ("uses", uses, True)):
        if not isinstance(value, str) or (not value and not empty_ok) or set(value) - set("+-*/"):
            raise RewardInputError(f"countdown_ops: {name} must be a {'' if empty_ok else 'non-empty '}string of "
                                   f"+ - * /, got {value!r}")
    if set(uses) - set(ops):
        raise RewardInputError(f"countdown_ops: uses {uses!r} names an operator that ops {ops!r} excludes")
    return _judged(response, sample, think_tag, answer_tag,
                   lambda a, numbers, _: check_operators(a, numbers, ops, uses), "ok")
