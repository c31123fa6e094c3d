"""Math reward: the written-precision rule (properties), Python powers, unions, and hand cases of all three.

The properties run over seeded random numbers (no hypothesis dependency), so a failure names its seed.
The rule under test (module docstring of grpo_jax.rewards.math): a value with a finite decimal expansion
equals another only exactly; a decimal equals a value without one (1/3, sqrt(n), pi) when it is that value
rounded at its last written place and carries at least MIN_SIGNIFICANT_DIGITS significant digits.
"""

import random
from decimal import ROUND_HALF_UP, Decimal, localcontext
from fractions import Fraction

import pytest

from grpo_jax.rewards import math as m
from grpo_jax.rewards import math_reward

T = "<think>work</think>"
SEEDS = range(100)


def equal(a: str, b: str) -> bool:
    """answers_equal in both directions; the two must agree (equality is symmetric)."""
    ab, ba = m.answers_equal(a, b)[0], m.answers_equal(b, a)[0]
    assert ab == ba, f"asymmetric: {a!r} vs {b!r}: {ab} / {ba}"
    return ab


def random_decimal(rng: random.Random) -> str:
    """A decimal string with 1-6 places whose last written digit is not 0 (so it states that place)."""
    whole = str(rng.randrange(10 ** rng.randint(1, 7)))
    places = rng.randint(1, 6)
    digits = "".join(rng.choice("0123456789") for _ in range(places - 1)) + rng.choice("123456789")
    return rng.choice(["", "-"]) + whole + "." + digits


def significant_digits(s: str) -> int:
    return len(s.lstrip("+-").replace(".", "").lstrip("0"))


def rounded(value: Decimal, places: int) -> str:
    """`value` rounded half away from zero at `places` decimals, as text (the decimal module's ROUND_HALF_UP)."""
    return str(value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def with_last_digit(s: str, digit: str) -> str:
    return s[:-1] + digit


def precise(fraction_or_sqrt: tuple[str, int, int]) -> Decimal:
    """p/q or sqrt(n) to 60 significant digits (the decimal module rounds correctly)."""
    kind, a, b = fraction_or_sqrt
    with localcontext() as ctx:
        ctx.prec = 60
        return Decimal(a) / Decimal(b) if kind == "frac" else Decimal(a).sqrt()


# ----------------------------------------------------------------------------- decimals against decimals


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wrong_last_written_digit_is_wrong(seed):
    rng = random.Random(seed)
    gold = random_decimal(rng)
    wrong = with_last_digit(gold, rng.choice([d for d in "0123456789" if d != gold[-1]]))
    assert not equal(wrong, gold), (wrong, gold)
    assert equal(gold, gold)


@pytest.mark.parametrize("seed", SEEDS)
def test_trailing_zeros_and_dot_zero_are_right(seed):
    rng = random.Random(seed)
    gold = random_decimal(rng)
    assert equal(gold + "0" * rng.randint(1, 3), gold)
    integer = str(rng.randrange(-(10**6), 10**6))
    assert equal(integer + "." + "0" * rng.randint(1, 3), integer)


@pytest.mark.parametrize("seed", SEEDS)
def test_an_extra_nonzero_digit_is_wrong(seed):
    """100.51 for 100.5: the answer writes a digit the gold states is 0."""
    rng = random.Random(seed)
    gold = random_decimal(rng)
    assert not equal(gold + rng.choice("123456789"), gold)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_coarser_rounding_of_a_decimal_gold_is_wrong(seed):
    """8383.1 for 8383.0999: the gold states more places than the answer, and the answer differs there."""
    rng = random.Random(seed)
    gold = random_decimal(rng)
    places = len(gold.split(".")[1])
    if places < 2:
        return
    coarse = rounded(Decimal(gold), rng.randint(0, places - 1))
    assert Decimal(coarse) != Decimal(gold)  # the gold's last digit is non-zero
    assert not equal(coarse, gold)


# ----------------------------------------------------------------------------- fractions


@pytest.mark.parametrize("seed", SEEDS)
def test_equal_fractions_and_exact_decimals_are_right(seed):
    rng = random.Random(seed)
    p, q = rng.randint(-999, 999), rng.randint(1, 999)
    k = rng.randint(2, 9)
    value = Fraction(p, q)
    assert equal(f"{k * p}/{k * q}", f"\\frac{{{p}}}{{{q}}}")
    if m.has_finite_decimal_expansion(value):
        exact = str(Decimal(value.numerator) / Decimal(value.denominator))
        assert equal(exact, f"\\frac{{{p}}}{{{q}}}")
        if value != 0:  # a terminating value admits no rounding, however many digits it carries
            assert not equal(exact + "1", f"{p}/{q}")


def _non_terminating_fraction(rng: random.Random) -> tuple[int, int]:
    while True:
        p, q = rng.randint(1, 10**6), rng.randint(3, 10**4)
        if not m.has_finite_decimal_expansion(Fraction(p, q)):
            return rng.choice([1, -1]) * p, q


def _rounding_cases(rng: random.Random, value: Decimal) -> tuple[str, str, str]:
    """(right rounding with >= MIN significant digits, same with a wrong last digit, too coarse a rounding)."""
    base = m.MIN_SIGNIFICANT_DIGITS - 1 - value.adjusted()  # places giving MIN significant digits
    places = max(1, base + rng.randint(0, 5))
    right = rounded(value, places)
    wrong = with_last_digit(right, str((int(right[-1]) + rng.choice([1, 9])) % 10))
    coarse = rounded(value, base - 1) if base - 1 >= 1 else None
    if coarse is not None and significant_digits(coarse) >= m.MIN_SIGNIFICANT_DIGITS:
        coarse = None  # rounding carried into a new digit (9.9996 -> 10.000): not too coarse after all
    return right, wrong, coarse


@pytest.mark.parametrize("seed", SEEDS)
def test_rounding_of_a_non_terminating_fraction(seed):
    rng = random.Random(seed)
    p, q = _non_terminating_fraction(rng)
    right, wrong, coarse = _rounding_cases(rng, precise(("frac", p, q)))
    gold = f"\\frac{{{p}}}{{{q}}}" if p > 0 else f"-\\frac{{{-p}}}{{{q}}}"
    assert significant_digits(right) >= m.MIN_SIGNIFICANT_DIGITS
    assert equal(right, gold), (right, gold)
    assert not equal(wrong, gold), (wrong, gold)
    if coarse is not None:
        assert not equal(coarse, gold), (coarse, gold)


@pytest.mark.parametrize("seed", range(25))
def test_rounding_of_a_square_root(seed):
    """Closed forms go through sympy: the same rule on a high-precision value."""
    rng = random.Random(seed)
    n = rng.choice([k for k in range(2, 2000) if int(k**0.5) ** 2 != k])
    right, wrong, coarse = _rounding_cases(rng, precise(("sqrt", n, 0)))
    gold = f"\\sqrt{{{n}}}"
    assert equal(right, gold), (right, gold)
    assert not equal(wrong, gold), (wrong, gold)
    if coarse is not None:
        assert not equal(coarse, gold), (coarse, gold)


def test_min_significant_digits_is_the_threshold():
    assert m.MIN_SIGNIFICANT_DIGITS == 5
    assert equal("0.33333", "\\frac13") and not equal("0.3333", "\\frac13")
    assert equal("3.1416", "\\pi") and not equal("3.142", "\\pi")
    assert equal("333.33", "\\frac{1000}{3}") and not equal("333.3", "\\frac{1000}{3}")
    assert equal("0.000033333", "\\frac{1}{30000}")  # leading zeros are not significant
    assert equal("33.333\\%", "\\frac13")  # the percent reading keeps the digits' precision


def test_rounding_exact_edge_and_unsimplified_closed_forms():
    assert m.round_to_places(Fraction(-5, 2), 0) == -3  # half away from zero
    assert m.round_to_places(Fraction(1234), -2) == 1200  # negative places: hundreds
    assert equal("3.0", "\\log_2 8")  # an exact value sympy leaves unsimplified is compared exactly
    assert not equal("3.00001", "\\log_2 8")
    assert equal("[0, 1.4142]", "[0,\\sqrt{2}]")  # interval endpoints follow the same rule
    assert not equal("[0, 1.4141]", "[0,\\sqrt{2}]")


def test_rel_tol_is_an_explicit_opt_in():
    response = T + "\\boxed{100.51}"
    assert math_reward(response, {"answer": "100.5"}).score == 0.0
    assert math_reward(response, {"answer": "100.5"}, rel_tol=1e-4).score == 1.0
    assert math_reward(T + "\\boxed{3.14}", {"answer": "\\pi"}, rel_tol=1e-3).score == 1.0


# ----------------------------------------------------------------------------- hand cases through math_reward


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("8383.6", "8383.0999", 0.0),
        ("232308.112", "232307.612289", 0.0),
        ("100.51", "100.5", 0.0),
        ("100.50", "100.5", 1.0),
        ("8383.1", "8383.0999", 0.0),  # documented choice: a coarser rounding of a decimal gold is wrong
        ("x**31", "x**3", 0.0),
        ("x**31", "x^{31}", 1.0),
        ("-3920*x**3 + 12348*x**21", "-3920*x**3 + 12348*x**2", 0.0),
        ("-3920*x**3 + 12348*x**21", "-3920x^{3}+12348x^{21}", 1.0),
        ("(1, \\infty) \\cup (-\\infty, 0)", "(-\\infty, 0) \\cup (1, \\infty)", 1.0),
        ("(1, \\infty) \\cup (-\\infty, 0]", "(-\\infty, 0) \\cup (1, \\infty)", 0.0),
    ],
)
def test_math_reward_reads_decimals_exactly_powers_whole_and_unions_unordered(answer, gold, expected):
    result = math_reward(T + "\\boxed{" + answer + "}", {"answer": gold})
    assert result.score == expected, result.info


# ----------------------------------------------------------------------------- powers


@pytest.mark.parametrize(
    "text, latex",
    [
        ("x**31", "x^{31}"),
        ("-3920*x**3 + 12348*x**21", "-3920*x^{3} + 12348*x^{21}"),
        ("2**-3", "2^{-3}"),
        ("(x+1)**(n+1)", "(x+1)^{n+1}"),
        ("e**(-x**2)", "e^{-x^{2}}"),
        ("2**3**2", "2^{3^{2}}"),  # right-associative, as in Python
        ("x**sqrt(2)", "x^{sqrt(2)}"),
        ("x**", "x^"),  # nothing to read: LaTeX's reading
        ("x**(", "x^("),
    ],
)
def test_python_powers_read_the_whole_exponent(text, latex):
    assert m.python_powers_to_latex(text) == latex


def test_latex_superscript_digit_runs_read_whole():
    assert m.normalize_answer("x^31").text == "x^{31}"
    assert m.normalize_answer("2^10").text == "2^{10}"
    assert m.normalize_answer("x^2y").text == "x^{2}y"
    assert m.normalize_answer("\\log_2 8").text == "\\log_{2}8"  # subscripts keep one character


@pytest.mark.parametrize(
    "text, kept",
    [
        ("**42**", "42"),
        ("**42** because", "42 because"),
        ("**x = 5**", "x = 5"),
        ("x**31", "x**31"),
        ("2**10.", "2**10."),
        ("6.02*10**23", "6.02*10**23"),
        ("x ** 2", "x ** 2"),
    ],
)
def test_markdown_bold_is_dropped_but_powers_kept(text, kept):
    assert m.strip_markdown_bold(text) == kept


def test_stated_answer_keeps_its_power():
    assert math_reward(T + "The answer is 2**10.", {"answer": "1024"}).score == 1.0
    assert math_reward(T + "The answer is 2**10.", {"answer": "210"}).score == 0.0
    assert math_reward(T + "The answer is **42**.", {"answer": "42"}).score == 1.0


def test_deep_and_long_power_text_is_bounded():
    """Deep or long `**` text is normalised without a crash (no recursion past MAX_POWER_NESTING) and refused by
    the static length guard before sympy sees it: the reasons show it, where a time bound fails on a loaded
    machine."""
    for text in ("2**" * 5000 + "2", "x**(" * 300, "2**(" * 200 + "1" + ")" * 200, "**" * 30000):
        m.normalize_answer(text)
        result = math_reward(T + "\\boxed{" + text + "}", {"answer": "4"})
        assert (result.score, result.info["reason"]) == (0.0, "wrong_answer")  # not an internal error
        assert m.answers_equal(text, "4") == (False, "too_long")


# ----------------------------------------------------------------------------- unions


def test_unions_are_unordered_sets():
    assert m._sequence_form("(1,\\infty)\\cup(-\\infty,0)") is None  # not a 3-tuple
    assert m._sequence_form("(1,2),(3,4)") == ("", ["(1,2)", "(3,4)"])  # a list of pairs
    assert equal("\\{1,2\\}\\cup\\{3\\}", "\\{1,2,3\\}")
    assert equal("(0,1)\\cup[1,2)", "(0,2)")  # merged by sympy
    assert equal("(1.5, \\infty)\\cup(-\\infty,0)", "(-\\infty,0)\\cup(\\frac32,\\infty)")
    assert not equal("(1,\\infty)\\cup(-\\infty,0)", "(1,\\infty)\\cup(-\\infty,1)")
    assert not equal("(1,\\infty)\\cup(-\\infty,0)", "(1,\\infty)")


# ----------------------------------------------------------------------------- model output never crashes

# fragments of the three constructs this file tests: decimals, Python powers, unions
PIECES = ["**", "(", ")", "x", "2", "31", "\\cup", "\\infty", "-", ".", "0.5", "\\{", "\\}", ",", "^", "{", "}"]
PIECES += ["[", "]", "1e5", "3.14159", "\\pi", "\\sqrt", "\\frac", "%", "*", " "]


@pytest.mark.parametrize("seed", range(40))
def test_structured_junk_never_raises(seed):
    rng = random.Random(seed)
    answer = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 25)))
    gold = rng.choice(["x^{31}", "(-\\infty, 0) \\cup (1, \\infty)", "8383.0999", "\\frac{1}{3}", "\\pi"])
    for response in (T + "\\boxed{" + answer + "}", T + "The answer is " + answer, T + answer):
        result = math_reward(response, {"answer": gold})
        assert result.score in (0.0, 1.0)
    m.answers_equal(gold, answer)
