"""Math reward: strict final-answer extraction, normalisation, and equivalence (value, then symbolic).

Why strict: a lenient extractor ("the last number anywhere") rewards answers the model never committed
to and invites hedging. Only the answer segment counts (see `format.split_response`), only explicit
commitments count (`\\boxed{}`, `####`, "the answer is", a bare answer or an `<answer>` block), and if
the commitments disagree the response scores 0. Falling back to the last number is an opt-in.

Equivalence is a cascade, cheapest first, so that the common case never touches sympy:
1. normalised strings equal;
2. both are plain numbers (ints, decimals, fractions, percents, scientific notation): compared exactly
   as rationals, with a relative tolerance only when a decimal is involved;
3. tuples / intervals / sets: element-wise;
4. symbolic, through latex2sympy2-extended and sympy, behind static size guards and a wall-clock
   timer. The timer is SIGALRM-based and therefore only armed on the main thread (elsewhere the static
   guards alone bound the work; `info["timer"]` says which). A timeout is "not equal" with reason
   "timeout". Model text is never passed to `eval`/`sympy.parse_expr`.
"""

from __future__ import annotations

import functools
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, NamedTuple

from grpo_jax.rewards.base import RewardInputError, RewardResult, as_str_list, require, reward
from grpo_jax.rewards.format import split_response

MATH_VERSION = "1"

MAX_SYMBOLIC_CHARS = 300  # longer expressions are judged by string/number rules only
MAX_NUMBER_DIGITS = 400  # longer digit runs are compared as canonical digit strings
MAX_EXPONENT = 1000  # |exponent| above this is never handed to sympy (10^{10^{10}} would hang in C)
MAX_DISTINCT_ANSWERS = 16  # more distinct commitments than this is hedging, not spelling variants

# ------------------------------------------------------------------------------------ extraction

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
# The look-ahead keeps overlapping statements findable; its bounded length keeps a response made of
# thousands of "answer is" linear rather than quadratic.
_ANSWER_IS_RE = re.compile(r"(?i)\b(?:final\s+answer|answer)\s*(?:is|:|=)[ \t]*:?[ \t]*(?=([^\n]{0,500}))")
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_COMMITTED_START_RE = re.compile(r"[-+\u2212$\\(\[{0-9.]|[A-Za-z]\s*=|[A-Za-z]\s*$|[A-Za-z][.)]?\s*$")


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


def cut_answer_tail(tail: str) -> str | None:
    """The committed answer at the start of the text after "the answer is", or None if it is prose."""
    tail = tail.replace("**", "").strip()
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

_UNIT_WORDS = (
    "mm cm m km meter meters metre metres centimeter centimeters kilometer kilometers inch inches in "
    "foot feet ft yard yards yd mile miles mi g kg gram grams kilogram kilograms lb lbs pound pounds oz "
    "ounce ounces ml l liter liters litre litres gallon gallons s sec second seconds min minute minutes "
    "h hr hrs hour hours day days week weeks month months year years dollar dollars cent cents "
    "degree degrees unit units sq square cubic mph kph"
).split()
_UNIT_ALTERNATION = "|".join(sorted(_UNIT_WORDS, key=len, reverse=True))
_UNIT_TAIL_RE = re.compile(rf"^(.*?\d\}}?)\s*(?:(?:{_UNIT_ALTERNATION})\b\.?\s*)+$")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\(?:quad|qquad|displaystyle|left|right|big|Big|bigg|Bigg)(?![A-Za-z])|~")
_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


class Normalized(NamedTuple):
    """A normalised answer string; `percent` records a stripped % so 50% can match 50 or 0.5."""

    text: str
    percent: bool


def _unwrap(s: str, prefix: str) -> str:
    """'\\boxed{X}' -> 'X' when the wrapper spans the whole string."""
    if s.startswith(prefix) and s.endswith("}"):
        content, end = _brace_block(s, len(prefix) - 1)
        if content is not None and end == len(s):
            return content
    return s


def _strip_units(s: str) -> str:
    """Drop unit text after a number: '5\\text{ cm}' -> '5', '12 dollars' -> '12', '90^\\circ' -> '90'."""
    s = re.sub(r"\^\s*\{?\\circ\}?|\\circ|\\degree|°", "", s)
    if re.search(r"\d", s):
        s = re.sub(r"(?<=[\d}])\s*\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .^/]*\}\s*$", "", s)
    m = _UNIT_TAIL_RE.match(s)
    return m.group(1) if m else s


def _fix_frac_sqrt(s: str) -> str:
    """Canonical LaTeX spellings: \\dfrac/\\tfrac -> \\frac, \\frac12 -> \\frac{1}{2}, \\sqrt2 -> \\sqrt{2}."""
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\{)", r"\\frac{\1}\2", s)
    s = re.sub(r"\\sqrt\s*(\d+|[A-Za-z](?![A-Za-z]))", r"\\sqrt{\1}", s)
    return s


def _plain_to_latex(s: str) -> str:
    """Plain-text math (sqrt(2), pi, **, unicode) in LaTeX spelling, so one parser handles both."""
    for a, b in (("\u2212", "-"), ("\u00d7", "\\times "), ("\u00b7", "\\cdot "), ("\u03c0", "\\pi "), ("**", "^")):
        s = s.replace(a, b)
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
    s = answer.strip()
    for wrapper in ("\\boxed{", "\\fbox{"):
        s = _unwrap(s, wrapper).strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    s = s.replace("\\[", "").replace("\\]", "").replace("{,}", "")
    s = _plain_to_latex(s)
    s = _SPACING_RE.sub(" ", s).strip()
    s = s.rstrip(".").strip()
    s = _strip_units(s).strip()
    percent = bool(re.search(r"\\?%\s*$", s))
    s = re.sub(r"\\?%\s*$", "", s).strip()
    s = re.sub(r"\\?%", "", s) if percent else s
    s = _TEXT_CMD_RE.sub(r"\1", s)
    s = _fix_frac_sqrt(s)
    s = re.sub(r"^[A-Za-z]\s*(?:=|:)\s*(?=[^=]*$)", "", s)  # 'x = 5' -> '5'
    s = re.sub(r"([_^])\s*([A-Za-z0-9])", r"\1{\2}", s)  # '\log_2 8' must not become '\log_28'
    s = re.sub(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])", "\\1\x00", s)  # keep '\pi r' from becoming '\pir'
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    s = s.lstrip("+") if re.match(r"\+[\d.]", s) else s
    s = s.rstrip(".")
    return Normalized(s, percent)


_normalize_cached = functools.lru_cache(maxsize=65536)(_normalize)


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
    """An exactly parsed number; `inexact` when a decimal point/exponent makes tolerance appropriate."""

    value: Fraction
    inexact: bool


def parse_number(s: str) -> Number | None:
    """Parse a normalised plain number exactly (int, decimal, a/b, \\frac{a}{b}, 1.5e3), else None."""
    if not s or len(s) > MAX_NUMBER_DIGITS + 40:
        return None
    for kind, pattern in _NUM_PATTERNS:
        m = pattern.fullmatch(s)
        if not m:
            continue
        if kind in ("int", "dec"):
            return Number(Fraction(s), "." in s)
        if kind == "sci":
            exponent = int(m.group(2))
            if abs(exponent) > MAX_EXPONENT:
                return None
            return Number(Fraction(m.group(1)) * Fraction(10) ** exponent, True)
        sign, num, den = ("", m.group(1), m.group(2)) if kind == "slash" else m.groups()
        if Fraction(den) == 0:
            return None
        value = Fraction(num) / Fraction(den)
        return Number(-value if sign else value, "." in num + den)
    return None


def _canonical_int(s: str) -> str | None:
    """Canonical digits of a (possibly huge) integer string, for exact comparison without int()."""
    m = re.fullmatch(r"([-+]?)0*(\d+)", s)
    if not m:
        return None
    return ("-" if m.group(1) == "-" and m.group(2) != "0" else "") + m.group(2)


def _numbers_close(a: Number, b: Number, rel_tol: float) -> bool:
    """Exact rational equality, or relative tolerance when either side was written as a decimal."""
    if a.value == b.value:
        return True
    if not (a.inexact or b.inexact):
        return False
    scale = max(abs(a.value), abs(b.value))
    return abs(a.value - b.value) <= Fraction(rel_tol) * scale


def _percent_variants(n: Number, percent: bool) -> list[Number]:
    """50% may mean 50 or 0.5; the reference decides, so both readings are tried."""
    return [n, Number(n.value / 100, n.inexact)] if percent else [n]


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


def _sequence_form(s: str) -> tuple[str, list[str]] | None:
    """('()', items) for tuples/intervals, ('{}', items) for sets, ('', items) for bare lists."""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        brackets, inner = s[0] + s[-1], s[1:-1]
    elif s.startswith("\\{") and s.endswith("\\}"):
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


@contextmanager
def _time_limit(seconds: float) -> Iterator[bool]:
    """Arm a SIGALRM timer on the main thread (yields True); elsewhere no timer can be armed (False)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield False
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Timeout()

    t0 = time.monotonic()
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


def _sympy_equal(ea: Any, eb: Any, rel_tol: float, depth: int = 0) -> bool:
    """Equality of two sympy objects: numbers by value, expressions by simplify, sets/tuples by parts."""
    sympy, _ = _sympy_modules()
    if ea == eb:
        return True
    if depth > 3:
        return False
    if isinstance(ea, sympy.Interval) and isinstance(eb, sympy.Interval):
        return (ea.left_open, ea.right_open) == (eb.left_open, eb.right_open) and all(
            _sympy_equal(x, y, rel_tol, depth + 1) for x, y in ((ea.start, eb.start), (ea.end, eb.end))
        )
    if isinstance(ea, (sympy.FiniteSet, sympy.Tuple)) and isinstance(eb, (sympy.FiniteSet, sympy.Tuple)):
        xs, ys = list(ea.args), list(eb.args)
        if len(xs) != len(ys) or type(ea) is not type(eb):
            return False
        if isinstance(ea, sympy.Tuple):
            return all(_sympy_equal(x, y, rel_tol, depth + 1) for x, y in zip(xs, ys, strict=True))
        return all(any(_sympy_equal(x, y, rel_tol, depth + 1) for y in ys) for x in xs) and all(
            any(_sympy_equal(x, y, rel_tol, depth + 1) for x in xs) for y in ys
        )
    if isinstance(ea, sympy.Equality) and isinstance(eb, sympy.Equality):
        da, db = ea.lhs - ea.rhs, eb.lhs - eb.rhs
        return sympy.simplify(da - db) == 0 or sympy.simplify(da + db) == 0
    if isinstance(ea, sympy.Expr) and isinstance(eb, sympy.Expr):
        return _expr_equal(ea, eb, rel_tol)
    return False


def _expr_equal(ea: Any, eb: Any, rel_tol: float) -> bool:
    sympy, _ = _sympy_modules()
    if not ea.free_symbols and not eb.free_symbols:
        va, vb = sympy.N(ea, 30), sympy.N(eb, 30)
        if not (va.is_number and vb.is_number) or va.has(sympy.zoo, sympy.nan) or vb.has(sympy.zoo, sympy.nan):
            return False
        if va.is_infinite or vb.is_infinite:
            return bool(va == vb)
        diff = abs(complex(va) - complex(vb))
        inexact = ea.has(sympy.Float) or eb.has(sympy.Float)
        tol = rel_tol if inexact else 1e-12
        return diff <= tol * max(abs(complex(va)), abs(complex(vb)), 1e-300)
    return sympy.simplify(ea - eb) == 0


def _to_sympy(s: str) -> Any:
    _, latex2sympy = _sympy_modules()
    return latex2sympy(s)


def symbolic_equal(a: str, b: str, *, rel_tol: float = 1e-4, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(equal, reason) for two normalised strings via sympy, behind guards and the timer."""
    for s in (a, b):
        guard = _too_complex(s)
        if guard:
            return False, guard
    _sympy_modules()  # start-up cost outside the time limit
    try:
        with _time_limit(timeout_s):
            return _sympy_equal(_to_sympy(a), _to_sympy(b), rel_tol), "symbolic"
    except _Timeout:
        return False, "timeout"
    except Exception:  # noqa: BLE001 - unparseable LaTeX is a wrong answer, not a crash
        return False, "unparseable"


# ------------------------------------------------------------------------------------ equivalence


def _words_only(s: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z ]*", s))


def answers_equal(pred: str, ref: str, *, rel_tol: float = 1e-4, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(equal, method-or-reason): are two final answers (raw strings) mathematically the same?

    Results for short answers are memoised (a group of G rollouts often repeats answers, and sympy
    is the slow part); long ones are not, so a flood of huge answers cannot grow the cache's memory.
    """
    if len(pred) + len(ref) <= _CACHEABLE_CHARS:
        return _answers_equal_cached(pred, ref, rel_tol, timeout_s)
    return _answers_equal(pred, ref, rel_tol, timeout_s)


_CACHEABLE_CHARS = 1000


def _answers_equal(pred: str, ref: str, rel_tol: float, timeout_s: float) -> tuple[bool, str]:
    a, b = normalize_answer(pred), normalize_answer(ref)
    if not a.text or not b.text:
        return False, "empty"
    if a.text == b.text or (_words_only(a.text) and a.text.lower() == b.text.lower()):
        return True, "string"
    ca, cb = _canonical_int(a.text), _canonical_int(b.text)
    if ca is not None and cb is not None and max(len(ca), len(cb)) > MAX_NUMBER_DIGITS:
        return ca == cb, "digits"
    na, nb = parse_number(a.text), parse_number(b.text)
    if na is not None and nb is not None:
        close = any(
            _numbers_close(x, y, rel_tol)
            for x in _percent_variants(na, a.percent)
            for y in _percent_variants(nb, b.percent)
        )
        return close, "numeric"
    sa, sb = _sequence_form(a.text), _sequence_form(b.text)
    if sa is not None and sb is not None:
        return _sequences_equal(sa, sb, rel_tol, timeout_s)
    return symbolic_equal(a.text, b.text, rel_tol=rel_tol, timeout_s=timeout_s)


_answers_equal_cached = functools.lru_cache(maxsize=65536)(_answers_equal)


def _sequences_equal(
    sa: tuple[str, list[str]], sb: tuple[str, list[str]], rel_tol: float, timeout_s: float
) -> tuple[bool, str]:
    """Tuples/intervals in order with matching brackets; sets and bare lists in any order."""
    (ba, xs), (bb, ys) = sa, sb
    if len(xs) != len(ys):
        return False, "sequence"
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


def _agree(candidates: list[str], rel_tol: float, timeout_s: float) -> bool:
    return all(answers_equal(c, candidates[0], rel_tol=rel_tol, timeout_s=timeout_s)[0] for c in candidates[1:])


@reward("math", MATH_VERSION)
def math_reward(
    response: str,
    sample: Mapping[str, Any],
    *,
    answer_key: str = "answer",
    fallback_last_number: bool = False,
    rel_tol: float = 1e-4,
    timeout_s: float = 2.0,
    think_tag: str = "think",
    answer_tag: str = "answer",
) -> RewardResult:
    """1 if the single committed final answer equals a reference `sample[answer_key]`, else 0."""
    refs = reference_answers(require(sample, answer_key), answer_key)
    segment = split_response(response, think_tag=think_tag, answer_tag=answer_tag).answer
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
