"""Math reward: extraction, normalisation, equivalence, and the adversarial self-check."""

import signal
import threading
import time

import pytest

from grpo_jax.rewards import MissingFieldError, RewardInputError, math_reward
from grpo_jax.rewards import math as m

T = "<think>work</think>"


@pytest.mark.parametrize(
    "answer_text, reference",
    [
        ("\\boxed{42}", "42"),
        ("\\boxed{\\dfrac{1}{2}}", "0.5"),
        ("\\boxed{\\tfrac{3}{4}}", "\\frac34"),
        ("The answer is $\\frac{3}{4}$.", "0.75"),
        ("Total: 72 clips.\n#### 72", "72"),
        ("<answer>17</answer>", "17"),
        ("\\boxed{1,234}", "1234"),
        ("\\boxed{50\\%}", "0.5"),  # percent reads as 50 or 0.5
        ("The answer is 12 cm.", "12"),
        ("\\boxed{\\$5.00}", "5"),
        ("\\boxed{\\left(1, 2\\right)}", "(1,2)"),
        ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}"),  # symbolic
        ("\\boxed{\\frac{\\sqrt2}{2}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{0.33333}", "1/3"),  # 1/3 rounded at its 5th place, 5 significant digits
        ("Final answer: 7.", "7"),
    ],
)
def test_correct_answers_score_one(answer_text, reference):
    result = math_reward(T + answer_text, {"answer": reference})
    assert result.score == 1.0, result.info


@pytest.mark.parametrize(
    "answer_text, reference, reason",
    [
        ("\\boxed{41}", "42", "wrong_answer"),
        ("\\boxed{10001}", "10000", "wrong_answer"),  # integers compare exactly
        ("\\boxed{0.333}", "1/3", "wrong_answer"),  # 3 significant digits < MIN_SIGNIFICANT_DIGITS
        ("\\boxed{3.14}", "\\pi", "wrong_answer"),  # likewise
        ("\\boxed{(2,1)}", "(1,2)", "wrong_answer"),
        ("\\boxed{(1,2]}", "(1,2)", "wrong_answer"),
        ("The result is 42.", "42", "no_answer"),  # strict: no committed answer
    ],
)
def test_wrong_or_uncommitted_answers_score_zero(answer_text, reference, reason):
    result = math_reward(T + answer_text, {"answer": reference})
    assert result.score == 0.0
    assert result.info["reason"] == reason


def test_last_number_fallback_is_opt_in():
    response = T + "The result is 41, no wait, 42."
    assert math_reward(response, {"answer": "42"}).score == 0.0
    assert math_reward(response, {"answer": "42"}, fallback_last_number=True).score == 1.0


def test_reference_forms():
    assert math_reward(T + "\\boxed{72}", {"answer": 72}).score == 1.0
    assert math_reward(T + "\\boxed{72}", {"answer": "48 + 24 = 72\n#### 72"}).score == 1.0
    assert math_reward(T + "\\boxed{0.5}", {"answer": ["2", "1/2"]}).score == 1.0


def test_bad_sample_is_a_clear_error():
    with pytest.raises(MissingFieldError, match="'answer'"):
        math_reward(T + "\\boxed{4}", {"question": "2+2"})
    with pytest.raises(KeyError):  # MissingFieldError is a KeyError too
        math_reward(T + "\\boxed{4}", {})
    with pytest.raises(RewardInputError, match="empty"):
        math_reward(T + "\\boxed{4}", {"answer": "  "})
    with pytest.raises(RewardInputError, match="solution"):
        math_reward(T + "\\boxed{4}", {"solution": "4"}, answer_key="solution_")  # wrong key named
    with pytest.raises(RewardInputError, match="keyword"):
        math_reward(T + "\\boxed{4}", {"answer": "4"}, tolerance=1)


# ----------------------------------------------------------------------------- adversarial self-check


def test_adversarial_two_different_boxed_answers():
    result = math_reward(T + "It is \\boxed{4} or maybe \\boxed{5}", {"answer": "4"})
    assert (result.score, result.info["reason"]) == (0.0, "multiple_answers")
    # boxed vs stated disagreement is also a hedge
    assert math_reward(T + "The answer is 5. \\boxed{4}", {"answer": "4"}).score == 0.0
    # repeating one answer in two spellings is a single answer
    assert math_reward(T + "\\boxed{4}, i.e. \\boxed{4.0}", {"answer": "4"}).score == 1.0


def test_adversarial_answer_only_in_thinking():
    result = math_reward("<think>so it is \\boxed{4}</think>I am not sure.", {"answer": "4"})
    assert (result.score, result.info["reason"]) == (0.0, "no_answer")
    assert math_reward("<think>\\boxed{4}", {"answer": "4"}).score == 0.0  # never closed


def test_adversarial_empty_and_unbalanced_boxed():
    assert math_reward(T + "\\boxed{}", {"answer": "4"}).info["reason"] == "empty_answer"
    assert math_reward(T + "\\boxed{ }", {"answer": "4"}).score == 0.0
    assert math_reward(T + "\\boxed{\\frac{1}{2}", {"answer": "0.5"}).info["reason"] == "unbalanced_braces"


def test_adversarial_huge_numbers_are_refused_or_compared_as_digits_and_exact():
    """Huge numbers are never computed: long digit runs are compared as digit strings (reason "digits"), and
    towers, huge exponents and factorials are refused by the static guard before sympy sees them (its reason,
    not "timeout" or a hang). The reasons show it whatever the machine's speed; a time bound would not."""
    digits = "9" * 20000  # far beyond int()'s 4300-digit string limit
    assert math_reward(T + "\\boxed{" + digits + "}", {"answer": "4"}).score == 0.0
    assert math_reward(T + "\\boxed{" + digits + "}", {"answer": digits}).score == 1.0
    assert math_reward(T + "\\boxed{" + digits + "8}", {"answer": digits + "9"}).score == 0.0
    assert m.answers_equal(digits, "4") == (False, "digits")
    assert m.answers_equal(digits + "8", digits + "9") == (False, "digits")
    refusals = [("10^{10^{10}}", "power_tower"), ("9^{999999}", "huge_exponent"), ("100000!", "huge_factorial")]
    for huge, refused in refusals:
        assert math_reward(T + "\\boxed{" + huge + "}", {"answer": "1"}).score == 0.0
        assert m.answers_equal(huge, "1") == (False, refused)


@pytest.mark.parametrize("pred, ref", [
    ("575!", "1234"),  # 575! ~ 7.4e1338: as a Python complex it is inf, and inf <= 1e-12 * inf holds
    ("575!", "-3"), ("-575!", "1234"), ("886!4", "886"),  # the forms a policy found under an entropy bonus
    ("2^{999}\\cdot 2^{999}", "3"), ("e^{1000}", "5"), ("999!", "1"),
    ("\\frac{1}{575!}", "0"),  # underflow: no absolute floor, a tiny value is not 0
    ("2^{999}+1", "2^{999}"),  # exact numbers compare exactly, not within 1e-12 relative
])
def test_values_past_the_float_range_are_not_equal_to_everything(pred, ref):
    assert m.answers_equal(pred, ref) == (False, "symbolic")
    assert m.answers_equal(pred, pred)[0]  # and each still equals itself
    assert math_reward(T + f"<answer>{pred}</answer>", {"answer": ref}).score == 0.0


# Answers a policy can write that have no value, an infinite one, or one past the float range, against
# references that are pairwise unequal (far apart, so that no rounding of a written decimal states two).
EXTREME_ANSWERS = ["\\infty", "-\\infty", "oo", "zoo", "nan", "0/0", "\\frac{0}{0}", "\\frac{1}{0}", "1/0",
                   "10^{400}", "10^{-400}", "1e400", "1e-400", "575!", "-575!", "\\frac{1}{575!}",
                   "\\infty-\\infty", "i", "x", "\\emptyset", "\\sqrt{-1}", "e^{10^{5}}", "0^0", "\\log{0}",
                   "0^{-1}", "2^{1024}", "-2^{1024}", "\\tan{\\frac{\\pi}{2}}", "10^{10^{3}}", "10^{400}-10^{400}",
                   "inf", "Infinity", "\\mathbb{R}", "(1,2)", "{}"]
DISTINCT_REFERENCES = ["0", "1", "-1", "2", "1234", "10^{400}", "3\\cdot 10^{400}", "\\frac{1}{575!}",
                       "\\frac{2}{575!}", "\\frac{1}{2}", "\\pi"]


@pytest.mark.parametrize("pred", EXTREME_ANSWERS)
def test_no_answer_equals_two_different_references(pred):
    # An answer can be right for at most one of several unequal references, whatever it is (a value past the
    # float range, such as 575!, must not equal every reference through inf <= 1e-12 * inf).
    equal = [ref for ref in DISTINCT_REFERENCES if m.answers_equal(pred, ref)[0]]
    assert len(equal) <= 1, (pred, equal)
    assert math_reward(T + f"<answer>{pred}</answer>", {"answer": "1234"}).score in (0.0, 1.0)


def test_exact_constants_evaluate():
    # doit() before the exact comparison: sin(pi) is exactly 0, 2^{10} is 1024 (latex2sympy leaves them unevaluated)
    assert m.answers_equal("\\sin{\\pi}", "0")[0] and m.answers_equal("\\cos{\\pi}+1", "0")[0]
    assert m.answers_equal("2^{10}", "1024")[0] and m.answers_equal("575!", "575\\cdot 574!")[0]


def test_model_text_is_never_evaluated(tmp_path):
    target = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {target}')"
    for text in (f"\\boxed{{{payload}}}", f"The answer is {payload}", payload):
        assert math_reward(T + text, {"answer": "0"}).score == 0.0
    assert not target.exists()


# ----------------------------------------------------------------------------- pieces


def test_extract_answers_rules():
    assert m.extract_answers("so \\boxed{\\frac{1}{2}} done").candidates == ["\\frac{1}{2}"]
    assert m.extract_answers("\\boxed{\\boxed{5}}").candidates == ["\\boxed{5}"]  # outermost only
    assert m.extract_answers("\\boxed 7").candidates == ["7"]
    assert m.extract_answers("At first the answer is unclear. The answer is 5.").candidates == ["5"]
    assert m.extract_answers("The answer is \\boxed{5}.").candidates == ["5"]  # counted once
    assert m.extract_answers("42").source == "bare"
    assert m.extract_answers("The result is 42").candidates == []


@pytest.mark.parametrize(
    "raw, text, percent, unit",
    [
        ("$\\dfrac12$", "\\frac{1}{2}", False, None),
        ("1{,}000", "1000", False, None),
        ("25\\%", "25", True, None),
        ("90^\\circ", "90", False, "degree"),
        ("5\\text{ cm}", "5", False, "cm"),
        ("\\left( 1,2 \\right).", "(1,2)", False, None),
        ("sqrt(2)", "\\sqrt{2}", False, None),
        ("\\log_2 8", "\\log_{2}8", False, None),
        ("2\\pi r", "2\\pi r", False, None),
    ],
)
def test_normalize_answer(raw, text, percent, unit):
    assert m.normalize_answer(raw) == m.Normalized(text, percent, unit and m.parse_unit(unit))


def test_parse_number_exact():
    from fractions import Fraction

    assert m.parse_number("\\frac{-1}{2}") == m.Number(Fraction(-1, 2), None, 0)  # exact: no written precision
    assert m.parse_number("1.5\\times10^{3}") == m.Number(Fraction(1500), -2, 2)  # written to the hundreds
    assert m.parse_number("-0.0330") == m.Number(Fraction(-33, 1000), 4, 3)
    assert m.parse_number("42") == m.Number(Fraction(42), None, 0)
    assert m.parse_number("3/0") is None
    assert m.parse_number("1e99999") is None  # exponent beyond MAX_EXPONENT


def test_symbolic_timeout_is_not_equal_with_reason(monkeypatch):
    def slow(_s):
        while True:
            time.sleep(0.001)

    monkeypatch.setattr(m, "_to_sympy", slow)
    # `slow` never returns: the call returning at all, with reason "timeout", is the timer firing. No bound on
    # the elapsed time, which a loaded machine stretches.
    assert m.symbolic_equal("x+1", "1+x", timeout_s=0.2) == (False, "timeout")


def test_timer_restores_previous_alarm_handler():
    sentinel = lambda *a: None  # noqa: E731
    previous = signal.signal(signal.SIGALRM, sentinel)
    try:
        m.symbolic_equal("x^2", "x\\cdot x", timeout_s=1.0)
        assert signal.getsignal(signal.SIGALRM) is sentinel
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_off_main_thread_runs_without_timer_and_agrees():
    out = {}

    def work():
        out["r"] = math_reward(T + "\\boxed{2\\sqrt{2}}", {"answer": "\\sqrt{8}"})

    t = threading.Thread(target=work)
    t.start()
    t.join(30)
    assert out["r"].score == 1.0 and out["r"].info["timer"] == "unavailable"
    assert math_reward(T + "\\boxed{2\\sqrt{2}}", {"answer": "\\sqrt{8}"}).info["timer"] == "armed"


def test_deterministic_across_calls_and_cache_clears():
    cases = [("\\boxed{x^2+2x+1}", "(x+1)^2"), ("\\boxed{0.5}", "1/2"), ("\\boxed{7}", "8")]
    first = [math_reward(T + a, {"answer": r}).score for a, r in cases]
    m._answers_equal_cached.cache_clear()
    second = [math_reward(T + a, {"answer": r}).score for a, r in cases]
    assert first == second == [1.0, 1.0, 0.0]


# ---- the symbolic timer counts the grading thread's CPU time, not the machine's load ----------------------------


def test_a_comparison_that_waits_for_a_core_is_not_timed_out():
    """Sleeping stands in for a loaded machine: the thread uses no CPU while it waits, so 0.2 s of wall time
    inside a 0.05 s budget (and under its 10x wall cap of 0.5 s) is not a timeout; a wall-clock timer fired."""
    import time

    with m._time_limit(0.05) as armed:
        time.sleep(0.2)
    assert armed


def test_a_comparison_that_burns_its_cpu_budget_is_timed_out():
    """A loop that would use 5 s of its thread's CPU is stopped at its 0.05 s budget (or the 0.5 s wall cap)."""
    import time

    start = time.thread_time()
    with pytest.raises(m._Timeout):
        with m._time_limit(0.05):
            while time.thread_time() - start < 5:
                pass
    assert time.thread_time() - start < 5  # stopped, not finished


def test_a_comparison_that_never_gets_a_core_still_ends_at_the_wall_cap():
    """No CPU used at all (a 10 s sleep): the wall cap, 10 x 0.05 s, ends it."""
    import time

    with pytest.raises(m._Timeout):
        with m._time_limit(0.05):
            time.sleep(10)
