"""Our math equivalence against math-verify on 165 hand-written pairs (LaTeX and plain forms).

The pairs are labelled with the mathematically right verdict; the test asserts that we agree with
math-verify on every pair except the explicit list of known disagreements below, and that we get the
labelled verdict except where both checkers are known to be wrong.
"""

import pytest

math_verify = pytest.importorskip("math_verify")

from grpo_jax.rewards.math import answers_equal  # noqa: E402

# (prediction, reference): mathematically equal
EQUAL = [
    ("42", "42"),
    ("+5", "5"),
    ("-3", "-3"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    ("1000.0", "1000"),
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{4}", "0.75"),
    ("\\tfrac{2}{4}", "\\frac{1}{2}"),
    ("1/2", "\\frac12"),
    ("\\frac{-1}{2}", "-\\frac{1}{2}"),
    ("\\frac{6}{8}", "\\frac{3}{4}"),
    ("-0.25", "-\\frac14"),
    ("0.1", "\\frac{1}{10}"),
    ("3.50", "3.5"),
    ("2.5\\times10^{2}", "250"),
    ("50\\%", "50"),
    ("5\\text{ cm}", "5"),
    ("\\$18", "18"),
    ("90^\\circ", "90"),
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\sqrt{4}", "2"),
    ("2\\pi", "2\\pi"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("\\frac{\\pi}{3}", "\\frac{1}{3}\\pi"),
    ("x^2+2x+1", "(x+1)^2"),
    ("2x+2", "2(x+1)"),
    ("\\frac{x}{2}", "0.5x"),
    ("a+b", "b+a"),
    ("x^2-1", "(x-1)(x+1)"),
    ("\\left(1,2\\right)", "(1,2)"),
    ("(1,2)", "(1, 2)"),
    ("[0,1)", "[0,1)"),
    ("\\{1,2,3\\}", "\\{3,2,1\\}"),
    ("(-\\infty, 0)", "(-\\infty,0)"),
    ("x=5", "5"),
    ("y = \\frac12", "0.5"),
    ("\\text{Evelyn}", "\\text{Evelyn}"),
    ("7.", "7"),
    ("2^{10}", "1024"),
    ("10^{-2}", "0.01"),
    ("\\sin(\\pi/6)", "\\frac12"),
    ("\\cos 0", "1"),
    ("\\log_2 8", "3"),
    ("\\ln(e)", "1"),
    ("\\infty", "\\infty"),
    ("-\\frac{3}{2}", "-1.5"),
    ("\\frac{10}{4}", "2.5"),
    ("\\frac{22}{7}", "3.142857"),
    ("0.333333", "\\frac{1}{3}"),
    ("\\frac{1}{\\sqrt{3}}", "\\frac{\\sqrt{3}}{3}"),
    ("3\\sqrt{2}", "\\sqrt{18}"),
    ("\\frac{3}{2}", "1.5"),
    ("1.5", "\\frac{3}{2}"),
    ("0", "-0"),
    ("2\\cdot 3", "6"),
    ("4\\times 5", "20"),
    ("\\binom{5}{2}", "10"),
    ("5!", "120"),
    ("|{-3}|", "3"),
    ("(x+y)^2", "x^2+2xy+y^2"),
    ("\\frac{a}{b}", "a/b"),
    ("\\sqrt[3]{27}", "3"),
    ("\\frac{1}{4}", "0.25"),
    ("125\\%", "1.25"),
    ("e^{i\\pi}", "-1"),
    # written precision, exponents read whole, unions unordered
    ("(1, \\infty) \\cup (-\\infty, 0)", "(-\\infty, 0) \\cup (1, \\infty)"),
    ("\\{1,2\\}\\cup\\{3\\}", "\\{1,2,3\\}"),
    ("100.50", "100.5"),
    ("x^31", "x^{31}"),
    ("x**31", "x^{31}"),
    ("3.141593", "\\pi"),
    ("0.66667", "\\frac{2}{3}"),
    # percent read once, units compared, names matched, inequalities as sets, degrees, i, and the rest
    ("50\\%", "50%"),
    ("0.5", "50\\%"),
    ("500\\text{ cm}", "5\\text{ m}"),
    ("2\\text{ kg}", "2000\\text{ g}"),
    ("2\\text{ hours}", "120\\text{ minutes}"),
    ("5", "5\\text{ m}"),
    ("x=2, y=3", "y=3, x=2"),
    ("x=2, y=3", "(2,3)"),
    ("\\cos 30^\\circ", "\\frac{\\sqrt{3}}{2}"),
    ("3<x", "x>3"),
    ("x>3.0", "x>3"),
    ("x>3", "(3,\\infty)"),
    ("x\\geq 3", "[3,\\infty)"),
    ("1<x<2", "(1,2)"),
    ("3+2i", "2i+3"),
    ("(1+i)^2", "2i"),
    ("0.\\overline{3}", "\\frac{1}{3}"),
    ("\\varnothing", "\\emptyset"),
    ("\\{\\}", "\\emptyset"),
    ("{5}", "5"),
    ("\\{5\\}", "5"),
    ("f(x)=x^2", "x^2"),
    ("z1+z2", "z_1+z_2"),
]
# (prediction, reference): mathematically different
UNEQUAL = [
    ("42", "43"),
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("0.5", "0.6"),
    ("10001", "10000"),
    ("\\sqrt{2}", "\\sqrt{3}"),
    ("2\\pi", "\\pi"),
    ("x^2", "x^3"),
    ("(1,2)", "(2,1)"),
    ("(1,2]", "(1,2)"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("-5", "5"),
    ("3.14", "\\pi"),
    ("0.33", "\\frac13"),
    ("1000", "100"),
    ("x+1", "x-1"),
    ("\\frac{\\pi}{2}", "\\pi"),
    ("2^{10}", "1000"),
    ("2.718", "e"),
    ("\\sqrt{4}", "4"),
    ("50\\%", "5"),
    ("a+b", "a-b"),
    ("[0,1]", "[0,1)"),
    ("\\infty", "-\\infty"),
    ("y=5", "6"),
    ("\\text{Evelyn}", "\\text{Alice}"),
    ("1.5", "1.05"),
    ("7", "77"),
    ("2x", "x^2"),
    ("\\frac{3}{4}", "0.7"),
    ("\\sqrt{2}", "1.41"),
    ("-\\frac{1}{2}", "\\frac{1}{2}"),
    ("\\log_2 8", "2"),
    ("\\sin(\\pi/6)", "\\frac{\\sqrt{3}}{2}"),
    ("(0,1)", "(0,1,2)"),
    ("\\{1,2\\}", "\\{1,2,3\\}"),
    ("2\\sqrt{3}", "3\\sqrt{2}"),
    ("12", "21"),
    ("0.01", "0.1"),
    ("1e3", "100"),
    ("x=5", "x=6"),
    ("\\frac{1}{2}x", "2x"),
    ("5!", "100"),
    # a decimal is exact as written; a rounding must be right in its last digit
    ("8383.6", "8383.0999"),
    ("232308.112", "232307.612289"),
    ("100.51", "100.5"),
    ("8383.1", "8383.0999"),
    ("0.66666", "\\frac{2}{3}"),
    ("3.1415", "\\pi"),
    ("x**31", "x**3"),
    ("x^31", "x^3"),
    ("-3920*x**3 + 12348*x**21", "-3920*x**3 + 12348*x**2"),
    # percent read once, units compared, names matched, degrees kept, digits kept in names
    ("50\\%", "0.5\\%"),
    ("4s", "4"),
    ("5\\text{ m}", "5\\text{ cm}"),
    ("2\\text{ kg}", "2\\text{ g}"),
    ("2\\text{ hours}", "2\\text{ minutes}"),
    ("5\\text{ kg}", "5\\text{ m}"),
    ("x=2, y=3", "x=3, y=2"),
    ("\\cos 30^\\circ", "\\cos 30"),
    ("3x-2108z1", "3x-2108z"),
    ("x>3", "[3,\\infty)"),
    ("x>3", "x<3"),
    ("3+2i", "3-2i"),
    ("0.\\overline{3}", "0.3"),
    ("\\emptyset", "\\{0\\}"),
    ("f(x)=x^2", "x^3"),
]

# Pairs where we and math-verify differ, with the reason. Empty means full agreement.
KNOWN_DISAGREEMENTS: dict[tuple[str, str], str] = {
    ("x**31", "x^{31}"): "math-verify does not read Python's ** in LaTeX; we do (math.python_powers_to_latex)",
    ("-3920*x**3 + 12348*x**21", "-3920*x**3 + 12348*x**2"): (
        "math-verify cannot parse ** in LaTeX and falls back to the first number, 12348, on both sides"
    ),
    ("0.66667", "\\frac{2}{3}"): (
        "math-verify rounds both sides at 6 decimal places; we accept a rounding with 5 significant digits"
    ),
    ("e^{i\\pi}", "-1"): "math-verify parses i as a variable; we read it as the imaginary unit",
    ("(1+i)^2", "2i"): "math-verify parses i as a variable; we read it as the imaginary unit",
    ("500\\text{ cm}", "5\\text{ m}"): "math-verify drops units; we convert between units of one dimension",
    ("2\\text{ kg}", "2000\\text{ g}"): "math-verify drops units; we convert between units of one dimension",
    ("2\\text{ hours}", "120\\text{ minutes}"): "math-verify drops units; we convert between units of one dimension",
    ("5\\text{ m}", "5\\text{ cm}"): "math-verify drops units, so 5 m is 5 cm; we compare them",
    ("2\\text{ kg}", "2\\text{ g}"): "math-verify drops units, so 2 kg is 2 g; we compare them",
    ("2\\text{ hours}", "2\\text{ minutes}"): "math-verify drops units, so 2 hours is 2 minutes; we compare them",
    ("5\\text{ kg}", "5\\text{ m}"): "math-verify drops units; a mass is not a length",
    ("4s", "4"): (
        "math-verify drops a unit letter written against the number; we keep it unless the gold has a time unit"
    ),
    ("\\cos 30^\\circ", "\\frac{\\sqrt{3}}{2}"): "math-verify drops the degree sign, reading cos(30 radians)",
    ("\\cos 30^\\circ", "\\cos 30"): "math-verify drops the degree sign, reading cos(30 radians) on both sides",
    ("x>3", "(3,\\infty)"): "math-verify does not read an inequality as the set it describes; we do",
    ("x\\geq 3", "[3,\\infty)"): "math-verify does not read an inequality as the set it describes; we do",
    ("1<x<2", "(1,2)"): "math-verify does not read an inequality as the set it describes; we do",
    ("0.\\overline{3}", "\\frac{1}{3}"): "math-verify cannot parse \\overline; we read the fraction it stands for",
    ("\\varnothing", "\\emptyset"): "math-verify parses \\varnothing as a variable; it is the empty set",
    ("z1+z2", "z_1+z_2"): "math-verify reads z1 as z times 1; we read it as the name z_1",
    ("3x-2108z1", "3x-2108z"): "math-verify reads z1 as z times 1, so it equals z; we read it as the name z_1",
}

# Pairs where both checkers miss the right verdict, with the reason. Empty: none at present.
KNOWN_BOTH_WRONG: dict[tuple[str, str], str] = {}


def math_verify_equal(pred: str, ref: str) -> bool:
    wrap = lambda s: math_verify.parse("$" + s + "$")  # noqa: E731 - LaTeX extraction of both sides
    return bool(math_verify.verify(wrap(ref), wrap(pred)))


def test_case_set_is_large_enough():
    assert len(EQUAL) + len(UNEQUAL) >= 165
    assert len(set(EQUAL + UNEQUAL)) == len(EQUAL) + len(UNEQUAL)


def test_agreement_with_math_verify():
    unexpected, agree = [], 0
    pairs = [(p, r, True) for p, r in EQUAL] + [(p, r, False) for p, r in UNEQUAL]
    for pred, ref, _ in pairs:
        ours, theirs = answers_equal(pred, ref)[0], math_verify_equal(pred, ref)
        agree += ours == theirs
        if ours != theirs and (pred, ref) not in KNOWN_DISAGREEMENTS:
            unexpected.append((pred, ref, ours, theirs))
    print(f"\nmath-verify agreement: {agree}/{len(pairs)} = {agree / len(pairs):.1%}")
    assert not unexpected, f"disagreements with math-verify (pred, ref, ours, math-verify): {unexpected}"
    stale = [k for k in KNOWN_DISAGREEMENTS if answers_equal(*k)[0] == math_verify_equal(*k)]
    assert not stale, f"listed disagreements that now agree (remove them): {stale}"


def test_verdicts_match_labels():
    wrong = [
        (p, r, label)
        for p, r, label in [(p, r, True) for p, r in EQUAL] + [(p, r, False) for p, r in UNEQUAL]
        if answers_equal(p, r)[0] != label and (p, r) not in KNOWN_BOTH_WRONG
    ]
    assert not wrong, f"wrong verdicts (pred, ref, expected): {wrong}"
    for pair in KNOWN_BOTH_WRONG:  # still wrong for both; if one gets fixed, update the lists
        assert answers_equal(*pair)[0] is False and math_verify_equal(*pair) is False
