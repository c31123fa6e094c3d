"""The supervised warm start's targets: one solution as it is, or one of several picked at random."""

from __future__ import annotations

import numpy as np

from grpo_jax import sft


def test_a_single_solution_is_supervised_as_it_is_and_draws_nothing():
    rng, untouched = np.random.default_rng(0), np.random.default_rng(0)
    assert sft._target("<think>add</think>", rng) == "<think>add</think>"
    assert sft._target(["only"], rng) == "only"
    assert rng.integers(1 << 30) == untouched.integers(1 << 30)  # the stream a one-solution task sees is kept


def test_several_solutions_are_each_supervised():
    rng = np.random.default_rng(0)
    options = ["a", "b", "c"]
    picked = [sft._target(options, rng) for _ in range(300)]
    # uniform over 3: each is missed by all 300 draws with probability (2/3)^300 < 1e-52
    assert set(picked) == set(options)
