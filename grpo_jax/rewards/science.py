"""Science QA reward: multiple-choice letters and numeric answers with tolerance and optional unit.

Multiple choice (the reference is a letter, or `sample["choices"]` is given): the committed letter is
read from "Answer: C", "the answer is (C)", "\\boxed{C}", or an answer segment that is just "C"/"(C)".
A committed lower-case letter ("Answer: c", "(b)") and a letter after "Option" / "Choice" ("Answer:
Option C") are the option too: a lone committed letter can only name an option (a letter followed by
more words, "Answer: a reaction with water", is still English and names none).
Hedging scores 0: if the committed text names more than one option ("A or C", "ABCD", "A, C") or two
commitments disagree, there is no single answer to grade, and rewarding either would teach the model
to list options.

Numeric (anything else): the committed number (plain, scientific `6.02e23`, `6.02 \\times 10^{23}`)
is compared with relative tolerance `rel_tol` (or `sample["rel_tol"]`). With `sample["unit"]` and a unit
in the answer, the units must measure the same quantity and the value is converted through the unit table
shared with the math reward (units.py): SI symbols with prefixes, read case-sensitively (`km` vs `m`, `Mm` a
megametre, `kPa`, `keV`, `mL`), derived units as their SI dimension (`N m` is `J`, `Hz` is `1/s`, `L` is
`1000 cm^3`, `eV` and `kWh` are energies), compound units (`mm/s^2` vs `m/s^2`, `km/h` vs `m/s`, `kg m^2`,
`J/(mol K)`, `miles per hour`, `square feet`), and unit names (`min`, `h`, `day`, `week`, `in`, `ft`, `mi`,
`mph`, `lb`, `oz`, `gal`, `hours`, ...). The exact factors are rounded to a float once, at the end. A unit of
another quantity (`m/s` against `m/s^2`) or one not understood scores 0 (`unit_mismatch`); an answer
without a unit is read in the reference unit unless `require_unit=True`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grpo_jax.rewards.base import RewardInputError, RewardResult, require, reward
from grpo_jax.rewards.format import assistant_turn, split_response
from grpo_jax.rewards.math import boxed_contents, cut_answer_tail
from grpo_jax.rewards.units import convert_float, parse_unit

SCIENCE_VERSION = "5"  # 2: "Answer: 6.02*10**23" keeps its power (math.cut_answer_tail dropped every `**` as bold);
# 3: lower-case and "Option C" letters are options, compound units convert (9800 mm/s^2 is 9.8 m/s^2);
# 4: a think_prefilled row is read as "<think>" + completion (no </think>: all thinking, no answer);
# 5: one unit table with math (units.py): unit names convert (10 inches is 25.4 cm, mph, days, weeks, pounds,
# gallons, "hours", "miles per hour", "square feet"; v4: unit_mismatch), derived units are their SI dimension
# (5 N m is 5 J, 50 Hz is 50 s^-1, eV and kWh are joules; v4: unit_mismatch), `m/s/s` divides twice

_LETTERS = "ABCDEFGHIJ"
_COMMIT_RE = re.compile(  # bounded look-ahead: linear even on thousands of "Answer:" lines
    r"(?i)\b(?:final\s+answer|answer|correct\s+(?:option|choice|answer))\s*(?:is|:|=)\s*:?(?=([^\n]{0,500}))"
)
_PAREN_RE = re.compile(r"\(([A-J])\)")
_NUM = r"[-+\u2212]?(?:\d+(?:\.\d*)?|\.\d+)"
_SCI_RE = re.compile(
    rf"^\s*({_NUM})(?:\s*(?:[eE]\s*({_NUM})|(?:\\times|\\cdot|\*|x|\u00d7)\s*10\s*(?:\^|\*\*)\s*\{{?\s*({_NUM})\s*\}}?))?\s*(.*)$"
)


# ------------------------------------------------------------------------------------ multiple choice


def _letters_in(text: str, valid: str) -> set[str]:
    """Option letters named by a committed answer text: 'C', '(C)', 'c', 'Option C', 'A or C', 'ABCD', 'A, C'.

    A letter that starts a word ('Carbon') or an English sentence ('I think ...', 'a reaction') is not
    an option.
    """
    text = re.sub(r"\\text(?:bf)?\{([^{}]*)\}", r"\1", text)
    text = text.replace("*", "").replace("$", "").strip()
    if re.fullmatch(rf"[{valid}]{{2,}}", text):  # 'ABCD'
        return set(text)
    text = re.sub(r"(?i)^(?:option|choice)s?\b\s*:?\s*", "", text)  # 'Option C', 'choice (c)'
    option = rf"\(?[{valid}{valid.lower()}]\)?"
    m = re.match(rf"({option}(?:\s*(?:,|/|\bor\b|\band\b|&)\s*{option})*)(.*)$", text, re.DOTALL)
    if m is None:
        return set()
    rest = m.group(2)
    if rest and not re.match(r"[\s.:),;]", rest):
        return set()
    if re.match(r"\s+[a-z]", rest) and not re.match(r"\s+(?:is|because|since|as|which|with)\b", rest):
        return set()
    letters = re.findall(rf"(?<![A-Za-z])[{valid}{valid.lower()}](?![A-Za-z])", m.group(1))  # not 'and', 'or'
    return {letter.upper() for letter in letters}


def extract_choice(segment: str, valid: str = _LETTERS) -> tuple[set[str], str]:
    """(letters committed, rule). More than one letter means the answer is hedged."""
    committed: list[set[str]] = []
    for box in boxed_contents(segment):
        committed.append(_letters_in(box or "", valid))
    for m in _COMMIT_RE.finditer(segment):
        letters = _letters_in(m.group(1), valid)
        if letters:
            committed.append(letters)
    if committed:
        return set().union(*committed), "committed"
    bare = segment.strip()
    if len(bare) <= 8:
        letters = _letters_in(bare, valid)
        if letters:
            return letters, "bare"
    return set(_PAREN_RE.findall(segment)) & set(valid), "parenthesised"


# ------------------------------------------------------------------------------------ numeric


def parse_quantity(text: str) -> tuple[float, str] | None:
    """'6.02 \\times 10^{23} mol^-1' -> (6.02e23, 'mol^-1'); None if it does not start with a number."""
    text = text.replace("$", "").replace("\\,", "").replace("\\ ", " ").replace("{,}", "").strip()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    m = _SCI_RE.match(text)
    if not m:
        return None
    mantissa, e1, e2, unit = m.groups()
    exponent = e1 or e2 or "0"
    try:
        value = float(mantissa.replace("\u2212", "-")) * 10.0 ** float(exponent.replace("\u2212", "-"))
    except (OverflowError, ValueError):
        return None
    unit = re.sub(r"\\(?:text|mathrm)\{([^{}]*)\}", r"\1", unit).strip().rstrip(".").strip()
    return value, unit


def _convert(value: float, unit: str, target: str) -> float | None:
    """`value` in `unit` expressed in `target`, or None if the units are not the same quantity."""
    if unit.replace(" ", "") == target.replace(" ", ""):
        return value
    a, b = parse_unit(unit, fold_case=False), parse_unit(target, fold_case=False)  # symbols case-sensitively
    if a is None or b is None or a.dimension != b.dimension:
        return None
    return convert_float(value, a, b)


def _numeric_candidates(segment: str) -> list[str]:
    boxes = [b for b in boxed_contents(segment) if b is not None]
    stated = [t for t in (cut_answer_tail(m.group(1)) for m in _COMMIT_RE.finditer(segment)) if t]
    if boxes or stated:
        return boxes + stated
    bare = segment.strip()
    return [bare] if bare and len(bare) <= 64 else []


# ------------------------------------------------------------------------------------ reward


def _is_choice_sample(reference: Any, sample: Mapping[str, Any]) -> bool:
    return "choices" in sample or (isinstance(reference, str) and bool(re.fullmatch(r"\(?[A-J]\)?", reference.strip())))


def _choice_result(segment: str, reference: str, sample: Mapping[str, Any], key: str) -> RewardResult:
    valid = _LETTERS
    if "choices" in sample:
        choices = sample["choices"]
        if not isinstance(choices, (list, tuple)) or not 2 <= len(choices) <= len(_LETTERS):
            raise RewardInputError(f"sample field 'choices' must be a list of 2..{len(_LETTERS)} options")
        valid = _LETTERS[: len(choices)]
    ref = reference.strip().strip("()")
    if ref not in valid:
        raise RewardInputError(f"sample field {key!r} must be one of the option letters {valid!r}, got {reference!r}")
    letters, rule = extract_choice(segment, valid)
    info = {"extracted": "".join(sorted(letters)), "rule": rule, "reference": ref}
    if not letters:
        return RewardResult(0.0, {**info, "reason": "no_answer"})
    if len(letters) > 1:
        return RewardResult(0.0, {**info, "reason": "hedged"})
    correct = letters == {ref}
    return RewardResult(float(correct), {**info, "reason": "correct" if correct else "wrong_answer"})


def _numeric_result(
    segment: str, reference: Any, sample: Mapping[str, Any], key: str, rel_tol: float, require_unit: bool
) -> RewardResult:
    parsed_ref = parse_quantity(str(reference)) if not isinstance(reference, bool) else None
    if parsed_ref is None:
        raise RewardInputError(f"sample field {key!r} must be an option letter or a number, got {reference!r}")
    ref_value, ref_unit = parsed_ref
    unit = sample.get("unit", ref_unit) or ""
    if not isinstance(unit, str):
        raise RewardInputError("sample field 'unit' must be a string")
    tol = sample.get("rel_tol", rel_tol)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or tol < 0:
        raise RewardInputError(f"sample field 'rel_tol' must be a non-negative number, got {tol!r}")
    values = []
    for cand in _numeric_candidates(segment):
        q = parse_quantity(cand)
        if q is None:
            continue
        value, cand_unit = q
        if cand_unit and unit:
            converted = _convert(value, cand_unit, unit)
            if converted is None:
                return RewardResult(0.0, {"reason": "unit_mismatch", "extracted": cand[:100], "unit": unit})
            value = converted
        elif unit and require_unit:
            return RewardResult(0.0, {"reason": "missing_unit", "extracted": cand[:100], "unit": unit})
        values.append(value)
    if not values:
        return RewardResult(0.0, {"reason": "no_answer"})
    if any(abs(v - values[0]) > tol * max(abs(v), abs(values[0])) for v in values[1:]):
        return RewardResult(0.0, {"reason": "multiple_answers", "values": values[:4]})
    ok = abs(values[0] - ref_value) <= tol * max(abs(ref_value), 1e-300) or values[0] == ref_value
    info = {"extracted": values[0], "reference": ref_value, "unit": unit}
    return RewardResult(float(ok), {**info, "reason": "correct" if ok else "wrong_answer"})


@reward("science", SCIENCE_VERSION)
def science_reward(
    response: str,
    sample: Mapping[str, Any],
    *,
    answer_key: str = "answer",
    rel_tol: float = 0.01,
    require_unit: bool = False,
    think_tag: str = "think",
    answer_tag: str = "answer",
) -> RewardResult:
    """1 if the single committed option letter (or number, within tolerance and unit) is right, else 0."""
    reference = require(sample, answer_key, (str, int, float))
    turn = assistant_turn(response, sample, think_tag=think_tag)  # with the prompt's opened <think>
    segment = split_response(turn, think_tag=think_tag, answer_tag=answer_tag).answer
    if _is_choice_sample(reference, sample):
        return _choice_result(segment, str(reference), sample, answer_key)
    return _numeric_result(segment, reference, sample, answer_key, rel_tol, require_unit)
