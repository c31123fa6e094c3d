"""Registry: validated RewardSpec, and evaluate() -> per-dimension matrix R[N, K] (never pre-summed)."""

import dataclasses
import pickle

import numpy as np
import pytest

from grpo_jax.rewards import REWARDS, RewardSpec, dimension_names, evaluate, format_reward, math_reward, weights
from grpo_jax.rewards.sandbox import SandboxPool


def test_unknown_reward_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        RewardSpec("maths")
    for name in ("math", "format", "code", "science", "translation", "repetition", "overlong", "length"):
        assert name in str(err.value)
    assert set(REWARDS) == {"math", "format", "code", "science", "translation", "countdown", "countdown_numbers",
                            "countdown_steps", "countdown_ops", "repetition", "overlong", "length", "length_budget"}


def test_spec_validation():
    with pytest.raises(ValueError, match="unknown kwargs \\['tol'\\]"):
        RewardSpec("math", kwargs={"tol": 1e-3})
    with pytest.raises(ValueError, match="finite"):
        RewardSpec("math", weight=float("nan"))
    with pytest.raises(ValueError, match="finite"):
        RewardSpec("math", weight=True)
    with pytest.raises(ValueError, match="pins version"):
        RewardSpec("math", version="0")
    spec = RewardSpec("math", 2, {"rel_tol": 1e-3}, version="7")
    assert spec.weight == 2.0 and spec.dimension == "math"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.weight = 3.0  # type: ignore[misc]
    original = {"rel_tol": 1e-3}
    copied = RewardSpec("math", kwargs=original)
    original["rel_tol"] = 0.5  # the spec keeps its own copy
    assert copied.kwargs == {"rel_tol": 1e-3}
    # configs holding specs must serialise (checkpoints, logs)
    assert dataclasses.asdict(copied)["kwargs"] == {"rel_tol": 1e-3}
    assert pickle.loads(pickle.dumps(copied)) == copied


def test_dimension_names_and_weights():
    specs = [
        RewardSpec("math"),
        RewardSpec("format", 0.1),
        RewardSpec("math", 0.5, {"fallback_last_number": True}, label="math_lenient"),
    ]
    assert dimension_names(specs) == ["math", "format", "math_lenient"]
    w = weights(specs)
    assert w.dtype == np.float32 and w.tolist() == pytest.approx([1.0, 0.1, 0.5])
    with pytest.raises(ValueError, match="duplicate"):
        dimension_names([RewardSpec("math"), RewardSpec("math", 0.5)])


RESPONSES = [
    "<think>2+2</think>\\boxed{4}",  # format ok, math right
    "<think>2+2</think>\\boxed{5}",  # format ok, math wrong
    "\\boxed{4}",  # no think tags: format wrong, math right
    "<think>\\boxed{4}",  # unfinished: both wrong
]


def test_evaluate_keeps_one_column_per_dimension():
    specs = [RewardSpec("math", 1.0), RewardSpec("format", 0.2)]
    samples = [{"answer": "4"}] * len(RESPONSES)
    R, infos = evaluate(specs, RESPONSES, samples)
    assert R.shape == (4, 2) and R.dtype == np.float32
    assert R.tolist() == [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]  # not summed, not weighted
    assert infos["dimensions"] == ["math", "format"] and infos["weights"] == pytest.approx([1.0, 0.2])
    assert set(infos["time_s"]) == {"math", "format"} and all(t >= 0 for t in infos["time_s"].values())
    assert infos["per_response"][1]["math"]["reason"] == "wrong_answer"
    assert infos["versions"] == {"math": "7", "format": "2"}
    # the same numbers as calling each reward directly
    assert R[:, 0].tolist() == [math_reward(r, {"answer": "4"}).score for r in RESPONSES]
    assert R[:, 1].tolist() == [format_reward(r, {}).score for r in RESPONSES]


def test_evaluate_code_in_the_pool_matches_inline():
    sample = {"tests": "def check(f):\n    assert f(2) == 3\n", "entry_point": "inc", "answer": "3"}
    responses = [
        "<think>x</think>```python\ndef inc(x):\n    return x + 1\n```",
        "<think>x</think>```python\ndef inc(x):\n    return x\n```",
        "<think>x</think>```python\nwhile True:\n    pass\n```",
    ]
    specs = [RewardSpec("code", 1.0, {"wall_s": 1.5, "cpu_s": 1.0}), RewardSpec("format", 0.1)]
    with SandboxPool(2) as pool:
        R, infos = evaluate(specs, responses, [sample] * 3, pool=pool)
    assert R[:, 0].tolist() == [1.0, 0.0, 0.0] and R[:, 1].tolist() == [1.0, 1.0, 1.0]
    assert infos["per_response"][2]["code"]["reason"] in ("timeout", "cpu_limit")
    R2, _ = evaluate(specs, responses, [sample] * 3)  # a temporary pool of its own
    assert np.array_equal(R, R2)


def test_evaluate_input_errors():
    with pytest.raises(ValueError, match="2 responses but 1 samples"):
        evaluate([RewardSpec("format")], ["a", "b"], [{}])
    with pytest.raises(ValueError, match="at least one"):
        evaluate([], ["a"], [{}])
    with pytest.raises(KeyError, match="'answer'"):  # a malformed sample stops the run, naming the field
        evaluate([RewardSpec("math")], ["\\boxed{1}"], [{"question": "?"}])


def test_when_gates_a_dimension_on_another():
    # countdown (target 10 from 3, 7) gates length_budget (budget 30 sampler tokens): rows 0-1 correct, 2-3
    # wrong; rows 0 and 2 fit the budget, 1 and 3 do not. Gated: the budget counts only where correct.
    specs = [RewardSpec("countdown"), RewardSpec("length_budget", kwargs={"budget": 30}, when="countdown")]
    sample = {"numbers": [3, 7], "target": 10}
    responses = ["<think>3+7=10</think><answer>3+7</answer>"] * 2 + ["<think>7-3=4</think><answer>7-3</answer>"] * 2
    lengths = [30, 31, 30, 31]
    R, infos = evaluate(specs, responses, [dict(sample, response_length=n) for n in lengths])
    assert R.tolist() == [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    ungated, _ = evaluate([specs[0], RewardSpec("length_budget", kwargs={"budget": 30})], responses,
                          [dict(sample, response_length=n) for n in lengths])
    assert ungated[:, 1].tolist() == [1.0, 0.0, 1.0, 0.0]  # what the gate took away: row 2
    assert infos["per_response"][2]["length_budget"]["ungated"] == 1.0
    assert "ungated" not in infos["per_response"][0]["length_budget"]


def test_when_must_name_another_ungated_dimension():
    with pytest.raises(ValueError, match="when='nope' must name another dimension"):
        dimension_names([RewardSpec("countdown"), RewardSpec("format", when="nope")])
    with pytest.raises(ValueError, match="when='format' must name another dimension"):
        dimension_names([RewardSpec("format", when="format")])
    with pytest.raises(ValueError, match="when='countdown_numbers' must name"):  # no chains
        dimension_names([RewardSpec("countdown"), RewardSpec("countdown_numbers", when="countdown"),
                         RewardSpec("format", when="countdown_numbers")])
    with pytest.raises(ValueError, match="must be a dimension name"):
        RewardSpec("format", when="")
