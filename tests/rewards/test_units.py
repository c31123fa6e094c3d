"""The unit system math and science share (grpo_jax.rewards.units): conversions derived by hand, exact factors,
dimension mismatches and unknown units refused, each reward's case rule, and what each reward reads through it."""

from fractions import Fraction

import pytest

from grpo_jax.rewards import math as m
from grpo_jax.rewards import math_reward, science_reward, units
from grpo_jax.rewards.units import NAMES, PREFIXES, SYMBOLS, UNPREFIXED_SYMBOLS, Unit

T = "<think>work</think>"


def unit(text: str, *, fold_case: bool = False) -> Unit:
    parsed = units.parse_unit(text, fold_case=fold_case)
    assert parsed is not None, text
    return parsed


def ratio(a: str, b: str) -> Fraction:
    """How many `b` one `a` is, exactly; the two must measure one quantity."""
    ua, ub = unit(a), unit(b)
    assert ua.dimension == ub.dimension, (a, b)
    return ua.factor / ub.factor


# ----------------------------------------------------------------------------- conversions by hand


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("mph", "m/s", Fraction("1609.344") / 3600),  # a mile is 1609.344 m, an hour 3600 s
        ("miles per hour", "m/s", Fraction("1609.344") / 3600),
        ("mi/h", "mph", Fraction(1)),
        ("km/h", "m/s", Fraction(5, 18)),  # 1000 m / 3600 s
        ("mph", "km/h", Fraction("1.609344")),  # 1609.344 m / 1000 m, the hours cancel
        ("in", "cm", Fraction("2.54")),  # the inch is 0.0254 m by definition
        ("ft", "in", Fraction(12)),  # 0.3048 / 0.0254
        ("mi", "ft", Fraction(5280)),  # 1609.344 / 0.3048
        ("yd", "ft", Fraction(3)),  # 0.9144 / 0.3048
        ("lb", "oz", Fraction(16)),  # 0.45359237 kg / 0.028349523125 kg
        ("lb", "g", Fraction("453.59237")),
        ("gal", "in^3", Fraction(231)),  # 0.003785411784 m^3 / 0.0254^3 m^3 = 0.003785411784 / 0.000016387064
        ("gal", "cubic inches", Fraction(231)),
        ("L", "cm^3", Fraction(1000)),  # 10^-3 m^3 / (10^-2 m)^3
        ("mL", "cm^3", Fraction(1)),
        ("ml", "mL", Fraction(1)),
        ("day", "h", Fraction(24)),
        ("week", "min", Fraction(7 * 24 * 60)),
        ("hours", "s", Fraction(3600)),
        ("years", "months", Fraction(12)),
        ("dollars", "cents", Fraction(100)),
        ("square feet", "in^2", Fraction(144)),
        ("kPa", "N/m^2", Fraction(1000)),  # Pa = N / m^2
        ("kPa", "kg m^-1 s^-2", Fraction(1000)),  # N = kg m s^-2, so Pa = kg m^-1 s^-2
        ("J", "N m", Fraction(1)),
        ("J", "kg m^2/s^2", Fraction(1)),
        ("kWh", "J", Fraction(3600 * 1000)),  # 1000 W for 3600 s
        ("eV", "J", Fraction("1.602176634e-19")),  # the elementary charge times 1 V, exact since 2019
        ("W", "J/s", Fraction(1)),
        ("V", "W/A", Fraction(1)),
        ("C", "A s", Fraction(1)),
        ("Hz", "s^-1", Fraction(1)),
        ("GHz", "ns^-1", Fraction(1)),  # 10^9 / s = (10^-9 s)^-1
        ("T", "N/(A m)", Fraction(1)),  # the tesla: a force per current and length
        ("J/(mol K)", "kJ/kmol/K", Fraction(1)),  # the denominator in parentheses, or divided twice
        ("mm/s^2", "m/s^2", Fraction(1, 1000)),
        ("kg m^2", "g cm^2", Fraction(1000 * 100 * 100)),  # 1 kg = 1000 g, 1 m^2 = 10^4 cm^2
        ("\\text{m}/\\mathrm{s}", "km/h", Fraction(18, 5)),  # LaTeX groups read as their contents
        ("\\mathrm{N}\\cdot\\mathrm{m}", "J", Fraction(1)),
        ("N.m", "J", Fraction(1)),  # '.' between letters is a product
        ("\u00b5m", "nm", Fraction(1000)),  # micro sign
        ("um", "\u03bcm", Fraction(1)),  # u and the Greek mu are micro too
    ],
)
def test_conversion_derived_by_hand(a, b, expected):
    assert ratio(a, b) == expected


def test_dimensions_are_si():
    assert unit("J").dimension == (("kg", 1), ("m", 2), ("s", -2))
    assert unit("kg m^2").dimension == (("kg", 1), ("m", 2))
    assert unit("m/s^2").dimension == (("m", 1), ("s", -2))
    assert unit("mol").dimension == (("mol", 1),) and unit("K").dimension == (("K", 1),)


# ----------------------------------------------------------------------------- exactness


def _every_unit() -> list[Unit]:
    symbols = [units.si_symbol(p + s) for p in PREFIXES for s in SYMBOLS]
    return [*NAMES.values(), *SYMBOLS.values(), *UNPREFIXED_SYMBOLS.values(), *symbols]


def test_every_factor_is_an_exact_fraction():
    """No float anywhere in the table: math compares converted values as rationals."""
    assert all(type(u.factor) is Fraction for u in _every_unit())
    assert all(type(f) is Fraction for f in PREFIXES.values())
    assert type(unit("mi/h^2").factor) is Fraction


def test_factors_have_no_float_rounding():
    # a float table would round: in floats 0.3048 / 0.0254 is 12.000000000000002 and 0.003785411784 / 0.0254**3
    # is 231.00000000000003; the exact table gives 12 and 231
    assert 0.3048 / 0.0254 != 12 and ratio("ft", "in") == 12
    assert 0.003785411784 / 0.0254**3 != 231 and ratio("gal", "in^3") == 231
    assert unit("pm").factor == Fraction(1, 10**12) and unit("Tm").factor == 10**12
    assert unit("um^-4").factor == Fraction(10**24)  # powers of exact prefixes stay exact
    # math, exactly: a mile is 1.609344 km, not 1.609345 km
    assert m.answers_equal("1 mi", "1.609344 km") == (True, "unit")
    assert not m.answers_equal("1 mi", "1.609345 km")[0]
    assert m.answers_equal("1 oz", "28.349523125 g")[0] and not m.answers_equal("1 oz", "28.349523124 g")[0]
    assert m.answers_equal("1 mph", "0.44704 m/s")[0] and not m.answers_equal("1 mph", "0.447040001 m/s")[0]


def test_science_rounds_a_conversion_once():
    # 9800 * (1/1000) exactly is 9.8: one rounding gives the float nearest 9.8
    assert units.convert_float(9800.0, unit("mm/s^2"), unit("m/s^2")) == 9.8
    assert units.convert_float(float("inf"), unit("km"), unit("m")) == float("inf")
    assert units.convert_float(1e308, unit("Tm"), unit("pm")) == float("inf")  # past the float range, as before


# ----------------------------------------------------------------------------- refused


@pytest.mark.parametrize("a, b", [("m/s", "m/s^2"), ("J", "W"), ("N", "J"), ("Hz", "s"), ("kg", "m"), ("L", "m^2"),
                                  ("years", "days"), ("dollars", "kg"), ("degrees", "s")])
def test_dimension_mismatches_are_refused(a, b):
    assert unit(a).dimension != unit(b).dimension


def test_dimension_mismatch_in_each_reward():
    assert m.answers_equal("5 kg", "5 m") == (False, "unit_mismatch")
    assert m.answers_equal("5\\text{ ft}", "5\\text{ lb}") == (False, "unit_mismatch")
    # an SI symbol against a unit of another dimension: math reads it as before (letters or a label), not equal
    assert not m.answers_equal("5\\text{ J}", "5\\text{ W}")[0] and not m.answers_equal("5 J", "5 kg")[0]
    result = science_reward(T + "Answer: 5 N", {"answer": "5", "unit": "J"})
    assert (result.score, result.info["reason"]) == (0.0, "unit_mismatch")
    result = science_reward(T + "Answer: 10 inches", {"answer": "10", "unit": "s"})
    assert (result.score, result.info["reason"]) == (0.0, "unit_mismatch")


@pytest.mark.parametrize("text", ["furlongs", "m furlong", "parsec", "ohm", "m^5", "mm^-999", "m^9^9", "(kg m)/s",
                                  "^2", "kg m2", "square", "KPA", "pa", "hz"])
def test_unknown_units_are_refused(text):
    assert units.parse_unit(text, fold_case=False) is None


def test_unknown_units_score_as_each_reward_reports_today():
    # science: a unit it does not understand is `unit_mismatch`
    result = science_reward(T + "Answer: 9.8 furlongs", {"answer": "9.8", "unit": "m/s^2"})
    assert (result.score, result.info["reason"]) == (0.0, "unit_mismatch")
    # math: an unknown word is no unit, it stays letters: '5furlongs' is not 5 m
    assert m.normalize_answer("5 furlongs").unit is None
    assert m.answers_equal("5 furlongs", "5 m") == (False, "symbolic")
    assert math_reward(T + "\\boxed{5 furlongs}", {"answer": "5 m"}).info["reason"] == "wrong_answer"


# ----------------------------------------------------------------------------- each reward's case rule


def test_case_rules():
    # math folds the case of names first: 'Mm', 'MS' and 'CM' are what a lower-case writer meant
    assert unit("Mm", fold_case=True) == NAMES["mm"] and unit("MS", fold_case=True) == NAMES["ms"]
    assert unit("kPa", fold_case=True).factor == 1000  # then SI symbols, as written
    # science reads SI symbols as written first: 'Mm' is a megametre, 'Ms' a megasecond; names as written
    assert unit("Mm").factor == 10**6 and unit("Ms").factor == 10**6
    assert unit("in") == NAMES["in"] and units.parse_unit("IN", fold_case=False) is None
    # a symbol's end is tried in order: 'Tm' a terametre, 'T' a tesla, 'mT' a millitesla, 'min' a minute
    assert unit("Tm").dimension == (("m", 1),) and unit("T").dimension == unit("mT").dimension
    assert unit("min") == unit("minutes") and unit("min") == unit("min", fold_case=True)


def test_names_and_symbols_agree_where_both_read_a_word():
    for name, named in NAMES.items():
        symbol = units.si_symbol(name)
        assert symbol is None or symbol == named, name


# ----------------------------------------------------------------------------- what each reward now reads


@pytest.mark.parametrize(
    "text, sample",
    [
        ("Answer: 10 inches", {"answer": "25.4", "unit": "cm"}),
        ("Answer: 60 mph", {"answer": "96.56", "unit": "km/h"}),
        ("Answer: 2 days", {"answer": "48", "unit": "h"}),
        ("Answer: 5 N m", {"answer": "5", "unit": "J"}),
        ("Answer: 50 Hz", {"answer": "50", "unit": "s^-1"}),
        ("Answer: 1 eV", {"answer": "1.602e-19", "unit": "J"}),
        ("Answer: 2 L", {"answer": "2000", "unit": "mL"}),
        ("Answer: 9.8 m/s/s", {"answer": "9.8", "unit": "m/s^2"}),
        ("Answer: 1 Mm", {"answer": "1000", "unit": "km"}),  # as before: a megametre
    ],
)
def test_science_reads_the_shared_table(text, sample):
    assert science_reward(T + text, sample).info["reason"] == "correct"


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("5 kPa", "5000 Pa", 1.0),
        ("5\\text{ kPa}", "5000\\text{ Pa}", 1.0),
        ("5 J", "5\\text{ N m}", 1.0),
        ("3 kWh", "10.8 MJ", 1.0),
        ("2 V", "2000 mV", 1.0),
        ("5 J", "5 W", 0.0),  # two units of other dimensions
        ("5\\text{ mPa}", "5\\text{ MPa}", 0.0),  # version 5 read both as the label 'mpa'
        # an SI symbol against an answer without a unit of its dimension: read as before, letters or a label
        ("2 V", "2", 0.0),
        ("\\frac{1}{2} V", "\\frac{V}{2}", 1.0),
        ("2 nm", "2mn", 1.0),
        ("5\\text{ kPa}", "5", 1.0),
        ("5\\text{ kPa}", "5\\text{ KPA}", 1.0),
    ],
)
def test_math_reads_the_shared_table(answer, gold, expected):
    assert math_reward(T + "\\boxed{" + answer + "}", {"answer": gold}).score == expected
