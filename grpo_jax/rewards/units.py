"""The unit system the rewards that read quantities share (math, science): one table, one parser.

A unit is a `Unit(dimension, factor)`: `dimension` a sorted tuple of (base, power) over the SI base units
(m, kg, s, A, K, mol) and a few bases of their own that convert to nothing else (month, dollar, degree,
celsius, fahrenheit), and `factor` the unit's size in those bases as an exact `Fraction` (km: 1000, g: 1/1000,
mph: 1609.344/3600, eV: 1.602176634e-19). Every factor is exact by definition of the unit (the inch is
0.0254 m, the pound 0.45359237 kg, the US gallon 3.785411784 L, the electronvolt 1.602176634e-19 J), so math
compares converted values as rationals; science converts them to a float with `convert_float`.

Two tables:
- SI symbols, case-sensitive, each with any of the prefixes in `PREFIXES` (`km`, `kPa`, `mmol`, `GHz`, `keV`,
  `kWh`, `mL`, `µs`); `min` and `h` without a prefix. Derived units are their SI dimension: N is kg m s^-2,
  J = N m = kg m^2 s^-2, W = J/s, Pa = N/m^2, Hz = 1/s, C = A s, V = W/A, T = kg s^-2 A^-1, L = 10^-3 m^3.
- names (lower case): `in`, `inch`, `ft`, `mile`, `mph`, `kph`, `day`, `week`, `lb`, `oz`, `gal`, `meters`,
  `hours`, ...; months and years convert to each other but not to days (a month has no fixed length), money
  between dollars and cents only.

`parse_unit` reads a unit text: words multiplied (by spaces, `*`, `\\cdot`, a middle dot, or `.` between
letters), everything after a `/` or `per` dividing (`J/(mol K)`, `m/s/s`), powers `^2`, `^{-1}`, `^-2` on the
word before them (at most MAX_POWER in size), `sq` / `square` / `cubic` before a word, `\\text{}`, `\\mathrm{}`,
`\\mbox{}` groups read as their contents, and `unit(s)` as NO_UNIT (a count that states no unit). It returns None
when any word is not a unit: there is no partial reading.

Case. The two rewards read a word's case differently, each as it did before they shared this table:
`fold_case=True` (math) looks a word up in the names case-insensitively first, then as an SI symbol as
written (`MM` and `Mm` are millimetres, `kPa` kilopascals); `fold_case=False` (science) reads an SI symbol as
written first, then a name as written (`Mm` is a megametre, `Ms` a megasecond, `in` an inch, `IN` nothing).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NamedTuple


class Unit(NamedTuple):
    """What a unit measures and its size: `dimension` is a sorted tuple of (base unit, power), e.g.
    (('m', 1), ('s', -1)) for a speed, and `factor` the unit's size in those base units (km: 1000)."""

    dimension: tuple[tuple[str, int], ...]
    factor: Fraction


def _unit(dimension: str, size: str) -> Unit:
    """_unit('kg m2 s-2', '1') -> dimension (('kg', 1), ('m', 2), ('s', -2)), factor 1, from a table row."""
    powers = tuple((b, int(p or 1)) for b, p in re.findall(r"([A-Za-z]+)(-?\d*)", dimension))
    return Unit(tuple(sorted(powers)), Fraction(size))


PREFIXES = {  # SI prefixes a symbol takes: k, M, G, T up; c, m, u / µ / μ (micro), n, p down
    "": Fraction(1),
    "k": Fraction(10) ** 3,
    "M": Fraction(10) ** 6,
    "G": Fraction(10) ** 9,
    "T": Fraction(10) ** 12,
    "c": Fraction(10) ** -2,
    "m": Fraction(10) ** -3,
    "u": Fraction(10) ** -6,
    "\u00b5": Fraction(10) ** -6,
    "\u03bc": Fraction(10) ** -6,
    "n": Fraction(10) ** -9,
    "p": Fraction(10) ** -12,
}
# Symbols that take a prefix, in the order a word's end is tried against them ('mol' before 'm', 'eV' and 'Wh'
# before 'V' and 'W'; 'T' after all of them, so 'Tm' is a terametre and 'T' alone a tesla).
SYMBOLS = {
    "mol": _unit("mol", "1"),
    "Hz": _unit("s-1", "1"),
    "Pa": _unit("kg m-1 s-2", "1"),
    "eV": _unit("kg m2 s-2", "1.602176634e-19"),  # the 2019 SI value, exact
    "Wh": _unit("kg m2 s-2", "3600"),
    "m": _unit("m", "1"),
    "g": _unit("kg", "0.001"),
    "s": _unit("s", "1"),
    "J": _unit("kg m2 s-2", "1"),
    "N": _unit("kg m s-2", "1"),
    "W": _unit("kg m2 s-3", "1"),
    "V": _unit("kg m2 s-3 A-1", "1"),
    "A": _unit("A", "1"),
    "K": _unit("K", "1"),
    "L": _unit("m3", "0.001"),
    "C": _unit("A s", "1"),
    "T": _unit("kg s-2 A-1", "1"),
}
UNPREFIXED_SYMBOLS = {"min": _unit("s", "60"), "h": _unit("s", "3600")}  # time symbols without a prefix

# (dimension, size, spellings) of the names; every spelling is lower case.
_NAME_ROWS = (
    ("m", "1", "m meter meters metre metres"),
    ("m", "0.001", "mm millimeter millimeters millimetre millimetres"),
    ("m", "0.01", "cm centimeter centimeters centimetre centimetres"),
    ("m", "1000", "km kilometer kilometers kilometre kilometres"),
    ("m", "0.0254", "in inch inches"),
    ("m", "0.3048", "ft foot feet"),
    ("m", "0.9144", "yd yard yards"),
    ("m", "1609.344", "mi mile miles"),
    ("kg", "0.001", "g gram grams"),
    ("kg", "0.000001", "mg milligram milligrams"),
    ("kg", "1", "kg kilogram kilograms"),
    ("kg", "0.45359237", "lb lbs pound pounds"),
    ("kg", "0.028349523125", "oz ounce ounces"),  # a sixteenth of the pound
    ("s", "1", "s sec secs second seconds"),
    ("s", "0.001", "ms millisecond milliseconds"),
    ("s", "60", "min mins minute minutes"),
    ("s", "3600", "h hr hrs hour hours"),
    ("s", "86400", "day days"),
    ("s", "604800", "week weeks"),
    ("m3", "0.000001", "ml milliliter milliliters millilitre millilitres"),
    ("m3", "0.001", "l liter liters litre litres"),
    ("m3", "0.003785411784", "gal gallon gallons"),
    ("m s-1", "0.44704", "mph"),  # 1609.344 m / 3600 s
    ("m s-1", "5/18", "kph kmh"),  # 1000 m / 3600 s
    ("month", "1", "month months"),
    ("month", "12", "year years yr yrs"),
    ("dollar", "1", "dollar dollars"),
    ("dollar", "0.01", "cent cents"),
    ("degree", "1", "degree degrees deg"),
)
NAMES = {name: _unit(dimension, size) for dimension, size, names in _NAME_ROWS for name in names.split()}
DEGREE = NAMES["degree"]  # an angle in degrees: not converted to radians
CELSIUS = _unit("celsius", "1")  # temperature scales: their zeros differ, so neither converts to another
FAHRENHEIT = _unit("fahrenheit", "1")
NO_UNIT = Unit((), Fraction(1))  # 'units', 'square units': a count with no stated unit
MAX_POWER = 4  # 'cm^9^9^9' is no unit: its size would be a 10^1500-digit fraction

# The names and the words that stand before or for one ('square feet', '12 units'), as a regex.
NAME_PATTERN = "|".join(sorted([*NAMES, "sq", "square", "cubic", "unit", "units"], key=len, reverse=True))


def si_symbol(word: str) -> Unit | None:
    """The unit an SI symbol names, case-sensitively: 'kPa' -> 1000 Pa, 'min' -> 60 s; None if it names none."""
    if word in UNPREFIXED_SYMBOLS:
        return UNPREFIXED_SYMBOLS[word]
    for symbol, unit in SYMBOLS.items():
        if word.endswith(symbol) and word[: -len(symbol)] in PREFIXES:
            return Unit(unit.dimension, unit.factor * PREFIXES[word[: -len(symbol)]])
    return None


def lookup(word: str, *, fold_case: bool, symbols: bool = True) -> Unit | None:
    """The unit one word names (see "Case" in the module docstring for `fold_case`), None if it names none;
    with `symbols=False` the names only."""
    if not symbols:
        return NAMES.get(word.lower() if fold_case else word)
    if fold_case:
        return NAMES.get(word.lower()) or si_symbol(word)
    return si_symbol(word) or NAMES.get(word)


def combine(parts: list[tuple[Unit, int]]) -> Unit:
    """The product of units raised to powers: [(km, 1), (h, -1)] -> a speed of 5/18 m/s."""
    powers: dict[str, int] = {}
    factor = Fraction(1)
    for unit, power in parts:
        factor *= unit.factor**power
        for base, p in unit.dimension:
            powers[base] = powers.get(base, 0) + p * power
    return Unit(tuple(sorted((b, p) for b, p in powers.items() if p)), factor)


_LATEX_GROUP_RE = re.compile(r"\\(?:text|mbox|mathrm)\s*\{([^{}]*)\}")
_DOT_RE = re.compile(r"(?<=[A-Za-z}\d])\.(?=[A-Za-z])")  # 'N.m' is N m
_TOKEN_RE = re.compile(
    r"\s*(?:([A-Za-z\u00b5\u03bc]+)|(/)|\^\s*\{?\s*([-+]?\d{1,4})\s*\}?|\\cdot|\*|\u00b7)"
)


def _prepare(text: str) -> str:
    """LaTeX groups read as their contents, '.' between letters as a product, the parentheses around
    what follows the first '/' dropped ('J/(mol K)' -> 'J/mol K': everything after a '/' divides anyway)."""
    text = _DOT_RE.sub(" ", _LATEX_GROUP_RE.sub(r" \1 ", text)).strip()
    head, slash, tail = text.partition("/")
    return (head + slash + tail.strip().strip("()")).strip() if slash else text


def parse_unit(text: str, *, fold_case: bool, symbols: bool = True) -> Unit | None:
    """The unit a text names: 'cm', 'km/h', 'm/s^2', 'kg m^2', 'J/(mol K)', 'miles per hour', 'square feet',
    '\\text{m}/\\mathrm{s}'. None when any word is not a unit (with `symbols=False`: not a name); NO_UNIT for
    'units' / 'square units'."""
    parts: list[tuple[Unit, int]] = []
    sign, pending, pos, text = 1, 1, 0, _prepare(text)
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            return None
        pos = m.end()
        word, slash, power = m.group(1, 2, 3)
        key = word.lower() if word and fold_case else word
        if slash or key == "per":
            sign = -1
        elif power is not None:
            if not parts or abs(parts[-1][1] * int(power)) > MAX_POWER:
                return None
            parts[-1] = (parts[-1][0], parts[-1][1] * int(power))
        elif key in ("sq", "square", "cubic"):
            pending = 3 if key == "cubic" else 2
        elif word:
            unit = NO_UNIT if key in ("unit", "units") else lookup(word, fold_case=fold_case, symbols=symbols)
            if unit is None:
                return None
            parts.append((unit, pending * sign))
            pending = 1
    return combine(parts) if parts else None


def convert_float(value: float, unit: Unit, target: Unit) -> float:
    """`value` in `unit` expressed in `target` (same dimension), rounded once: the exact ratio of the two factors
    times the exact value of the float, then one rounding to a float (inf and nan are scaled as floats)."""
    ratio = unit.factor / target.factor
    if math.isfinite(value):
        try:
            return float(Fraction(value) * ratio)
        except OverflowError:  # past the float range: inf, as the float product gives it
            pass
    return value * float(ratio)
