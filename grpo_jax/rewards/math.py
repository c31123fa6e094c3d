"""Math reward: strict final-answer extraction, normalisation, and equivalence (value, then symbolic).

Why strict: a lenient extractor ("the last number anywhere") rewards answers the model never committed
to and invites hedging. Only the answer segment counts (see `format.split_response`), only explicit
commitments count (`\\boxed{}`, `####`, "the answer is", a bare answer or an `<answer>` block), and if
the commitments disagree the response scores 0. Falling back to the last number is an opt-in.

Equivalence is a cascade, cheapest first, so that the common case never touches sympy:
0. units (see "Units" below): different dimensions are not equal, different units of one dimension are
   converted;
1. normalised strings equal;
2. both are plain numbers (ints, decimals, fractions, percents, scientific notation): compared exactly
   as rationals, except that a written decimal may stand for a value that has no finite decimal
   expansion (see "Written precision" below);
3. tuples / intervals / sets: element-wise (a string counts as one only when its outer brackets enclose
   all of it: `(1,\\infty)\\cup(-\\infty,0)` is a union, not a 3-tuple);
4. a written decimal against a closed form (`3.1416` vs `\\pi`): a closed form that is an exact rational
   (`2^{100}`, `2^{64}-1`, `\\frac{2^{10}}{3}`) is evaluated exactly first and compared as a number, so
   `1.2677e30` is not `2^{100}` (a rounding of a terminating value never equals it); otherwise the
   written-precision rule on a high-precision value of the closed form;
5. symbolic, through latex2sympy2-extended and sympy, behind static size guards and a timer of
   `timeout_s` seconds of the grading thread's CPU time (at most 10x that in wall time, so load does not
   decide a verdict). The timer is SIGALRM-based and therefore only armed on the main thread (elsewhere
   the static guards alone bound the work; `info["timer"]` says which). A timeout is "not equal" with
   reason "timeout". Model text is never passed to `eval`/`sympy.parse_expr`. Unions of sets are compared
   as unordered collections after sympy merges them. An exact rational against a constant that is not
   one is never equal when sympy knows the constant is irrational (`245850922/78256779` is within 1e-12
   of pi and still not pi); when it cannot tell (`\\log_2 8`), they must agree to far more digits than
   the rational has. Two other constants must agree to 45 significant digits (`\\pi + 10^{-13}` is not
   `\\pi`; version 6 allowed 1e-12 relative on 16-digit values).

Written precision (version 2; version 1 accepted any decimal within 1e-4 relative, so `8383.6` passed
for `8383.0999` and `100.51` for `100.5`). A number is taken at face value as written:
- a value with a finite decimal expansion (an integer, a decimal, 1/2, 3/8, 25%) equals another only
  exactly: `3.0 == 3`, `100.50 == 100.5`, `1/2 == 0.5`, but `100.51 != 100.5`, `8383.6 != 8383.0999`
  and also `8383.1 != 8383.0999` (the shorter decimal is a rounding, but the gold states four places and
  nothing says it is itself rounded; the same holds the other way, `1.41421 != 1.4142`);
- a value without one (1/3, 22/7, sqrt(2), pi) can only ever be written as a rounding, so a decimal
  `d` equals it when `d` is that value rounded half away from zero at `d`'s last written place, and `d`
  carries at least MIN_SIGNIFICANT_DIGITS significant digits: `0.33333 == 1/3`, `3.1416 == pi`, but
  `0.333 != 1/3` (too coarse to tell 1/3 from 0.333) and `0.66666 != 2/3` (the last written digit is
  wrong after rounding). The minimum of 5 keeps the strictness of version 1's 1e-4 band, which is
  about 4-5 significant digits, and rejects `3.14` for pi and `2.718` for e.
Ties cannot occur (a value without a finite expansion is never exactly halfway), so the rounding mode
does not matter. math-verify instead rounds both sides at 6 decimal places (`float_rounding=6` in
math_verify 0.9 `grader.sympy_numeric_eq`), which ignores magnitude: it equates 0.00000001 and
0.00000002, and accepts no decimal of fewer than 6 places for 1/3. Decimals inside expressions (`0.5x`,
`1.5\\pi`) are also read as the exact rationals they spell.
`rel_tol` (default None) is an opt-in extra: a decimal within that relative distance also counts.

Units. A unit after a value is split off and compared, never just dropped (dropping it would make
`5\\text{ m}` equal `5 cm` and `4s` equal 4):
- the same unit on both answers, or a unit on one only: the values are compared. A bare number is read in
  the other answer's unit (gold `5\\text{ m}` accepts `5`): this reward grades the value, and golds
  often carry a unit the question already fixed (`10\\text{ inches}` for "how many inches");
- units of one dimension (length, mass, time, volume, area, speed, money, months/years, and what SI symbols
  measure): converted with exact factors, then compared (`500 cm == 5 m`, `2 h == 120 min`, `0.33333 h ==
  20 min` by written precision in hours, `5 kPa == 5000 Pa`, `5 J == 5 N m`). The table and its parser are
  shared with the science reward (`units.py`); unit names are read in any case (`5 CM`), SI symbols as written;
- different dimensions (`5 kg`, `5 m`), or two different `\\text{}` labels (`5 apples`, `5 oranges`): not equal.
Letters written against the number (`4s`, `12cm`) are a unit only when the other answer has a unit of the
same dimension (`4 s`, `4000 ms`); otherwise they are letters, so `4s` is 4 times s, not 4. So is a unit that
only SI symbols spell, wherever it is written (`2 V`, `5 nm`, `5\\text{ kPa}`: single letters and short
symbols are often variables): against an answer without a unit of its dimension it is read as before they
were units, as letters (`\\frac{1}{2} V == \\frac{V}{2}`, `2 V != 2`) or a `\\text{}` label. A degree sign
after a plain number is a unit (`90^\\circ == 90`); inside an expression it converts to radians
(`\\cos 30^\\circ` is cos(pi/6), not cos(30)). An angle in degrees is not compared with one in radians.

Percent. A % is read once (reading it both as a number and as a fraction on both sides would make
`0.5\\% == 50\\%` through 0.5). A % on both answers or on neither: the numbers are compared as written. A %
on one answer only: its number of percent or the fraction it stands for, so gold `50\\%` accepts `50\\%`,
`50%`, `50` (the number without its sign, as a bare number is read in a unit) and `0.5` (the same quantity
as a fraction, which is what 50% means), but never `0.5\\%`.

Approximate answers. An answer that says it is a rounding (`\\approx 3.14`, `x \\approx 3.14`, "about 12",
"approximately 3.1416") is its value, flagged; in `\\frac{1}{3} \\approx 0.333` the exact value is the answer.
A flagged reference is a rounding at its last written place: a prediction matches when it rounds to it
there and is written at least as finely (`3.14159` and `\\pi` for `\\approx 3.14`; not `3.1`). A flagged
prediction matches a reference written as a decimal in the same way at the reference's places (about
`3.1416` for `3.14`); against an integer, a fraction or a closed form the flag adds nothing: `\\approx 5` is
not `4.8`, and `\\approx 3.14` is not `\\pi` (too coarse, as without the flag).

Spelling. Unicode is read as the LaTeX it stands for (`x²`, `10⁻³`, `x₁`, `½`, `2½`, `–5` with an en or em
dash, `∞`, `≈`, `ℝ`, `∪`, `′`), and Python's digit separators in groups of three (`1_000_000`). A space is
deleted inside digit groups (`1 000 000`, `1\\,000`: a first group of 1-3 digits, then groups of three) and
kept between any other two digits, so `3 4` and `5 \\quad 6` are not 34 and 56 (nor 7, as the LaTeX parser
would add them). A row break `\\\\` is never read as a control space `\\ ` (MATH spaces its matrices
`1 & 2 \\\\ 3 & 4`). A whole number then a proper fraction is a mixed number (`1 1/2`, `1\\frac{1}{2}`,
`-1\\frac{1}{2}` are 3/2 and -3/2; `x\\frac{1}{2}` is x/2 and `2 3/2` no mixed number). Degrees, minutes and
seconds are the exact number of degrees (`30^\\circ 15'` is 30.25 degrees, `30°10′` is 181/6). In a chain of
equalities the last value is the answer (`x = 3 + 2 = 5` and `3 + 2 = 5` are 5; `x + y = 5` is an equation).

Bases. A number with a base subscript (`12_4`, `12_{4}`, `1011_{(2)}`) keeps its digits and base: two such
numbers are equal only in the same base with the same digits (`12_4 != 12_3`, and `13_4 != 21_3`, the same
value in another base), and against a plain number only when it is the digits alone (`12` for `12_4`, the
subscript left out; `6`, its value in base ten, is not the number asked for).

Structure. Named values match by name: `x=2, y=3` equals `y=3, x=2` and not `x=3, y=2`; against
an unnamed tuple they are taken in the alphabetical order of their names (`x=2, y=3` equals `(2,3)`). An
inequality in one variable is the set it describes: `3<x`, `x>3.0`, `(3,\\infty)` and `x\\in(3,\\infty)` are
one answer, and `x<3 or x>5` a union. A one-element set equals its element (`\\{5\\} == 5`, `{5}` is a TeX
group); `\\emptyset`, `\\varnothing` and `\\{\\}` are one set. A name in front of a value is dropped (`x = 5`,
`f(x) = x^2`). `i` is the imaginary unit, not a variable. A repeating decimal is the fraction it is
(`0.\\overline{3} == 1/3`). A letter followed by digits is one name (`z1` is z_1, never z times 1). Sets of
reals may be written as intervals, inequalities (`|x| \\ge 1`, `|x-2| < 3`: absolute values of low degree are
solved too), set-builder sets (`\\{x \\mid x > 2\\}`, `\\{x \\in \\mathbb{R} : x < -1\\}` are their conditions),
`\\mathbb{R}` and `\\mathbb{R} \\setminus \\{0, 1\\}` (the union of the intervals between the removed numbers).
"""

from __future__ import annotations

import functools
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, NamedTuple

from grpo_jax.rewards import units
from grpo_jax.rewards.base import RewardInputError, RewardResult, as_str_list, require, reward
from grpo_jax.rewards.format import assistant_turn, split_response
from grpo_jax.rewards.units import NO_UNIT, Unit

MATH_VERSION = "7"  # 2: written-precision rule, `**`/`^` exponents read whole, unions; 3: values past the
# float range compared in mpmath (v2 called 575! equal to any number: inf <= 1e-12 * inf), exact numbers exactly;
# 4: units compared and converted, % read once, names matched, inequalities as sets, degrees in trig, i, z1;
# 5: a think_prefilled row is read as "<think>" + completion (no </think>: all thinking, no answer);
# 6: one unit table with science (units.py): SI symbols with prefixes (kPa, J, N, W, Hz, C, V, mol, eV, nm, mA)
# convert when both answers carry a unit of one dimension (5 kPa == 5000 Pa, 5 J == 5 N m; v5: not equal),
# and `5\text{ mPa}` is no longer `5\text{ MPa}` (v5 read both as the label "mpa"); against an answer without
# a unit of its dimension such a unit is read as in v5 (letters, or a \text{} label)
# 7: exact powers and sums evaluated before the written-precision rule (2^{100} != 1.2677e30), exact rationals
# against irrational constants compared exactly (no 1e-12 band), spaces kept between digits except inside digit
# groups ('3 4' != 34), base subscripts kept (12_4 != 12_3); Unicode forms, matrix row breaks, chained equalities,
# mixed numbers, degrees-minutes, \mathbb{R}\setminus, |x| inequalities, set-builder sets, and approximate answers;
# the symbolic timer counts the grading thread's CPU time (a loaded machine timed out finite comparisons)

MAX_SYMBOLIC_CHARS = 300  # longer expressions are judged by string/number rules only
MAX_NUMBER_DIGITS = 400  # longer digit runs are compared as canonical digit strings
MAX_EXPONENT = 1000  # |exponent| above this is never handed to sympy (10^{10^{10}} would hang in C)
MAX_DISTINCT_ANSWERS = 16  # more distinct commitments than this is hedging, not spelling variants
MAX_POWER_TEXT = 1000  # longer answers: `**` becomes `^` without reading Python's exponent grammar
MAX_POWER_NESTING = 20  # deeper `**` towers / parenthesised exponents fall back to a bare `^`
MIN_SIGNIFICANT_DIGITS = 5  # a decimal must carry this many to stand for 1/3, sqrt(2), pi (see above)
MAX_INEQUALITY_DEGREE = 2  # inequalities of higher degree are compared as written, not solved
MAX_RATIONAL_DIGITS = 1000  # a rational against a constant is compared to at most this many digits
# Two constants that are not rationals (pi + 10^{-13} against pi) are compared on CONSTANT_DIGITS-digit values
# within CONSTANT_TOLERANCE relative: v6's 1e-12 on 53-bit values called pi + 10^{-13} equal to pi.
CONSTANT_DIGITS = 60
CONSTANT_TOLERANCE = 1e-45

# ------------------------------------------------------------------------------------ extraction

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
# The look-ahead keeps overlapping statements findable; its bounded length keeps a response made of
# thousands of "answer is" linear rather than quadratic.
_ANSWER_IS_RE = re.compile(r"(?i)\b(?:final\s+answer|answer)\s*(?:is|:|=)[ \t]*:?[ \t]*(?=([^\n]{0,500}))")
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_COMMITTED_START_RE = re.compile(  # also Unicode dashes, infinity and vulgar fractions ('-5' with an en dash, '½')
    r"[-+\u2212\u2013\u2014\u221e\u00bc-\u00be\u2150-\u215e$\\(\[{0-9.]|[A-Za-z]\s*=|[A-Za-z]\s*$|[A-Za-z][.)]?\s*$"
    r"|(?:about|approximately|roughly)\s+[-+$\\0-9.]"  # "the answer is about 12": 12, flagged approximate
)


class Extraction(NamedTuple):
    """Final-answer candidates found in an answer segment and which rule found them."""

    candidates: list[str | None]  # None marks an unbalanced \boxed{
    source: str  # committed (\boxed, ####, "the answer is") | bare | last_number | none


def _brace_block(text: str, start: int) -> tuple[str | None, int]:
    """Content of the balanced `{...}` starting at `text[start] == '{'` and the index after it.

    Escaped braces (`\\{`) do not count. Unbalanced -> (None, len(text)) so callers skip the rest.
    """
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None, len(text)


def boxed_contents(text: str) -> list[str | None]:
    """Contents of every outermost `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`), None if unbalanced."""
    out: list[str | None] = []
    pos = 0
    for m in _BOXED_RE.finditer(text):
        if m.start() < pos:  # nested inside the previous box
            continue
        i = m.end()
        if i < len(text) and text[i] == "{":
            content, pos = _brace_block(text, i)
            out.append(content)
        else:
            token = re.match(r"[^\s$]*", text[i:])
            out.append(token.group(0) if token else "")
            pos = i
    return out


# `**` between an operand and an exponent, spaced alike on both sides, is Python's power operator
# (`x**31`, `2**-3`, `(a+b)**(n+1)`, `x ** 2`); any other `**` is Markdown bold (`**42**`, `**42** because`,
# whose markers have a space on one side only) and is dropped.
_STARS_RE = re.compile(r"\*\*")
_EXPONENT_START = r"(?:[\w(\\{]|[-+.]\d)"
_POWER_STARS_RE = re.compile(rf"(?<=[\w)\]}}])\*\*(?={_EXPONENT_START})|(?<=[\w)\]}}] )\*\*(?= {_EXPONENT_START})")


def strip_markdown_bold(text: str) -> str:
    """Drop Markdown `**bold**` markers but keep Python-style powers: '**x**31' -> 'x**31'."""
    powers = {m.start() for m in _POWER_STARS_RE.finditer(text)}
    return _STARS_RE.sub(lambda m: m.group(0) if m.start() in powers else "", text)


def cut_answer_tail(tail: str) -> str | None:
    """The committed answer at the start of the text after "the answer is", or None if it is prose."""
    tail = strip_markdown_bold(tail).strip()
    if not tail or not _COMMITTED_START_RE.match(tail):
        return None
    for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if tail.startswith(opener):
            end = tail.find(closer, len(opener))
            return tail[len(opener) : end] if end >= 0 else tail[len(opener) :]
    cut = re.search(r"[.;](?=\s|$)|,\s+(?=[A-Za-z])|\s+(?:because|since|as|which|so|and)\b", tail)
    return tail[: cut.start()] if cut else tail


def _is_bare_answer(segment: str) -> bool:
    """A short answer segment with no prose words, e.g. '42', '$\\frac{1}{2}$', 'x = 3'."""
    if not segment or len(segment) > 64:
        return False
    without_commands = re.sub(r"\\[A-Za-z]+", " ", segment)
    return re.search(r"[A-Za-z]{2,}", without_commands) is None


def extract_answers(segment: str, *, fallback_last_number: bool = False) -> Extraction:
    """Every committed final answer in an answer segment (strict rules; see the module docstring)."""
    boxes = boxed_contents(segment)
    hashes = [m.group(1).strip() for m in _HASH_RE.finditer(segment)]
    stated = []
    for m in _ANSWER_IS_RE.finditer(segment):
        tail = cut_answer_tail(m.group(1))
        if tail is not None and "\\boxed" not in tail and "\\fbox" not in tail:
            stated.append(tail)  # "the answer is \boxed{5}": the box is already a candidate
    committed = boxes + hashes + stated
    if committed:
        return Extraction(committed, "committed")
    bare = segment.strip().rstrip(".").strip()
    if _is_bare_answer(bare):
        return Extraction([bare], "bare")
    if fallback_last_number:
        numbers = _NUMBER_RE.findall(segment)
        if numbers:
            return Extraction([numbers[-1]], "last_number")
    return Extraction([], "none")


# ------------------------------------------------------------------------------------ normalisation

_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
# A row break `\\` is matched first so that its second backslash is never read as a control space (`\ `):
# MATH writes matrices as `1 & 2 \\ 3 & 4`, and reading `\ ` there would glue the rows together.
_SPACING_RE = re.compile(
    r"\\\\|\\[,;:! ]|\\(?:quad|qquad|displaystyle|left|right|big|Big|bigg|Bigg)(?![A-Za-z])|~"
)
_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# 'x =', 'a_n =', 'f(x) =', 'g(s, t) :' in front of a value: the name is dropped, the value compared
_NAME_PREFIX_RE = re.compile(
    r"^[A-Za-z](?:_\s*\{?[A-Za-z0-9]+\}?)?(?:\s*\(\s*[A-Za-z](?:\s*,\s*[A-Za-z])*\s*\))?\s*[=:]\s*"
)


class Normalized(NamedTuple):
    """A normalised answer: `text` without its unit or %, `percent` whether a % was stripped, `unit` the
    unit stripped after the value, and `otherwise` the answer as read without that unit, used unless the
    other answer has a unit of the same dimension: the letters of a unit written against the number ('4s'),
    or the reading before SI symbols were units ('2 V' as letters, '5\\text{ kPa}' as a label). `approximate`:
    the answer says it is a rounding ('\\approx 3.14', 'about 12'; see "Approximate answers" in the module
    docstring)."""

    text: str
    percent: bool
    unit: Unit | None = None
    otherwise: Normalized | None = None
    approximate: bool = False


def _unwrap(s: str, prefix: str) -> str:
    """'\\boxed{X}' -> 'X' when the wrapper spans the whole string."""
    if s.startswith(prefix) and s.endswith("}"):
        content, end = _brace_block(s, len(prefix) - 1)
        if content is not None and end == len(s):
            return content
    return s


# ------------------------------------------------------------------------------------ units

# The unit table and its parser are shared with the science reward (units.py); this reward reads a word's
# case loosely (`fold_case=True`: 'CM' and 'Mm' are centimetres and millimetres, 'kPa' is kilopascals).
_UNITS = units.NAMES  # the unit names, lower case (the SI symbols are read by units.si_symbol)
_DEGREE_UNITS = {  # a degree sign alone is an angle; with C or F a temperature, and the two scales do not convert
    "": units.DEGREE,
    "C": units.CELSIUS,
    "F": units.FAHRENHEIT,
}
MAX_UNIT_TEXT = 200  # longer answers are not searched for a unit (the search is quadratic in the worst case)
_TEXT_GROUP = r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}"
# A value ending in a digit or '}', then a tail that starts with a word or a \text group and holds only
# words, \text groups, '/', '*', \cdot and small powers: '5\text{ cm}', '3 km/h', '6 cm^2', '4s'.
_UNIT_TAIL_RE = re.compile(
    rf"(?P<head>.*?[\d}}])(?P<gap>\s*)"
    rf"(?P<tail>(?:{_TEXT_GROUP}|[A-Za-z])(?:{_TEXT_GROUP}|\\cdot|[A-Za-z/*\s]|\^\s*\{{?\s*-?\d\s*\}}?)*)"
)
_DEGREE_TAIL_RE = re.compile(
    r"(?P<head>.*?)\^\{\\circ\}\s*(?:\\(?:text|mathrm|mbox)\s*\{\s*)?(?P<scale>[CF]?)\s*\}?\s*"
)
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)|[-+]?\\[dt]?frac\{\d+\}\{\d+\}|[-+]?\d+/\d+")


def parse_unit(text: str) -> Unit | None:
    """The unit a text names, as this reward reads case: 'cm', 'km/h', 'm/s^2', 'miles per hour', 'kPa'
    (units.parse_unit). None when any word is not a known unit; NO_UNIT for 'units' / 'square units'."""
    return units.parse_unit(text, fold_case=True)


def _label_unit(tail: str) -> Unit | None:
    """A unit of its own for a word in \\text{} that is not a known unit ('5\\text{ apples}'), else None.

    Two answers with labels must name the same one ('apple' and 'apples' do); a bare number matches any."""
    m = re.fullmatch(r"\\(?:text|mbox)\s*\{\s*([A-Za-z]{2,}(?:\s+[A-Za-z]+)*)\s*\}\s*", tail)
    if m is None:
        return None
    label = " ".join(w.lower().removesuffix("s") for w in m.group(1).split())
    return Unit(((f"label:{label}", 1),), Fraction(1))


def _is_constant(head: str) -> bool:
    """A value with no variable in it ('5', '\\frac{3}{4}', '2\\sqrt{3}', 'x = 5'): a unit may follow it."""
    value = _NAME_PREFIX_RE.sub("", head.strip())
    return re.search(r"\d", value) is not None and re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", value)) is None


def split_unit(s: str) -> tuple[str, Unit | None, tuple[str, Unit | None] | None]:
    """(value, unit, otherwise) for a prepared answer: '5\\text{ cm}' -> ('5', cm, None), '90^{\\circ}' ->
    ('90', degree, None). `otherwise` is (value, unit) as read when the other answer has no unit of the same
    dimension: '4s' -> ('4', s, ('4s', None)), the letters touch the number, so they may be a variable.

    A degree sign is a unit only after a plain number (in `\\cos 30^{\\circ}` it converts 30 to radians,
    which the parser does); other units follow any constant. Unknown words are not units, except one
    \\text{} label. 'units' states no unit: ('12', None, None) for '12 square units'. A unit that only SI
    symbols spell ('2 V', '5 nm', '5\\text{ kPa}': no unit name) is read as one only against a unit of its
    dimension, otherwise as this reward read it before SI symbols were units (letters, or a \\text{} label)."""
    if len(s) > MAX_UNIT_TEXT:
        return s, None, None
    m = _DEGREE_TAIL_RE.fullmatch(s)
    if m and _PLAIN_NUMBER_RE.fullmatch(_NAME_PREFIX_RE.sub("", m.group("head").strip())):
        return m.group("head").strip(), _DEGREE_UNITS[m.group("scale")], None
    m = _UNIT_TAIL_RE.fullmatch(s)
    if m is None or not _is_constant(m.group("head")):
        return s, None, None
    head, tail = m.group("head").strip(), m.group("tail")
    named = units.parse_unit(tail, fold_case=True, symbols=False)
    if named is not None:
        glued = not m.group("gap") and not tail.startswith("\\") and named != NO_UNIT
        return head, (None if named == NO_UNIT else named), ((s, None) if glued else None)
    label = _label_unit(tail)
    before = (head, label) if label is not None else (s, None)  # the reading without SI symbols
    symbol = parse_unit(tail)
    if symbol is not None and symbol != NO_UNIT:
        return head, symbol, before
    return (*before, None)


def _fix_frac_sqrt(s: str) -> str:
    """Canonical LaTeX spellings: \\dfrac/\\tfrac -> \\frac, \\frac12 -> \\frac{1}{2}, \\sqrt2 -> \\sqrt{2}."""
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\{)", r"\\frac{\1}\2", s)
    s = re.sub(r"\\sqrt\s*(\d+|[A-Za-z](?![A-Za-z]))", r"\\sqrt{\1}", s)
    return s


_POWER_ATOM_RE = re.compile(r"\s*([-+]?)\s*(\d+(?:\.\d+)?|[A-Za-z]+|\\[A-Za-z]+)?")


def _paren_group_end(s: str, start: int) -> int | None:
    """Index just after the `)` that closes the `(` at `s[start]`, or None if it never closes."""
    depth = 0
    for i in range(start, len(s)):
        depth += {"(": 1, ")": -1}.get(s[i], 0)
        if depth == 0:
            return i + 1
    return None


def _power_operand(s: str, start: int, depth: int) -> tuple[str, int] | None:
    """The exponent of a Python `**` whose operand starts at `s[start]` (in LaTeX), and the index after it.

    Python's grammar (`power: primary '**' u_expr`) takes a signed primary: a number, a name, a call
    `name(...)` or a parenthesised group, whose outer parentheses are dropped: '(n+1)' -> 'n+1'; and
    `**` groups to the right: '2**3**2' is 2**(3**2). None when nothing sensible follows (then `**`
    becomes a bare `^`, read as LaTeX reads it), also past MAX_POWER_NESTING levels of nesting.
    """
    if depth > MAX_POWER_NESTING:
        return None
    m = _POWER_ATOM_RE.match(s, start)
    sign, atom, end = m.group(1), m.group(2), m.end()
    if atom is None:
        if end >= len(s) or s[end] != "(":
            return None
        close = _paren_group_end(s, end)
        if close is None:
            return None
        atom, end = _powers_to_latex(s[end + 1 : close - 1], depth + 1), close
    elif atom[0].isalpha() and end < len(s) and s[end] == "(":  # a call: sqrt(2), sin(x)
        close = _paren_group_end(s, end)
        if close is None:
            return None
        atom, end = atom + _powers_to_latex(s[end:close], depth + 1), close
    tower = re.match(r"\s*\*\*", s[end:])
    if tower:
        inner = _power_operand(s, end + tower.end(), depth + 1)
        if inner is not None:
            atom, end = atom + "^{" + inner[0] + "}", inner[1]
    return sign + atom, end


def python_powers_to_latex(s: str) -> str:
    """Python powers in LaTeX with the whole exponent braced: 'x**31' -> 'x^{31}' (not x^3 times 1).

    Texts longer than MAX_POWER_TEXT (never judged symbolically) get a plain `**` -> `^`, which bounds
    the work (finding closing parentheses is linear per `**`); `normalize_answer` still reads a digit
    run after `^` whole, so `x**31` stays x^{31} there too."""
    if len(s) > MAX_POWER_TEXT:
        return s.replace("**", "^")
    return _powers_to_latex(s, 0)


def _powers_to_latex(s: str, depth: int) -> str:
    out, i = [], 0
    while (j := s.find("**", i)) >= 0:
        operand = _power_operand(s, j + 2, depth)
        if operand is None:
            out.append(s[i:j] + "^")
            i = j + 2
        else:
            out.append(s[i:j] + "^{" + operand[0] + "}")
            i = operand[1]
    return "".join(out) + s[i:]


_UNICODE_SYMBOLS = {
    **dict.fromkeys("\u2212\u2010\u2011\u2012\u2013\u2014\ufe63\uff0d", "-"),  # minus sign, hyphens, en/em dash
    "\u00d7": "\\times ",
    "\u00b7": "\\cdot ",
    "\u03c0": "\\pi ",
    "\u2264": "\\le ",
    "\u2265": "\\ge ",
    "\u2260": "\\ne ",
    "\u2205": "\\emptyset ",
    "\u221e": "\\infty ",
    "\u2248": "\\approx ",
    "\u222a": "\\cup ",
    "\u2229": "\\cap ",
    "\u2208": "\\in ",
    "\u2216": "\\setminus ",
    "\u211d": "\\mathbb{R}",
    "\u00b1": "\\pm ",
    "\u2044": "/",  # fraction slash
    "\u2032": "'",  # prime (minutes)
    "\u2033": "''",  # double prime (seconds)
}
_SUPERSCRIPTS = str.maketrans(
    "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b\u207a", "0123456789-+"
)
_SUBSCRIPTS = str.maketrans("\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089", "0123456789")
_SUPERSCRIPT_RUN_RE = re.compile("[\u2070\u00b9\u00b2\u00b3\u2074-\u2079\u207b\u207a]+")
_SUBSCRIPT_RUN_RE = re.compile("[\u2080-\u2089]+")
_VULGAR_FRACTIONS = {
    "\u00bd": (1, 2), "\u2153": (1, 3), "\u2154": (2, 3), "\u00bc": (1, 4), "\u00be": (3, 4), "\u2155": (1, 5),
    "\u2156": (2, 5), "\u2157": (3, 5), "\u2158": (4, 5), "\u2159": (1, 6), "\u215a": (5, 6), "\u2150": (1, 7),
    "\u215b": (1, 8), "\u215c": (3, 8), "\u215d": (5, 8), "\u215e": (7, 8), "\u2151": (1, 9), "\u2152": (1, 10),
}  # fmt: skip
_VULGAR_RE = re.compile("[" + "".join(_VULGAR_FRACTIONS) + "]")
# Python's digit separators in groups of three ('1_000_000'); a base subscript ('12_4') has no group of three
_UNDERSCORE_GROUPS_RE = re.compile(r"(?<![\w.])\d{1,3}(?:_\d{3})+(?![\w.])")


def _unicode_to_latex(s: str) -> str:
    """Unicode math in LaTeX spelling: 'x²' -> 'x^{2}', '10⁻³' -> '10^{-3}', 'x₁' -> 'x_{1}',
    '½' -> '\\frac{1}{2}' ('2½' -> '2\\frac{1}{2}', a mixed number), '–5' (an en dash) -> '-5',
    '∞' -> '\\infty'."""
    if s.isascii():
        return s
    for a, b in _UNICODE_SYMBOLS.items():
        s = s.replace(a, b)
    s = _SUPERSCRIPT_RUN_RE.sub(lambda m: "^{" + m.group(0).translate(_SUPERSCRIPTS) + "}", s)
    s = _SUBSCRIPT_RUN_RE.sub(lambda m: "_{" + m.group(0).translate(_SUBSCRIPTS) + "}", s)
    return _VULGAR_RE.sub(lambda m: "\\frac{%d}{%d}" % _VULGAR_FRACTIONS[m.group(0)], s)


def _plain_to_latex(s: str) -> str:
    """Plain-text math (sqrt(2), pi, **, unicode, 1_000) in LaTeX spelling, so one parser handles both."""
    s = python_powers_to_latex(s)
    s = _unicode_to_latex(s)
    s = _UNDERSCORE_GROUPS_RE.sub(lambda m: m.group(0).replace("_", ""), s)
    s = s.replace("\u221a", "\\sqrt")
    s = re.sub(r"(?<![A-Za-z\\])sqrt\s*\(([^()]*)\)", r"\\sqrt{\1}", s)
    s = re.sub(r"(?<![A-Za-z\\])pi(?![A-Za-z])", r"\\pi ", s)
    s = re.sub(r"(?<![A-Za-z\\])(?:infinity|inf)(?![A-Za-z])", r"\\infty ", s)
    return s


def normalize_answer(answer: str) -> Normalized:
    """Canonical string form of an answer (see the module docstring for the rules and why).

    Memoised for short answers: a rollout repeats the same few answers and references many times, and
    the regex passes dominate the reward's cost on plain numbers."""
    if len(answer) <= _CACHEABLE_CHARS:
        return _normalize_cached(answer)
    return _normalize(answer)


def _normalize(answer: str) -> Normalized:
    s, approximate = approximate_flag(_prepare(answer))
    head, unit, otherwise = split_unit(s)
    text, percent = _canonical(head)
    if otherwise is None:
        return Normalized(text, percent, unit, None, approximate)
    other = Normalized(_canonical(otherwise[0])[0], percent, otherwise[1], None, approximate)
    return Normalized(text, percent, unit, other, approximate)


_normalize_cached = functools.lru_cache(maxsize=65536)(_normalize)
_DEGREE_MARK_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree(?![A-Za-z])|\u00b0")
_CONNECTIVE_RE = re.compile(r"\s*\\(?:text|mbox)\s*\{\s*(?:or|and)\s*\}\s*|\s+(?:or|and)\s+")


def _prepare(answer: str) -> str:
    """Wrappers, delimiters and spacing removed, plain text in LaTeX spelling, one spelling of the degree
    sign ('^{\\circ}'), and 'or' / 'and' between values as a comma ('x=2 \\text{ or } x=3' lists two)."""
    s = answer.strip()
    for wrapper in ("\\boxed{", "\\fbox{"):
        s = _unwrap(s, wrapper).strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    s = s.replace("\\[", "").replace("\\]", "").replace("{,}", "")
    s = _plain_to_latex(s)
    s = _SPACING_RE.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s).strip()
    s = _CONNECTIVE_RE.sub(",", s)
    s = _DEGREE_MARK_RE.sub(lambda _: "^{\\circ}", s)
    s = _DEGREES_MINUTES_RE.sub(_degrees_minutes, s)
    return s.rstrip(".").strip()


_NUMERAL = rf"(?<![\d.])\d{{1,{MAX_NUMBER_DIGITS}}}(?:\.\d{{1,{MAX_NUMBER_DIGITS}}})?(?![\d.])"  # bounded for int()
_PRIME = r"(?:'|\^\s*\{?\s*\\prime\s*\}?)"
_DOUBLE_PRIME = r"(?:''|\"|\^\s*\{?\s*\\prime\s*\\prime\s*\}?)"
_DEGREES_MINUTES_RE = re.compile(
    rf"(?P<sign>[-+]?)(?P<deg>{_NUMERAL})\^\{{\\circ\}}\s*(?P<min>{_NUMERAL})\s*{_PRIME}(?!')"
    rf"(?:\s*(?P<sec>{_NUMERAL})\s*{_DOUBLE_PRIME})?"
)


def _degrees_minutes(m: re.Match[str]) -> str:
    """An angle in degrees, minutes and seconds as the exact number of degrees it is: 30°15' -> 121/4°."""
    value = Fraction(m.group("deg")) + Fraction(m.group("min")) / 60 + Fraction(m.group("sec") or 0) / 3600
    number = str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    return f"{'-' if m.group('sign') == '-' else ''}{number}^{{\\circ}}"


_NAME = r"[A-Za-z](?:_\s*\{?[A-Za-z0-9]+\}?)?"
_APPROX_WORD_RE = re.compile(
    r"(?:\\(?:text|mbox)\s*\{\s*)?(?:about|approximately|approx\.?|roughly|around|nearly)(?:\s*\})?\s*(?=[-+\d.\\])",
    re.IGNORECASE,
)
_APPROX_SIGN_RE = re.compile(r"\\approx(?![A-Za-z])")


def approximate_flag(s: str) -> tuple[str, bool]:
    """(the value, whether the answer says it is approximate) for a prepared answer.

    'about 12', '\\approx 3.14' and 'x \\approx 3.14' are 12 and 3.14, flagged approximate; in
    '\\frac{1}{3} \\approx 0.333' the exact value before the sign is the answer, not its rounding."""
    m = _APPROX_WORD_RE.match(s)
    if m:
        return s[m.end() :].strip(), True
    m = _APPROX_SIGN_RE.search(s)
    if m is None:
        return s, False
    before, after = s[: m.start()].strip(), s[m.end() :].strip()
    if not before or re.fullmatch(rf"{_NAME}\s*=?", before):
        return after, True
    return before, False


def _canonical(s: str) -> tuple[str, bool]:
    """(canonical text, had a trailing %) of a prepared answer whose unit is already split off."""
    percent = bool(re.search(r"\\?%\s*$", s))
    s = re.sub(r"\\?%\s*$", "", s).strip()
    s = re.sub(r"\\?%", "", s) if percent else s
    s = _TEXT_CMD_RE.sub(r"\1", s)
    s = _fix_frac_sqrt(s)
    s = _repeating_decimals(s)
    s = _empty_set_and_grouping(s)
    s = _NAME_VALUE_RE.sub("", s)  # 'x = 5', 'f(x) = x^2' -> the value
    s = _last_of_chain(s)  # 'x = 3 + 2 = 5' -> '5'
    base = _base_literal(s)
    if base is not None:
        return base, percent
    s = _set_notation(s)
    s = re.sub(r"\^\s*(-?\d+(?:\.\d+)?|-?[A-Za-z])", r"^{\1}", s)  # 'x^31' is x^{31}, as math-verify reads it
    s = re.sub(r"_\s*([A-Za-z0-9])", r"_{\1}", s)  # '\log_2 8' must not become '\log_28'
    s = _GLUED_INDEX_RE.sub(_glued_index, s)
    s = re.sub(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])", "\\1\x00", s)  # keep '\pi r' from becoming '\pir'
    s = _SPACED_UNIT_RE.sub("\x00", s)  # '(3 cm, 4 cm)': each part keeps its unit apart from its number
    s = _MIXED_NUMBER_RE.sub(_mixed_number, s)  # '1 1/2', '1\frac{1}{2}' -> '\frac{3}{2}'
    s = _spaced_digits(s)  # '1 000 000' -> '1000000'; '3 4' keeps a space: it is not 34
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    s = s.lstrip("+") if re.match(r"\+[\d.]", s) else s
    return s.rstrip("."), percent


_NAME_VALUE_RE = re.compile(_NAME_PREFIX_RE.pattern + r"(?=[^=]*$)")  # only where one '=' follows
_EQUALS_RE = re.compile(r"(?<![<>!=\\])=(?!=)")  # an '=', not part of <=, >=, !=, ==


def _last_of_chain(s: str) -> str:
    """The last value of a chain of equalities ('x = 3 + 2 = 5' -> '5', 'a = b = 7' -> '7', and '3 + 2 = 5',
    whose left side is a computation with no variable): '=' outside brackets and no comma there (a list of
    equations 'x=1, y=2' is not a chain). One '=' after a variable is an equation ('x + y = 5'), kept."""
    depth, equals, comma = 0, [], False
    for i, c in enumerate(s):
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        if depth == 0 and c == ",":
            comma = True
        elif depth == 0 and _EQUALS_RE.match(s, i):
            equals.append(i)
    left_has_variable = bool(equals) and re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", s[: equals[0]])) is not None
    if not equals or comma or (len(equals) == 1 and left_has_variable):
        return s
    return s[equals[-1] + 1 :].strip() or s


# A number with a base subscript: '12_4', '12_{4}', '1011_{(2)}', '{1A}_{16}'. Its digits and base are kept
# (see "Bases" in the module docstring): dropping the subscript made 12_4 equal 12_3.
_BASE_LITERAL_RE = re.compile(r"\{?([0-9][0-9A-Za-z]*)\}?_\s*\{?\s*\(?\s*(\d{1,2})\s*\)?\s*\}?")
_BASE_CANONICAL_RE = re.compile(r"([0-9][0-9A-Z]*)_\{\((\d+)\)\}")  # as _base_literal writes it: no name is spelt so


def _base_literal(s: str) -> str | None:
    """'12_{(4)}' for '12_4' (digits upper-cased, leading zeros dropped), or None if `s` is no such number.

    The base is written in parentheses so that no other normalised answer has this form ('z1' is 'z_{1}')."""
    m = _BASE_LITERAL_RE.fullmatch(s.strip())
    if m is None or not 2 <= int(m.group(2)) <= 36:
        return None
    digits = m.group(1).upper().lstrip("0") or "0"
    return f"{digits}_{{({int(m.group(2))})}}"


def bases_equal(a: str, b: str) -> bool | None:
    """Two answers of which at least one has a base subscript (None when neither has). Equal when both are
    the same digits in the same base, or one is the digits alone ('12' for '12_4', the subscript left out);
    the same value in another base, or in base ten, is not the number asked for ('6' is not '12_4')."""
    ma, mb = _BASE_CANONICAL_RE.fullmatch(a), _BASE_CANONICAL_RE.fullmatch(b)
    if ma is None and mb is None:
        return None
    if ma is not None and mb is not None:
        return ma.groups() == mb.groups()
    literal, other = (ma, b) if ma is not None else (mb, a)
    digits = (other.upper().lstrip("0") or "0") if re.fullmatch(r"[0-9A-Za-z]+", other) else None
    return digits == literal.group(1)


_REALS = r"\\mathbb\s*\{?\s*R\s*\}?"
_SET_BUILDER_RE = re.compile(
    rf"\\\{{\s*(?P<var>[A-Za-z])\s*(?:\\in\s*{_REALS}\s*)?(?:\\mid|\\vert|\||:)\s*(?P<cond>.+?)\s*\\\}}"
)
_REALS_MINUS_RE = re.compile(
    rf"(?P<head>(?:[A-Za-z]\s*\\in\s*)?){_REALS}\s*(?:\\setminus|\\backslash|-)\s*\\\{{(?P<items>.+)\\\}}"
)
_REALS_RE = re.compile(rf"(?P<head>(?:[A-Za-z]\s*\\in\s*)?){_REALS}")


def _set_notation(s: str) -> str:
    """Sets of reals in the interval notation the comparison reads: a set-builder '\\{x \\mid x > 2\\}' is
    its condition 'x > 2' (an inequality is the set it describes), '\\mathbb{R}' is '(-\\infty,\\infty)', and
    '\\mathbb{R} \\setminus \\{0\\}' the union of the intervals between the removed numbers."""
    m = _SET_BUILDER_RE.fullmatch(s)
    if m and re.search(rf"(?<![A-Za-z\\]){m.group('var')}(?![A-Za-z])", m.group("cond")):
        return m.group("cond")
    m = _REALS_MINUS_RE.fullmatch(s)
    if m:
        items = [re.sub(r"\s+", "", x) for x in _split_top_level(m.group("items"))]
        numbers = [parse_number(x) for x in items]
        if all(n is not None for n in numbers):
            points = [x for _, x in sorted(zip([n.value for n in numbers], items, strict=True))]
            ends = ["-\\infty", *dict.fromkeys(points), "\\infty"]
            return m.group("head") + "\\cup".join(f"({lo},{hi})" for lo, hi in zip(ends, ends[1:]))
        return s
    m = _REALS_RE.fullmatch(s)
    return m.group("head") + "(-\\infty,\\infty)" if m else s


# A whole number then a proper fraction, '1 1/2' or '1\frac{1}{2}', as a term of its own ('x\frac{1}{2}' is x/2,
# and '3\frac{1}{2}\pi', '3\frac{1}{2}(x+1)' are products, as the LaTeX parser reads them too): the mixed number
# it spells. Digit runs are bounded like any number's (int() refuses 4300+ digits).
_DIGITS = rf"\d{{1,{MAX_NUMBER_DIGITS}}}"
_MIXED_NUMBER_RE = re.compile(
    rf"(?<![\w.}}^_/\\])(?P<sign>-?)(?P<whole>{_DIGITS})"
    rf"(?:\s+(?P<num>{_DIGITS})\s*/\s*(?P<den>{_DIGITS})|\s*\\frac\{{(?P<fnum>{_DIGITS})\}}\{{(?P<fden>{_DIGITS})\}})"
    r"(?![\w.{^/\\(\[])"
)
# Digit groups separated by spaces ('1 000 000', '12 345.5'): groups of three after the first, from 1 to 3 digits
_DIGIT_GROUPS_RE = re.compile(r"(?<![\d.])\d{1,3}(?:\s+\d{3})+(?:\.\d+)?(?![\d.])")


def _mixed_number(m: re.Match[str]) -> str:
    """'\\frac{3}{2}' for '1 1/2'; unchanged unless the fraction is proper (2 3/2 is no mixed number)."""
    num, den = int(m.group("num") or m.group("fnum")), int(m.group("den") or m.group("fden"))
    if not 0 < num < den:
        return m.group(0)
    value = int(m.group("whole")) * den + num
    return f"{m.group('sign')}\\frac{{{value}}}{{{den}}}"


def _spaced_digits(s: str) -> str:
    """Spaces inside digit groups deleted ('1 000 000'); any other space between two digits marked to stay,
    so that '3 4' and '5 \\quad 6' are not read as 34 and 56."""
    s = _DIGIT_GROUPS_RE.sub(lambda m: re.sub(r"\s+", "", m.group(0)), s)
    return re.sub(r"(?<=\d)\s+(?=\d)", "\x00", s)
_SPACED_UNIT_RE = re.compile(rf"(?<=[\d}}])\s+(?=(?:{units.NAME_PATTERN})(?![A-Za-z]))")
# A letter followed by digits is one name ('z1' is z_1, as a program writes it), not the letter times the
# digits, which would make '2108*z1' equal '2108*z'. Not after a letter or backslash ('\log2', 'ab1' stay as
# they are) and not the exponent of a number ('1e5').
_GLUED_INDEX_RE = re.compile(r"(?<![\\A-Za-z])([A-Za-z])(\d+)(?![\d.])")


def _glued_index(m: re.Match[str]) -> str:
    """'z_{1}' for 'z1'; '1e5' unchanged."""
    before = m.string[m.start() - 1] if m.start() else ""
    if m.group(1) in "eE" and (before.isdigit() or before == "."):
        return m.group(0)
    return f"{m.group(1)}_{{{m.group(2)}}}"


_RUN = rf"\d{{0,{MAX_NUMBER_DIGITS}}}"  # digit runs are bounded like any number's (int() refuses 4300+ digits)
_PERIOD = rf"\d{{1,{MAX_NUMBER_DIGITS}}}"
_REPEATING_RE = re.compile(rf"({_RUN})\.({_RUN})\\(?:overline|bar)\s*(?:\{{({_PERIOD})\}}|(\d))")


def _repeating_decimals(s: str) -> str:
    """A repeating decimal as the fraction it is: '0.\\overline{3}' -> '\\frac{1}{3}', '0.1\\overline{6}' -> 1/6."""

    def fraction(m: re.Match[str]) -> str:
        whole, fixed, period = m.group(1) or "0", m.group(2), m.group(3) or m.group(4)
        value = int(whole) + Fraction(int(fixed or "0"), 10 ** len(fixed))
        value += Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
        return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"

    return _REPEATING_RE.sub(fraction, s) if "\\overline" in s or "\\bar" in s else s


def _empty_set_and_grouping(s: str) -> str:
    """One spelling of the empty set ('\\varnothing', '\\{\\}', '{}' -> '\\emptyset'); a TeX group that
    spans the whole answer is dropped ('{5}' is 5)."""
    s = re.sub(r"\\varnothing(?![A-Za-z])", r"\\emptyset", s)
    if re.fullmatch(r"\\\{\s*\\\}|\{\s*\}", s):
        return "\\emptyset"
    while s.startswith("{") and (inner := _unwrap(s, "{")) != s:
        s = inner.strip()
    return s


# ------------------------------------------------------------------------------------ numbers

_INT = r"[-+]?\d+"
_DEC = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)"
_NUM_PATTERNS = (
    ("int", re.compile(_INT)),
    ("dec", re.compile(_DEC)),
    ("sci", re.compile(rf"({_DEC})(?:[eE]|\\times10\^|\\cdot10\^)\{{?({_INT})\}}?")),
    ("frac", re.compile(rf"(-?)\\frac\{{({_DEC})\}}\{{({_DEC})\}}")),
    ("slash", re.compile(rf"({_DEC})/({_DEC})")),
)


class Number(NamedTuple):
    """An exactly parsed number and the precision it was written with.

    `places`: decimal places written (`1.50` -> 2, `1.5e3` -> -2), None for integers and fractions,
    which are exact; `significant`: significant digits written (`0.0330` -> 3), 0 when `places` is None.
    """

    value: Fraction
    places: int | None = None
    significant: int = 0


def _written_decimal(mantissa: str, exponent: int = 0) -> Number:
    """Number for a decimal string times 10**exponent, with the precision its digits state."""
    value = Fraction(mantissa) * Fraction(10) ** exponent
    if "." not in mantissa and exponent == 0:
        return Number(value)
    digits = mantissa.lstrip("+-")
    whole, _, fraction = digits.partition(".")
    significant = len((whole + fraction).lstrip("0"))
    return Number(value, len(fraction) - exponent, significant)


def parse_number(s: str) -> Number | None:
    """Parse a normalised plain number exactly (int, decimal, a/b, \\frac{a}{b}, 1.5e3), else None."""
    if not s or len(s) > MAX_NUMBER_DIGITS + 40:
        return None
    for kind, pattern in _NUM_PATTERNS:
        m = pattern.fullmatch(s)
        if not m:
            continue
        if kind in ("int", "dec"):
            return _written_decimal(s)
        if kind == "sci":
            exponent = int(m.group(2))
            if abs(exponent) > MAX_EXPONENT:
                return None
            return _written_decimal(m.group(1), exponent)
        sign, num, den = ("", m.group(1), m.group(2)) if kind == "slash" else m.groups()
        if Fraction(den) == 0:
            return None
        value = Fraction(num) / Fraction(den)
        return Number(-value if sign else value)  # a quotient is exact, whatever its parts are written as
    return None


def _canonical_int(s: str) -> str | None:
    """Canonical digits of a (possibly huge) integer string, for exact comparison without int()."""
    m = re.fullmatch(r"([-+]?)0*(\d+)", s)
    if not m:
        return None
    return ("-" if m.group(1) == "-" and m.group(2) != "0" else "") + m.group(2)


def has_finite_decimal_expansion(x: Fraction) -> bool:
    """True for 1/2, 3/40, 7; False for 1/3, 22/7: the reduced denominator has no prime but 2 and 5."""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def round_to_places(x: Fraction, places: int) -> Fraction:
    """`x` rounded half away from zero at 10**-places (places may be negative: hundreds are -2)."""
    scale = Fraction(10) ** places
    magnitude = (abs(x) * scale + Fraction(1, 2)).__floor__()
    return (magnitude if x >= 0 else -magnitude) / scale


def decimal_states(d: Number, x: Fraction, min_significant: int = MIN_SIGNIFICANT_DIGITS) -> bool:
    """Does the written decimal `d` state `x`, a value with no finite decimal expansion, to its precision?

    Yes when `d` is `x` rounded at `d`'s last written place and `d` has at least `min_significant`
    (MIN_SIGNIFICANT_DIGITS) significant digits (see "Written precision" in the module docstring).
    """
    return d.places is not None and d.significant >= min_significant and round_to_places(x, d.places) == d.value


def approximately_equal(pred: Number, ref: Number, pred_approximate: bool, ref_approximate: bool) -> bool:
    """The readings an approximate answer adds (see "Approximate answers" in the module docstring).

    A reference flagged approximate ('\\approx 3.14', 'about 12') is a rounding at its last written place:
    `pred` matches when it rounds to it there and is written at least as finely. A prediction flagged
    approximate matches a reference written as a decimal when it rounds to that decimal at the reference's
    places and is written at least as finely (about 3.1416 for 3.14; not about 5 for 4.8); against an integer
    or a fraction the flag adds nothing (exact values are stated exactly)."""
    if ref_approximate:
        places = ref.places if ref.places is not None else 0 if ref.value.denominator == 1 else None
    elif pred_approximate:
        places = ref.places
    else:
        return False
    finer = pred.places is None or (places is not None and pred.places >= places)
    return places is not None and finer and round_to_places(pred.value, places) == ref.value


def _within_rel_tol(x: Fraction, y: Fraction, rel_tol: float | None) -> bool:
    """The opt-in relative band (`rel_tol`), off when None."""
    return rel_tol is not None and abs(x - y) <= Fraction(rel_tol) * max(abs(x), abs(y))


def numbers_equal(a: Number, b: Number, rel_tol: float | None = None) -> bool:
    """Equality by written precision (module docstring): exact, or a decimal rounding of a non-terminating value.

    With `rel_tol`, a pair where either side is a written decimal also counts within that relative band.
    """
    if a.value == b.value:
        return True
    for d, x in ((a, b), (b, a)):
        if not has_finite_decimal_expansion(x.value) and decimal_states(d, x.value):
            return True
    return (a.places is not None or b.places is not None) and _within_rel_tol(a.value, b.value, rel_tol)


def _scaled(n: Number, power: int) -> Number:
    """`n` times 10**power, with the written precision moved along: 33.333 -> 0.33333 for power -2."""
    return Number(n.value * Fraction(10) ** power, None if n.places is None else n.places - power, n.significant)


def percent_readings(n: Number, percent: bool, other_percent: bool) -> list[Number]:
    """The values a number may stand for against another answer (see "Percent" in the module docstring).

    A % on both sides or on neither: the numbers are compared as written (50% is not 0.5%). A % on this
    side only: the number of percent or the fraction it is (50% against 50 or 0.5)."""
    return [n, _scaled(n, -2)] if percent and not other_percent else [n]


# ------------------------------------------------------------------------------------ structure


def _split_top_level(s: str) -> list[str]:
    """Split on commas not inside brackets/braces: '(1,\\frac{1}{2})' content -> ['1', '\\frac{1}{2}']."""
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


def _closes_at_end(s: str, start: int) -> bool:
    """Does the bracket opened at `s[start]` close at the last character (enclosing all the rest)?

    '(1,2]' -> True; '(1,\\infty)\\cup(-\\infty,0)' -> False: its first `)` closes the opening `(`,
    so it is a union of two intervals, not one bracketed sequence. Any closer counts (intervals mix them).
    """
    depth = 0
    for i in range(start, len(s)):
        if s[i] in "([{":
            depth += 1
        elif s[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i == len(s) - 1
    return False


def _sequence_form(s: str) -> tuple[str, list[str]] | None:
    """('()', items) for tuples/intervals, ('{}', items) for sets, ('', items) for bare lists."""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _closes_at_end(s, 0):
        brackets, inner = s[0] + s[-1], s[1:-1]
    elif s.startswith("\\{") and s.endswith("\\}") and _closes_at_end(s, 1):
        brackets, inner = "{}", s[2:-2]
    else:
        brackets, inner = "", s
    items = _split_top_level(inner)
    if len(items) < 2 or any(not item for item in items):
        return None
    return brackets, items


# ------------------------------------------------------------------------------------ symbolic


class _Timeout(BaseException):
    """Raised by the SIGALRM timer. BaseException so sympy's broad `except Exception` can't swallow it."""


WALL_FACTOR = 10  # a time limit of s CPU seconds ends after at most s x WALL_FACTOR seconds of wall time


@contextmanager
def _time_limit(seconds: float) -> Iterator[bool]:
    """Limit the main thread to `seconds` of its own CPU time (yields True); elsewhere no timer can be armed
    (False). A SIGALRM fires after `seconds` of wall time and re-arms for the rest while the thread has used
    less CPU than that, so a loaded machine (the grader waiting for a core) does not turn a comparison that
    finishes into a timeout; the wall time stays bounded by WALL_FACTOR x `seconds`."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield False
        return
    cpu0, t0 = time.thread_time(), time.monotonic()

    def on_alarm(signum: int, frame: Any) -> None:
        left = seconds - (time.thread_time() - cpu0)
        wall_left = seconds * WALL_FACTOR - (time.monotonic() - t0)
        if left > 1e-3 and wall_left > 1e-3:
            signal.setitimer(signal.ITIMER_REAL, min(left, wall_left))
            return
        raise _Timeout()

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_timer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer > 0:  # an outer timer (e.g. the caller's own) keeps running
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, previous_timer - (time.monotonic() - t0)))


def _too_complex(s: str) -> str | None:
    """Static guard: inputs that can make sympy run for minutes (towers, huge literals) -> reason."""
    if len(s) > MAX_SYMBOLIC_CHARS:
        return "too_long"
    if re.search(rf"\d{{{MAX_NUMBER_DIGITS // 2},}}", s):
        return "huge_literal"
    if re.search(r"\\(?:int|iint|oint|sum|prod|lim)(?![A-Za-z])", s):
        return "unsupported_operator"
    if re.search(r"\d \d", s):  # '3 4': the parser would add them (7); no reading of it is the answer's
        return "spaced_digits"
    for m in re.finditer(r"(\d+)\s*!", s):
        if int(m.group(1)) > 1000:
            return "huge_factorial"
    for m in re.finditer(r"\^\s*(\{)?", s):
        exponent = _brace_block(s, m.end() - 1)[0] if m.group(1) else s[m.end() : m.end() + 1]
        if exponent is None or "^" in exponent or "!" in exponent:
            return "power_tower"
        for digits in re.findall(r"\d+", exponent):
            if int(digits) > MAX_EXPONENT:
                return "huge_exponent"
    return None


@functools.lru_cache(maxsize=1)
def _sympy_modules() -> tuple[Any, Any]:
    """Import sympy and latex2sympy lazily: they cost ~1 s, and most answers never need them.

    One warm-up parse builds the LaTeX parser here, outside any answer's time limit: otherwise the first
    symbolic comparison of a process pays the start-up cost inside its limit and may time out on a busy
    machine, making the reward depend on load (seen with the regression set)."""
    import sympy  # deferred on purpose: see the docstring (~1 s, rarely needed)
    from latex2sympy2_extended import latex2sympy  # deferred with sympy, which it imports

    sympy.simplify(latex2sympy("\\frac{\\sqrt{12}}{2}") - latex2sympy("\\sqrt{3}"))
    return sympy, latex2sympy


def _fraction(r: Any) -> Fraction:
    """A sympy Rational as a Fraction."""
    return Fraction(int(r.p), int(r.q))


_FLOAT_TEXT_RE = re.compile(r"([-+]?\d+(?:\.\d*)?)(?:e([-+]?\d+))?")


def float_as_written(f: Any) -> Number | None:
    """The decimal a sympy Float was parsed from: its digits at its own precision, trailing zeros cut.

    latex2sympy makes `3.1416` a Float of at least 15 significant digits, whose text gives the written
    digits back ('3.14160000000000' -> 3.1416, 4 places); written trailing zeros are lost here, so
    nested decimals (interval endpoints) count `3.50` as `3.5`. None for inf/nan.
    """
    m = _FLOAT_TEXT_RE.fullmatch(str(f))
    if m is None:
        return None
    mantissa = m.group(1).rstrip("0") if "." in m.group(1) else m.group(1)
    return _written_decimal(mantissa.rstrip("."), int(m.group(2) or 0))


def _exact_floats(e: Any) -> Any:
    """`e` with every Float replaced by the exact rational it spells (0.1 -> 1/10), so `0.5x == x/2`."""
    sympy, _ = _sympy_modules()
    if not isinstance(e, sympy.Basic):
        return e
    table = {}
    for f in e.atoms(sympy.Float):
        written = float_as_written(f)
        if written is not None:
            table[f] = sympy.Rational(written.value.numerator, written.value.denominator)
    return e.xreplace(table) if table else e


def _approximate(x: Any, digits: int) -> Fraction | None:
    """A real, finite constant expression to `digits` significant digits, as a Fraction; else None."""
    sympy, _ = _sympy_modules()
    value = sympy.N(x, digits)
    if not (value.is_Number and value.is_real and value.is_finite):
        return None
    return _fraction(sympy.Rational(value))


def decimal_equals_expr(
    d: Number, x: Any, rel_tol: float | None = None, min_significant: int = MIN_SIGNIFICANT_DIGITS
) -> bool:
    """Written decimal `d` against a sympy constant `x` (`\\pi`, `\\sqrt{2}`, `\\log_2 8`), by written precision.

    Powers, products and sums of rationals are evaluated exactly first (`2^{100}` is an integer, which a
    decimal rounding does not state: 1.2677e30 is not 2^100). Otherwise exact if `x` simplifies to `d`'s
    value, or `d` must be `x` rounded at `d`'s precision (with at least `min_significant` significant
    digits), judged on a value of `x` 25 digits finer than `d` is written.
    """
    sympy, _ = _sympy_modules()
    x = _exact_floats(x)
    if not isinstance(x, sympy.Expr) or x.free_symbols:
        return False
    exact = x.doit()  # latex2sympy leaves 2^{100} unevaluated; the exponents are bounded by _too_complex
    if exact.is_Rational:
        return numbers_equal(d, Number(_fraction(exact)), rel_tol)
    if sympy.simplify(x - sympy.Rational(d.value.numerator, d.value.denominator)) == 0:
        return True
    approx = _approximate(x, max(30, d.significant + 25))
    if approx is None:
        return False
    return decimal_states(d, approx, min_significant) or _within_rel_tol(approx, d.value, rel_tol)


def _merge_union(e: Any) -> Any:
    """A Union re-evaluated: overlapping parts merged and the parts in sympy's canonical order."""
    sympy, _ = _sympy_modules()
    return sympy.Union(*e.args) if isinstance(e, sympy.Union) else e


def _unordered_equal(xs: list[Any], ys: list[Any], rel_tol: float | None, depth: int) -> bool:
    """Every element of each side equals some element of the other (sets, the parts of a union)."""
    return all(any(_sympy_equal(x, y, rel_tol, depth + 1) for y in ys) for x in xs) and all(
        any(_sympy_equal(x, y, rel_tol, depth + 1) for x in xs) for y in ys
    )


def _is_inequality(e: Any) -> bool:
    """`x > 3`, `x \\le y`, `x \\ne 3`, and `1 < x < 2` (an And of them)."""
    sympy, _ = _sympy_modules()
    if isinstance(e, (sympy.And, sympy.Or)):
        return all(_is_inequality(x) for x in e.args)
    kinds = (sympy.StrictLessThan, sympy.StrictGreaterThan, sympy.LessThan, sympy.GreaterThan, sympy.Unequality)
    return isinstance(e, kinds)


def _disjoint(parts: list[Any]) -> bool:
    sympy, _ = _sympy_modules()
    return all(sympy.Intersection(p, q) == sympy.S.EmptySet for i, p in enumerate(parts) for q in parts[i + 1 :])


def _low_degree(e: Any) -> bool:
    """Every side of the inequality is a polynomial of degree <= MAX_INEQUALITY_DEGREE in its one variable,
    so that solving it stays cheap where no timer can be armed (`x^{999} > 1` is compared as written)."""
    sympy, _ = _sympy_modules()
    (x,) = e.free_symbols
    for r in e.atoms(sympy.Rel):
        gap = (r.lhs - r.rhs).replace(sympy.Abs, lambda u: u)  # |x| >= 1 is solved as cheaply as x >= 1
        if not gap.is_polynomial(x) or sympy.degree(gap, x) > MAX_INEQUALITY_DEGREE:
            return False
    return True


def _as_solution_set(e: Any) -> Any:
    """The set of reals an answer in one variable describes: `x>3` and `3<x` are (3, oo), `1<x<2` is
    (1, 2), `x \\in S` is S, and a list of inequalities with disjoint sets ('x<3 or x>5') their union.
    Anything else (an inequality in two variables, overlapping ones) is returned unchanged."""
    sympy, _ = _sympy_modules()
    if isinstance(e, sympy.Equality) and isinstance(e.lhs, sympy.Symbol) and isinstance(e.rhs, sympy.Set):
        return e.rhs
    one_variable = isinstance(e, sympy.Basic) and len(e.free_symbols) == 1
    if one_variable and _is_inequality(e) and _low_degree(e):
        try:
            return e.as_set()
        except Exception:  # noqa: BLE001 - sympy cannot solve it: it is compared as written
            return e
    if one_variable and isinstance(e, sympy.FiniteSet) and len(e.args) > 1 and all(map(_is_inequality, e.args)):
        parts = [_as_solution_set(x) for x in e.args]
        if all(isinstance(p, sympy.Set) for p in parts) and _disjoint(parts):
            return sympy.Union(*parts)
    return e


def _relations_equal(ea: Any, eb: Any) -> bool:
    """Two inequalities that are not about one variable, each read as `gap > 0` (or >=, !=): x>y is y<x."""
    sympy, _ = _sympy_modules()

    def gap(r: Any) -> tuple[str, Any]:
        if isinstance(r, sympy.Unequality):
            return "!=", r.lhs - r.rhs
        kind = ">" if isinstance(r, (sympy.StrictLessThan, sympy.StrictGreaterThan)) else ">="
        return kind, _exact_floats(r.lhs - r.rhs if r.rel_op in (">", ">=") else r.rhs - r.lhs)

    (ka, da), (kb, db) = gap(ea), gap(eb)
    return ka == kb and (sympy.simplify(da - db) == 0 or (ka == "!=" and sympy.simplify(da + db) == 0))


def _singleton_against_value(ea: Any, eb: Any) -> tuple[Any, Any] | None:
    """(element, value) when one side is a one-element set and the other a value: {5} against 5."""
    sympy, _ = _sympy_modules()
    for x, y in ((ea, eb), (eb, ea)):
        if isinstance(x, sympy.FiniteSet) and len(x.args) == 1 and isinstance(y, sympy.Expr):
            return x.args[0], y
    return None


def _sympy_equal(ea: Any, eb: Any, rel_tol: float | None, depth: int = 0) -> bool:
    """Equality of two sympy objects: numbers by value, expressions by simplify, sets/tuples by parts,
    inequalities in one variable as the sets they describe."""
    sympy, _ = _sympy_modules()
    ea, eb = _merge_union(_as_solution_set(ea)), _merge_union(_as_solution_set(eb))
    if ea == eb:
        return True
    if depth > 3:
        return False
    if isinstance(ea, sympy.Union) and isinstance(eb, sympy.Union):  # a union is unordered
        return len(ea.args) == len(eb.args) and _unordered_equal(list(ea.args), list(eb.args), rel_tol, depth)
    if isinstance(ea, sympy.Interval) and isinstance(eb, sympy.Interval):
        return (ea.left_open, ea.right_open) == (eb.left_open, eb.right_open) and all(
            _sympy_equal(x, y, rel_tol, depth + 1) for x, y in ((ea.start, eb.start), (ea.end, eb.end))
        )
    if isinstance(ea, (sympy.FiniteSet, sympy.Tuple)) and isinstance(eb, (sympy.FiniteSet, sympy.Tuple)):
        xs, ys = list(ea.args), list(eb.args)
        if len(xs) != len(ys) or isinstance(ea, sympy.Tuple) != isinstance(eb, sympy.Tuple):
            return False  # (latex2sympy has its own FiniteSet subclass, so kinds are compared, not types)
        if isinstance(ea, sympy.Tuple):
            return all(_sympy_equal(x, y, rel_tol, depth + 1) for x, y in zip(xs, ys, strict=True))
        return _unordered_equal(xs, ys, rel_tol, depth)
    if isinstance(ea, sympy.Equality) and isinstance(eb, sympy.Equality):
        da, db = _exact_floats(ea.lhs - ea.rhs), _exact_floats(eb.lhs - eb.rhs)
        return sympy.simplify(da - db) == 0 or sympy.simplify(da + db) == 0
    if isinstance(ea, sympy.Rel) and isinstance(eb, sympy.Rel) and _is_inequality(ea) and _is_inequality(eb):
        return _relations_equal(ea, eb)
    single = _singleton_against_value(ea, eb)
    if single is not None:
        return _sympy_equal(*single, rel_tol, depth + 1)
    if isinstance(ea, sympy.Expr) and isinstance(eb, sympy.Expr):
        return _expr_equal(ea, eb, rel_tol)
    return False


def rational_equals_constant(r: Any, x: Any) -> bool:
    """An exact rational against a constant that does not evaluate to one: never equal when sympy knows `x` is
    irrational (a rational within 1e-12 of pi is still not pi); otherwise (`\\log_2 8`, which it cannot always
    reduce) equal only when `x` agrees with `r` to far more digits than `r` has: a fraction p/q close to an
    irrational agrees with it to about twice the digits of q at best, so 1e-12 would admit 7-digit fractions."""
    sympy, _ = _sympy_modules()
    if x.is_rational is False or not x.is_number:
        return False
    digits = min(2 * (len(str(r.p)) + len(str(r.q))) + 30, MAX_RATIONAL_DIGITS)
    approx = _approximate(x, digits)
    if approx is None:
        return False
    value = _fraction(r)
    return abs(approx - value) <= Fraction(1, 10 ** (digits - 10)) * max(abs(value), abs(approx), Fraction(1))


def _mp_complex(v: Any) -> Any:
    """A sympy number as an mpmath complex (the context's mantissa, unbounded exponent)."""
    import mpmath  # sympy's own dependency, deferred with sympy

    sympy, _ = _sympy_modules()
    re_part, im_part = v.as_real_imag()
    real, imaginary = (mpmath.mpf(sympy.Float(part, CONSTANT_DIGITS)) for part in (re_part, im_part))
    return mpmath.mpc(real, imaginary)


def _expr_equal(ea: Any, eb: Any, rel_tol: float | None) -> bool:
    """Two expressions: a lone decimal by written precision, constants by value, the rest by simplify."""
    sympy, _ = _sympy_modules()
    if ea.free_symbols or eb.free_symbols:
        return sympy.simplify(_exact_floats(ea) - _exact_floats(eb)) == 0
    for d, x in ((ea, eb), (eb, ea)):
        written = float_as_written(d) if isinstance(d, sympy.Float) else None
        if written is not None and not isinstance(x, sympy.Float):
            return decimal_equals_expr(written, x, rel_tol)
    xa, xb = _exact_floats(ea), _exact_floats(eb)
    inexact = ea.has(sympy.Float) or eb.has(sympy.Float)
    ra, rb = xa.doit(), xb.doit()  # latex2sympy leaves 2^{999} unevaluated
    if ra.is_Rational and rb.is_Rational and not (inexact and rel_tol is not None):
        return bool(ra == rb)  # exact numbers compare exactly: 2^{999} + 1 is not 2^{999}
    if (ra.is_Rational or rb.is_Rational) and not (inexact and rel_tol is not None):
        return rational_equals_constant(*((ra, rb) if ra.is_Rational else (rb, ra)))
    va, vb = sympy.N(xa, CONSTANT_DIGITS), sympy.N(xb, CONSTANT_DIGITS)
    if not (va.is_number and vb.is_number) or va.has(sympy.zoo, sympy.nan) or vb.has(sympy.zoo, sympy.nan):
        return False
    if va.is_infinite or vb.is_infinite:
        return bool(va == vb)
    # In mpmath numbers, not Python floats: a value past the float range (575! ~ 1e1338) is inf as a Python
    # complex, and inf <= 1e-12 * inf would call it equal to every number, a reward a policy learns to collect.
    import mpmath  # sympy's own dependency, deferred with sympy

    with mpmath.workdps(CONSTANT_DIGITS):
        a, b = _mp_complex(va), _mp_complex(vb)
        scale = max(abs(a), abs(b))  # no floor: 1/575! is not 0 either
        diff = abs(a - b)
        tol = max(CONSTANT_TOLERANCE, rel_tol) if inexact and rel_tol is not None else CONSTANT_TOLERANCE
        return bool(diff <= mpmath.mpf(tol) * scale)


def _to_sympy(s: str) -> Any:
    """Parse a normalised answer: a degree sign inside an expression converts to radians (`\\cos 30^{\\circ}`
    is cos(pi/6), not cos(30)), and `i` is the imaginary unit, not a variable."""
    sympy, latex2sympy = _sympy_modules()
    e = latex2sympy(s, convert_degrees=True)
    if not isinstance(e, sympy.Basic):
        return e
    table = {x: sympy.I for x in e.free_symbols if isinstance(x, sympy.Symbol) and x.name == "i"}
    return e.xreplace(table) if table else e


def _guarded_sympy(
    texts: tuple[str, ...], compare: Callable[[], bool], method: str, timeout_s: float
) -> tuple[bool, str]:
    """Run a sympy comparison behind the static guards and the timer: (equal, method-or-reason)."""
    for s in texts:
        guard = _too_complex(s)
        if guard:
            return False, guard
    _sympy_modules()  # start-up cost outside the time limit
    try:
        with _time_limit(timeout_s):
            return compare(), method
    except _Timeout:
        return False, "timeout"
    except Exception:  # noqa: BLE001 - unparseable LaTeX is a wrong answer, not a crash
        return False, "unparseable"


def symbolic_equal(a: str, b: str, *, rel_tol: float | None = None, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(equal, reason) for two normalised strings via sympy, behind guards and the timer."""
    return _guarded_sympy((a, b), lambda: _sympy_equal(_to_sympy(a), _to_sympy(b), rel_tol), "symbolic", timeout_s)


def decimal_equals_closed_form(
    decimals: list[Number],
    other: str,
    *,
    rel_tol: float | None = None,
    timeout_s: float = 2.0,
    min_significant: int | None = None,
) -> tuple[bool, str]:
    """(equal, reason): does a written decimal (any of its percent readings) state the closed form `other`?"""
    minimum = MIN_SIGNIFICANT_DIGITS if min_significant is None else min_significant
    return _guarded_sympy(
        (other,),
        lambda: any(decimal_equals_expr(d, _to_sympy(other), rel_tol, minimum) for d in decimals),
        "decimal",
        timeout_s,
    )


# ------------------------------------------------------------------------------------ equivalence


def _words_only(s: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z ]*", s))


def answers_equal(
    pred: str, ref: str, *, rel_tol: float | None = None, timeout_s: float = 2.0
) -> tuple[bool, str]:
    """(equal, method-or-reason): are two final answers (raw strings) mathematically the same?

    Results for short answers are memoised (a group of G rollouts often repeats answers, and sympy
    is the slow part); long ones are not, so a flood of huge answers cannot grow the cache's memory.
    """
    if len(pred) + len(ref) <= _CACHEABLE_CHARS:
        return _answers_equal_cached(pred, ref, rel_tol, timeout_s)
    return _answers_equal(pred, ref, rel_tol, timeout_s)


_CACHEABLE_CHARS = 1000


def _answers_equal(pred: str, ref: str, rel_tol: float | None, timeout_s: float) -> tuple[bool, str]:
    a, b = settle_glued_units(normalize_answer(pred), normalize_answer(ref))
    if not a.text or not b.text:
        return False, "empty"
    if a.unit is not None and b.unit is not None and a.unit != b.unit:
        if a.unit.dimension != b.unit.dimension:
            return False, "unit_mismatch"
        return _converted_equal(a, b, rel_tol, timeout_s)
    return _values_equal(a, b, rel_tol, timeout_s)


_answers_equal_cached = functools.lru_cache(maxsize=65536)(_answers_equal)


def settle_glued_units(a: Normalized, b: Normalized) -> tuple[Normalized, Normalized]:
    """A unit written against its number ('4s'), or a bare SI symbol that is no name ('2 V', '5 kPa'), is read as
    a unit only when the other answer has a unit of the same dimension ('4 s', '4000 ms'); otherwise its letters
    are part of the answer (4 times s)."""

    def settled(x: Normalized, other: Normalized) -> Normalized:
        same_dimension = x.unit is not None and other.unit is not None and x.unit.dimension == other.unit.dimension
        return x if x.otherwise is None or same_dimension else x.otherwise

    return settled(a, b), settled(b, a)


def _converted_equal(a: Normalized, b: Normalized, rel_tol: float | None, timeout_s: float) -> tuple[bool, str]:
    """Two values in different units of one dimension ('1.5 km', '1500 m'): each side is tried in the
    other's unit, the converted side exact and the other keeping its written precision."""
    ratio = b.unit.factor / a.unit.factor  # one of b's units in a's units
    na, nb = parse_number(a.text), parse_number(b.text)
    if na is not None and nb is not None:
        in_a, in_b = Number(nb.value * ratio), Number(na.value / ratio)  # b in a's unit, a in b's unit
        return numbers_equal(na, in_a, rel_tol) or numbers_equal(in_b, nb, rel_tol), "unit"
    scaled = f"\\frac{{{ratio.numerator}}}{{{ratio.denominator}}}\\cdot({b.text})"
    equal, method = symbolic_equal(a.text, scaled, rel_tol=rel_tol, timeout_s=timeout_s)
    return equal, "unit" if equal else method


def _values_equal(a: Normalized, b: Normalized, rel_tol: float | None, timeout_s: float) -> tuple[bool, str]:
    """Two normalised answers in the same unit (or one without): strings, numbers, sequences, then sympy."""
    if a.text == b.text or (_words_only(a.text) and a.text.lower() == b.text.lower()):
        return True, "string"
    based = bases_equal(a.text, b.text)
    if based is not None:
        return based, "base"
    single = _singleton_pair(a, b)
    if single is not None:
        return _values_equal(*single, rel_tol, timeout_s)
    ca, cb = _canonical_int(a.text), _canonical_int(b.text)
    if ca is not None and cb is not None and max(len(ca), len(cb)) > MAX_NUMBER_DIGITS:
        return ca == cb, "digits"
    na, nb = parse_number(a.text), parse_number(b.text)
    if na is not None and nb is not None:
        readings_a, readings_b = percent_readings(na, a.percent, b.percent), percent_readings(nb, b.percent, a.percent)
        if any(numbers_equal(x, y, rel_tol) for x in readings_a for y in readings_b):
            return True, "numeric"
        return approximately_equal(na, nb, a.approximate, b.approximate), "numeric"
    sa, sb = _sequence_form(a.text), _sequence_form(b.text)
    if sa is not None and sb is not None:
        return _sequences_equal(sa, sb, rel_tol, timeout_s)
    for number, side, other in ((na, a, b), (nb, b, a)):
        if number is not None and number.places is not None:  # a written decimal against a closed form
            readings = percent_readings(number, side.percent, other.percent)
            readings += [_scaled(number, 2)] if other.percent and not side.percent else []
            coarse = side is b and b.approximate  # an approximate reference states its value at its own places
            return decimal_equals_closed_form(
                readings, other.text, rel_tol=rel_tol, timeout_s=timeout_s, min_significant=1 if coarse else None
            )
    pairs = [(a.text, b.text)]
    if a.percent != b.percent:  # a closed form with % on one side: also as the fraction it is
        pairs.append((f"\\frac{{{a.text}}}{{100}}", b.text) if a.percent else (a.text, f"\\frac{{{b.text}}}{{100}}"))
    result = (False, "symbolic")
    for x, y in pairs:
        result = symbolic_equal(x, y, rel_tol=rel_tol, timeout_s=timeout_s)
        if result[0]:
            return result
    return result


def _singleton_element(s: str) -> str | None:
    """'5' for '\\{5\\}': the element of a one-element set, else None."""
    if len(s) > 4 and s.startswith("\\{") and s.endswith("\\}") and _closes_at_end(s, 1):
        inner = s[2:-2]
        return inner if inner and len(_split_top_level(inner)) == 1 else None
    return None


def _singleton_pair(a: Normalized, b: Normalized) -> tuple[Normalized, Normalized] | None:
    """A one-element set against an answer that is not a set compares its element: '\\{5\\}' vs '5'."""
    for first, (x, y) in ((True, (a, b)), (False, (b, a))):
        inner = _singleton_element(x.text)
        if inner is not None and not (y.text.startswith("\\{") or y.text == "\\emptyset"):
            return (x._replace(text=inner), y) if first else (y, x._replace(text=inner))
    return None


_ASSIGNMENT_RE = re.compile(r"([A-Za-z](?:_\{[A-Za-z0-9]+\})?)=([^=]+)")


def _assignments(items: list[str]) -> dict[str, str] | None:
    """{'x': '2', 'y': '3'} for ['x=2', 'y=3']: every item names a value, each name once; else None."""
    matches = [_ASSIGNMENT_RE.fullmatch(item) for item in items]
    if not all(matches):
        return None
    named = {m.group(1): m.group(2) for m in matches if m}
    return named if len(named) == len(items) else None


def _sequences_equal(
    sa: tuple[str, list[str]], sb: tuple[str, list[str]], rel_tol: float | None, timeout_s: float
) -> tuple[bool, str]:
    """Tuples/intervals in order with matching brackets; sets and bare lists in any order.

    Named values ('x=2, y=3') match by name; against unnamed ones ('(2,3)') they are taken in the
    alphabetical order of their names, in order unless the other side is a set."""
    (ba, xs), (bb, ys) = sa, sb
    if len(xs) != len(ys):
        return False, "sequence"
    named_a, named_b = _assignments(xs), _assignments(ys)
    if named_a is not None and named_b is not None:
        same = named_a.keys() == named_b.keys() and all(
            answers_equal(named_a[k], named_b[k], rel_tol=rel_tol, timeout_s=timeout_s)[0] for k in named_a
        )
        return same, "assignment"
    if named_a is not None or named_b is not None:
        xs = [named_a[k] for k in sorted(named_a)] if named_a is not None else xs
        ys = [named_b[k] for k in sorted(named_b)] if named_b is not None else ys
        ba = bb = "{}" if "{}" in (ba, bb) else "()"
    if ba in ("", "{}") and bb in ("", "{}"):
        remaining = list(ys)
        for x in xs:
            match = next((y for y in remaining if answers_equal(x, y, rel_tol=rel_tol, timeout_s=timeout_s)[0]), None)
            if match is None:
                return False, "set"
            remaining.remove(match)
        return True, "set"
    if ba != bb:
        return False, "sequence"
    ok = all(answers_equal(x, y, rel_tol=rel_tol, timeout_s=timeout_s)[0] for x, y in zip(xs, ys, strict=True))
    return ok, "sequence"


# ------------------------------------------------------------------------------------ reward


def reference_answers(value: Any, field_name: str) -> list[str]:
    """Reference answer(s) from the sample; a full solution ('... #### 72', '\\boxed{..}') is reduced."""
    refs = []
    for ref in as_str_list(value, field_name):
        found = extract_answers(ref).candidates if ("\\boxed" in ref or "####" in ref) else []
        ref = found[-1] if found and found[-1] else ref
        if not ref.strip():
            raise RewardInputError(f"sample field {field_name!r} has an empty reference answer")
        refs.append(ref)
    return refs


def _agree(candidates: list[str], rel_tol: float | None, timeout_s: float) -> bool:
    return all(answers_equal(c, candidates[0], rel_tol=rel_tol, timeout_s=timeout_s)[0] for c in candidates[1:])


@reward("math", MATH_VERSION)
def math_reward(
    response: str,
    sample: Mapping[str, Any],
    *,
    answer_key: str = "answer",
    fallback_last_number: bool = False,
    rel_tol: float | None = None,
    timeout_s: float = 2.0,
    think_tag: str = "think",
    answer_tag: str = "answer",
) -> RewardResult:
    """1 if the single committed final answer equals a reference `sample[answer_key]`, else 0.

    Numbers are equal by the precision they are written with (module docstring); `rel_tol`, off by
    default, additionally accepts a decimal within that relative distance (version 1 used 1e-4 always)."""
    refs = reference_answers(require(sample, answer_key), answer_key)
    turn = assistant_turn(response, sample, think_tag=think_tag)  # with the prompt's opened <think>
    segment = split_response(turn, think_tag=think_tag, answer_tag=answer_tag).answer
    found = extract_answers(segment, fallback_last_number=fallback_last_number)
    info: dict[str, Any] = {"source": found.source, "candidates": [c[:200] if c else c for c in found.candidates[:4]]}
    if not found.candidates:
        return RewardResult(0.0, {**info, "reason": "no_answer"})
    if any(c is None for c in found.candidates):
        return RewardResult(0.0, {**info, "reason": "unbalanced_braces"})
    candidates = list(dict.fromkeys(c for c in found.candidates if c is not None))  # distinct, in order
    if any(not normalize_answer(c).text for c in candidates):
        return RewardResult(0.0, {**info, "reason": "empty_answer"})
    if len(candidates) > MAX_DISTINCT_ANSWERS or not _agree(candidates, rel_tol, timeout_s):
        return RewardResult(0.0, {**info, "reason": "multiple_answers"})
    info["extracted"] = candidates[0][:200]
    info["timer"] = "armed" if threading.current_thread() is threading.main_thread() else "unavailable"
    last = "wrong_answer"
    for ref in refs:
        equal, method = answers_equal(candidates[0], ref, rel_tol=rel_tol, timeout_s=timeout_s)
        if equal:
            return RewardResult(1.0, {**info, "reason": "correct", "method": method})
        last = "timeout" if method == "timeout" else last
    return RewardResult(0.0, {**info, "reason": last, "reference": refs[0][:200]})
