"""Math reward: units, percent, named values, degrees, names with digits, inequalities, i, repeating decimals,
empty and one-element sets, function definitions (the rules in the module docstring of grpo_jax.rewards.math).

Each rule has hand cases through `math_reward` and a property over seeded random inputs (no hypothesis
dependency), so a failure names its seed. Wrong answers that a rule must reject sit next to the right ones
it must accept: a rule that accepted everything would fail the first, one that accepted nothing the second.
"""

import random
from decimal import Decimal
from fractions import Fraction

import pytest

from grpo_jax.rewards import math as m
from grpo_jax.rewards import math_reward

T = "<think>work</think>"
SEEDS = range(40)


def equal(a: str, b: str) -> bool:
    """answers_equal in both directions; the two must agree (equality is symmetric)."""
    ab, ba = m.answers_equal(a, b)[0], m.answers_equal(b, a)[0]
    assert ab == ba, f"asymmetric: {a!r} vs {b!r}: {ab} / {ba}"
    return ab


def decimal_text(x: Fraction) -> str:
    """A terminating Fraction as a plain decimal string (no exponent)."""
    return format(Decimal(x.numerator) / Decimal(x.denominator), "f")


def random_positive_decimal(rng: random.Random) -> Fraction:
    """A positive decimal with 0-3 places whose last written digit is not 0."""
    places = rng.randint(0, 3)
    digits = rng.randrange(1, 10 ** rng.randint(1, 5)) * 10 + rng.randint(1, 9) if places else rng.randrange(1, 10**5)
    return Fraction(digits, 10**places)


def exact_text(x: Fraction) -> str:
    """`x` as a decimal when it terminates, else as \\frac{p}{q}."""
    if m.has_finite_decimal_expansion(x):
        return decimal_text(x)
    return f"\\frac{{{x.numerator}}}{{{x.denominator}}}"


# ----------------------------------------------------------------------------- percent


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("50\\%", "50\\%", 1.0),
        ("50%", "50\\%", 1.0),
        ("50", "50\\%", 1.0),  # the number of percent without its sign
        ("0.5", "50\\%", 1.0),  # the fraction 50% stands for
        ("\\frac{1}{2}", "50\\%", 1.0),
        ("0.5\\%", "50\\%", 0.0),  # a % on both sides: compared as written
        ("5000\\%", "50\\%", 0.0),
        ("0.5\\%", "50", 0.0),
    ],
)
def test_percent_is_read_once(answer, gold, expected):
    assert math_reward(T + "\\boxed{" + answer + "}", {"answer": gold}).score == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_percent_property(seed):
    rng = random.Random(seed)
    p = random_positive_decimal(rng)
    text = decimal_text(p)
    assert equal(text + "\\%", text + "%") and equal(text + "\\%", text)
    assert equal(text + "\\%", decimal_text(p / 100))
    assert not equal(text + "\\%", decimal_text(p / 100) + "\\%")  # 50% is never 0.5%
    assert not equal(text + "\\%", decimal_text(p * 100) + "\\%")


# ----------------------------------------------------------------------------- units


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("5\\text{ m}", "5 cm", 0.0),
        ("500\\text{ cm}", "5\\text{ m}", 1.0),
        ("2 kg", "2 g", 0.0),
        ("2 kg", "2000 g", 1.0),
        ("2 hours", "2 minutes", 0.0),
        ("2 hours", "120 minutes", 1.0),
        ("5\\text{ kg}", "5\\text{ m}", 0.0),  # different dimensions
        ("5", "5\\text{ m}", 1.0),  # a bare number is read in the gold's unit
        ("5 m", "5", 1.0),
        ("4s", "4", 0.0),  # letters against the number are letters here: 4 times s
        ("4", "4s", 0.0),
        ("4s", "4 s", 1.0),  # ... and a unit where the other side has one of that dimension
        ("240s", "4\\text{ min}", 1.0),
        ("12cm", "12 cm", 1.0),
        ("5\\text{ apples}", "5\\text{ oranges}", 0.0),
        ("5\\text{ apples}", "5", 1.0),
        ("6 cm^2", "600 mm^2", 1.0),
        ("6 cm^2", "6 cm", 0.0),
        ("5 m/s", "18 km/h", 1.0),
        ("12 square units", "12", 1.0),
        ("0.33333 h", "20 min", 1.0),  # written precision in the answer's unit
        ("(3 cm, 4 cm)", "(30 mm, 40 mm)", 1.0),
        ("90^\\circ", "90", 1.0),
        ("90^\\circ", "\\frac{\\pi}{2}", 0.0),  # degrees are not compared with radians
        ("100^\\circ C", "100^\\circ F", 0.0),
    ],
)
def test_units_are_compared(answer, gold, expected):
    assert math_reward(T + "\\boxed{" + answer + "}", {"answer": gold}).score == expected


def _units_by_dimension() -> dict[tuple, list[str]]:
    groups: dict[tuple, list[str]] = {}
    for name, unit in m._UNITS.items():
        groups.setdefault(unit.dimension, []).append(name)
    return groups


UNITS_BY_DIMENSION = _units_by_dimension()
CONVERTIBLE = [names for names in UNITS_BY_DIMENSION.values() if len({m._UNITS[n].factor for n in names}) > 1]


@pytest.mark.parametrize("seed", range(100))
def test_units_property(seed):
    """Within a dimension: converted values are equal, unconverted ones are not; across: never equal."""
    rng = random.Random(seed)
    names = rng.choice(CONVERTIBLE)
    u1, u2 = rng.sample(names, 2)
    while m._UNITS[u1].factor == m._UNITS[u2].factor:
        u1, u2 = rng.sample(names, 2)
    value = random_positive_decimal(rng)
    converted = value * m._UNITS[u1].factor / m._UNITS[u2].factor
    a = f"{decimal_text(value)}\\text{{ {u1}}}"
    assert equal(a, f"{exact_text(converted)}\\text{{ {u2}}}"), (a, u2)
    assert not equal(a, f"{decimal_text(value)}\\text{{ {u2}}}")
    assert not equal(a, f"{decimal_text(value + 1)}\\text{{ {u1}}}")
    other = rng.choice([n for dim, group in UNITS_BY_DIMENSION.items() if dim != m._UNITS[u1].dimension for n in group])
    assert not equal(a, f"{decimal_text(value)}\\text{{ {other}}}")
    assert equal(a, decimal_text(value))  # a bare number is read in the unit


@pytest.mark.parametrize("seed", SEEDS)
def test_letters_against_a_number_stay_letters_without_a_unit_to_match(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 10**4)
    letter = rng.choice(["s", "m", "g", "h", "l", "cm", "kg", "min"])
    assert not equal(f"{n}{letter}", str(n))
    assert equal(f"{n}{letter}", f"{n} {letter}")


# ----------------------------------------------------------------------------- named values


def test_named_values_match_by_name():
    assert math_reward(T + "\\boxed{x=3, y=2}", {"answer": "x=2, y=3"}).score == 0.0
    assert math_reward(T + "\\boxed{y=3, x=2}", {"answer": "x=2, y=3"}).score == 1.0
    assert math_reward(T + "\\boxed{x=2, y=3}", {"answer": "(2,3)"}).score == 1.0  # names in alphabetical order
    assert math_reward(T + "\\boxed{y=2, x=3}", {"answer": "(2,3)"}).score == 0.0
    assert math_reward(T + "\\boxed{x=2, z=3}", {"answer": "x=2, y=3"}).score == 0.0
    assert math_reward(T + "\\boxed{x=2 \\text{ or } x=3}", {"answer": "2, 3"}).score == 1.0  # one name twice: a set


@pytest.mark.parametrize("seed", SEEDS)
def test_named_values_property(seed):
    rng = random.Random(seed)
    names = rng.sample("abcdfghjkmnpqrstuvwxyz", rng.randint(2, 4))
    values = rng.sample(range(-50, 50), len(names))
    pairs = list(zip(names, values, strict=True))
    gold = ", ".join(f"{n}={v}" for n, v in pairs)
    shuffled = rng.sample(pairs, len(pairs))
    assert equal(", ".join(f"{n} = {v}" for n, v in shuffled), gold)
    i, j = rng.sample(range(len(pairs)), 2)
    swapped = dict(pairs)
    swapped[names[i]], swapped[names[j]] = swapped[names[j]], swapped[names[i]]
    assert not equal(", ".join(f"{n}={v}" for n, v in swapped.items()), gold)
    assert equal("(" + ", ".join(str(v) for _, v in sorted(pairs)) + ")", gold)


# ----------------------------------------------------------------------------- degrees


def test_degree_sign_inside_trig_is_kept():
    assert math_reward(T + "\\boxed{\\cos 30}", {"answer": "\\cos 30^\\circ"}).score == 0.0
    assert math_reward(T + "\\boxed{\\frac{\\sqrt{3}}{2}}", {"answer": "\\cos 30^\\circ"}).score == 1.0
    assert equal("\\sin(30°)", "\\frac12") and equal("\\tan 45^{\\circ}", "1") and equal("\\cos(60^\\circ)", "0.5")


@pytest.mark.parametrize("seed", range(15))
def test_degrees_property(seed):
    rng = random.Random(seed)
    d = rng.randint(1, 359)
    fn = rng.choice(["\\sin", "\\cos", "\\tan"])
    if fn == "\\tan" and d % 180 == 90:
        d += 1
    assert equal(f"{fn} {d}^\\circ", f"{fn}(\\frac{{{d}\\pi}}{{180}})")
    assert not equal(f"{fn} {d}^\\circ", f"{fn} {d}")


# ----------------------------------------------------------------------------- a name with digits


def test_a_name_with_digits_keeps_them():
    assert math_reward(T + "\\boxed{3*x - 2108*z}", {"answer": "3*x - 2108*z1"}).score == 0.0
    assert math_reward(T + "\\boxed{3x - 2108z_1}", {"answer": "3*x - 2108*z1"}).score == 1.0
    assert equal("1e5", "100000") and equal("2.5e3", "2500")  # a number's exponent is not a name


@pytest.mark.parametrize("seed", SEEDS)
def test_name_with_digits_property(seed):
    rng = random.Random(seed)
    letter = rng.choice("abcdfghjkmnpqrstuvwxyzABCDFGHJKMNPQRSTUVWXYZ")
    n, c = rng.randint(1, 999), rng.randint(2, 9999)
    assert not equal(f"{c}*{letter}{n}", f"{c}*{letter}")
    assert not equal(f"{c}{letter}{n}", f"{c}{letter}")
    assert equal(f"{letter}{n}", f"{letter}_{{{n}}}")


# ----------------------------------------------------------------------------- inequalities as sets


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("3<x", "x>3", 1.0),
        ("x>3.0", "x>3", 1.0),
        ("(3,\\infty)", "x>3", 1.0),
        ("x \\in (3, \\infty)", "x>3", 1.0),
        ("[3,\\infty)", "x>3", 0.0),
        ("x<3", "x>3", 0.0),
        ("(1,2)", "1<x<2", 1.0),
        ("(-\\infty,3)\\cup(5,\\infty)", "x<3 \\text{ or } x>5", 1.0),
        ("\\mathbb{R}", "x>1 \\text{ and } x<2", 0.0),
        ("y<x", "x>y", 1.0),
        ("x<y", "x>y", 0.0),
    ],
)
def test_inequalities_compare_as_sets(answer, gold, expected):
    assert math_reward(T + "\\boxed{" + answer + "}", {"answer": gold}).score == expected


OPS = {">": ("<", "({a},\\infty)"), "\\geq": ("\\leq", "[{a},\\infty)"), "<": (">", "(-\\infty,{a})"),
       "\\leq": ("\\geq", "(-\\infty,{a}]")}


@pytest.mark.parametrize("seed", range(25))
def test_inequality_property(seed):
    rng = random.Random(seed)
    a = rng.randint(-50, 50)
    op = rng.choice(list(OPS))
    flipped, interval = OPS[op]
    gold = f"x {op} {a}"
    assert equal(f"{a} {flipped} x", gold) and equal(interval.format(a=a), gold)
    assert not equal(f"x {op} {a + 1}", gold)
    other = {">": "\\geq", "\\geq": ">", "<": "\\leq", "\\leq": "<"}[op]
    assert not equal(f"x {other} {a}", gold)


# ----------------------------------------------------------------------------- the imaginary unit


@pytest.mark.parametrize("seed", range(25))
def test_imaginary_unit_property(seed):
    rng = random.Random(seed)
    a, b = rng.choice([-1, 1]) * rng.randint(1, 20), rng.choice([-1, 1]) * rng.randint(1, 20)
    z = f"{a}{b:+d}i"
    assert equal(f"{b}i{a:+d}", z)
    assert equal(f"({a}{b:+d}i)({a}{-b:+d}i)", str(a * a + b * b))
    assert not equal(f"{a}{-b:+d}i", z)
    assert equal("(1+i)^2", "2i") and equal("i^2", "-1") and not equal("i", "1")


# ----------------------------------------------------------------------------- repeating decimals


def _repeating(p: int, q: int) -> str:
    """p/q (0 < p < q) as '0.<fixed>\\overline{<period>}', by long division."""
    seen, digits, r = {}, [], p
    while r not in seen:
        seen[r] = len(digits)
        digits.append(str(r * 10 // q))
        r = r * 10 % q
    start = seen[r]
    return "0." + "".join(digits[:start]) + "\\overline{" + "".join(digits[start:]) + "}"


@pytest.mark.parametrize("seed", SEEDS)
def test_repeating_decimal_property(seed):
    rng = random.Random(seed)
    while True:
        q = rng.randint(3, 200)
        p = rng.randint(1, q - 1)
        if not m.has_finite_decimal_expansion(Fraction(p, q)):
            break
    text = _repeating(p, q)
    assert equal(text, f"\\frac{{{p}}}{{{q}}}"), text
    assert not equal(text, f"\\frac{{{p + 1}}}{{{q}}}")
    assert math_reward(T + "\\boxed{0.\\overline{3}}", {"answer": "\\frac{1}{3}"}).score == 1.0


# ----------------------------------------------------------------------------- sets and function definitions


def test_empty_set_spellings_are_one_set():
    spellings = ["\\emptyset", "\\varnothing", "\\{\\}", "{}", "\u2205"]
    assert all(equal(a, b) for a in spellings for b in spellings)
    assert not equal("\\emptyset", "\\{0\\}") and not equal("\\varnothing", "0")


@pytest.mark.parametrize("seed", SEEDS)
def test_one_element_set_equals_its_element(seed):
    rng = random.Random(seed)
    n = rng.randint(-999, 999)
    assert equal(f"\\{{{n}\\}}", str(n)) and equal(f"{{{n}}}", str(n)) and equal(f"{{{n}}}", f"\\{{{n}\\}}")
    assert not equal(f"\\{{{n}\\}}", str(n + 1)) and not equal(f"\\{{{n}, {n + 1}\\}}", str(n))


@pytest.mark.parametrize("seed", SEEDS)
def test_function_definition_is_its_right_hand_side(seed):
    rng = random.Random(seed)
    a, b, c = (rng.randint(1, 9) for _ in range(3))
    name, var = rng.choice("fghp"), rng.choice("xtz")
    body = f"{a}{var}^2+{b}{var}+{c}"
    assert equal(f"{name}({var}) = {body}", body)
    assert not equal(f"{name}({var}) = {body}", f"{a}{var}^2+{b}{var}+{c + 1}")
    assert not equal(f"{var}({var}+{a}) = 0", "0")  # an equation, not a definition


# ----------------------------------------------------------------------------- model output never crashes


def test_adversarial_units_periods_and_inequalities_are_bounded():
    """Each input is refused or compared as written, which the result and its reason show (not a time bound,
    which a loaded machine fails)."""
    assert m.normalize_answer("5 cm^9^9^9^9^9^9^9^9").unit is None  # its size would be a 10^1500-digit fraction
    period = "0.\\overline{" + "3" * 10000 + "}"  # int() refuses a 4300-digit string
    assert math_reward(T + "\\boxed{" + period + "}", {"answer": "\\frac13"}).score == 0.0
    assert m.answers_equal(period, "\\frac13") == (False, "too_long")  # the static guard: never parsed
    # not solved (solved, it is (1, oo) and equal), yet compared within the timer (else the reason is "timeout")
    assert m.answers_equal("x^{999} > 1", "(1,\\infty)") == (False, "symbolic")
    assert equal("x^2 > 4", "(-\\infty,-2)\\cup(2,\\infty)")


PIECES = ["5", "0.5", "\\%", "%", " ", "cm", "s", "\\text{ m}", "^\\circ", "\\cos", "x", "=", ",", "y", "<", ">",
          "\\geq", "(", ")", "[", "]", "\\infty", "i", "\\overline{", "}", "{", "\\{", "\\}", "\\emptyset", "z1",
          "f(x)", " or ", "/", "^", "2", "\\frac", "km/h", "\\in", "-"]


@pytest.mark.parametrize("seed", range(60))
def test_structured_junk_never_raises(seed):
    rng = random.Random(seed)
    answer = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 20)))
    gold = rng.choice(["50\\%", "5\\text{ m}", "x=2, y=3", "\\cos 30^\\circ", "x>3", "3+2i", "\\emptyset", "x^2"])
    for response in (T + "\\boxed{" + answer + "}", T + "The answer is " + answer, T + answer):
        result = math_reward(response, {"answer": gold})
        assert result.score in (0.0, 1.0)
    m.answers_equal(gold, answer)
