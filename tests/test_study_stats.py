"""The study framework's paired comparisons: per-problem results of each run's final evaluation, the CI of
each arm against the baseline, McNemar per seed, the noise floor of a null arm; and the null arm's knob."""

from __future__ import annotations

import os

import numpy as np

from grpo_jax import reporting, stats, study, train
from grpo_jax.runlog import RunLogger
from tests.test_train import tiny_config
from tests.tolerance import EPS64, rounding_tol


def _write(out, arm, seed, greedy, t1=None, k=4):
    problems = {"greedy_correct": greedy} if t1 is None else {"greedy_correct": greedy, "t1_correct": t1, "samples": k}
    with RunLogger(os.path.join(out, arm, f"seed{seed}"), tensorboard=False, progress=False) as log:
        log.log_problems(0, {"greedy_correct": [0] * len(greedy)})  # an earlier evaluation: not the one compared
        log.log_problems(10, problems)


def test_compare_arms_on_hand_written_problem_results(tmp_path):
    out = str(tmp_path)
    n = 200
    base = np.zeros(n, int)
    base[:100] = 1  # baseline 50% on both seeds
    better = base.copy()
    better[100:160] = 1  # +60 problems: +30 points, a discordant count of 60 against 0
    null = base.copy()
    null[[0, 100]] = [0, 1]  # one problem each way: the null arm differs by noise only
    for seed in (0, 1):
        _write(out, "base", seed, base.tolist(), t1=(base * 4).tolist())
        _write(out, "better", seed, better.tolist(), t1=(better * 2).tolist())
        _write(out, "null", seed, null.tolist(), t1=(null * 4).tolist())
    cmp = study.compare_arms(out, ["base", "better", "null"], [0, 1], baseline="base", null="null", n_boot=2000)
    e = cmp["arms"]["better"]
    assert e["diff"]["diff"] == 0.3 and e["diff"]["low"] > 0.2 and e["verdict"] == "win"
    assert [m["b01"] for m in e["mcnemar"]] == [60, 60] and all(m["p_value"] < 1e-15 for m in e["mcnemar"])
    assert cmp["arms"]["null"]["verdict"] == "inside noise" and cmp["noise_floor"]["floor"] < 0.02
    # pass@1 at T = 1 from the counts: better's correct problems have 2 of 4 samples right (0.5 instead of 1)
    t1 = study.compare_arms(out, ["base", "better"], [0, 1], baseline="base", metric="t1", n_boot=500)
    # float64 means of quarters over 200 problems (exact sums, one division), their difference and the mean over
    # 2 seeds: <= 6 roundings of eps64/2 of values <= 1
    assert abs(t1["arms"]["better"]["diff"]["diff"] - (160 * 0.5 - 100) / n) <= rounding_tol(1.0, ulps=3, eps=EPS64)
    table = reporting.comparison_table(cmp)
    assert "| better | +30.0 [" in table and "noise floor (null arm)" in table
    assert study.compare_arms(out, ["base"], [0, 1], baseline="missing") == {}


def test_a_null_arm_changes_only_the_rollouts_randomness(tmp_path):
    """sampling.key_offset: the same start, data and held-out problems, other completions."""
    runs = [train.Trainer(tiny_config("steps=1", *extra), str(tmp_path / str(i)), quiet=True)
            for i, extra in enumerate([(), ("sampling.key_offset=1",)])]
    assert runs[0].eval_rows == runs[1].eval_rows
    np.testing.assert_array_equal(np.asarray(runs[0].state.params["embed"]), np.asarray(runs[1].state.params["embed"]))
    rows = [r.next_rows(4) for r in runs]
    assert rows[0] == rows[1]
    outs = [r.step_once().experience for r in runs]
    assert not np.array_equal(np.asarray(outs[0].rollout.tokens), np.asarray(outs[1].rollout.tokens))


def _write_sampled(out, arm, seed, start, end, k=4):
    with RunLogger(os.path.join(out, arm, f"seed{seed}"), tensorboard=False, progress=False) as log:
        log.log_problems(0, {"greedy_correct": [0] * len(start), "t1_correct": start, "samples": k})
        log.log_problems(5, {"greedy_correct": [0] * len(start)})  # greedy only: no curve
        log.log_problems(10, {"greedy_correct": [0] * len(end), "t1_correct": end, "samples": k})


def test_pass_at_k_curves_from_the_sampled_evaluations_and_their_plot(tmp_path):
    out = str(tmp_path)
    # 2 problems, 4 samples each. Start: 1 of 4 right on both, so pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) =
    # 1 - 3/6 = 1/2, pass@4 = 1. End (collapsed): 4 of 4 on one problem, 0 on the other: 1/2 for every k.
    _write_sampled(out, "none", 0, [1, 1], [4, 0])
    _write_sampled(out, "control", 0, [1, 1], [2, 2])  # 2 of 4: pass@1 1/2, pass@2 1 - 1/6 = 5/6, pass@4 1
    curves = reporting.pass_at_k_curves(os.path.join(out, "none", "seed0"))
    assert sorted(curves) == [0, 10]
    assert curves[0] == {1: 0.25, 2: 0.5, 4: 1.0} and curves[10] == {1: 0.5, 2: 0.5, 4: 0.5}
    assert np.isclose(reporting.pass_at_k_curves(os.path.join(out, "control", "seed0"))[10][2], 5 / 6)
    assert reporting.pass_at_k_curves(os.path.join(out, "missing")) == {}
    path = reporting.plot_pass_at_k(out, ["none", "control", "missing"], [0])
    assert path.endswith("pass_at_k.png") and os.path.getsize(path) > 1000


def test_compare_seeds_decides_win_equivalent_and_inconclusive_with_holm_over_the_table():
    # 8 seeds; baseline 0.40 on every seed, null = baseline + (+-0.005 alternating): floor from a tiny interval.
    # "big": +0.05 +- 0.005 -> p ~ 1e-8, Holm x3 still tiny, 0.05 > floor: win.
    # "flat": +-0.004 alternating (mean 0): TOST at +-0.02 has its 90% interval well inside: equivalent.
    # "noisy": +-0.10 alternating around +0.01: neither significant nor inside +-0.02: inconclusive.
    seeds = list(range(8))
    alt = np.array([1, -1] * 4, float)
    arm = lambda offsets: [{"seed": s, "acc": 0.40 + o} for s, o in zip(seeds, offsets)]  # noqa: E731
    results = {"base": arm(np.zeros(8)), "null": arm(0.005 * alt), "big": arm(0.05 + 0.005 * alt),
               "flat": arm(0.004 * alt), "noisy": arm(0.01 + 0.10 * alt)}
    c = study.compare_seeds(results, baseline="base", metric="acc", arms=["big", "flat", "noisy"], null="null",
                            sesoi=0.02)
    assert {a: e["decision"] for a, e in c["arms"].items()} == {"big": "win", "flat": "equivalent",
                                                                "noisy": "inconclusive"}
    assert c["holm_family"] == 3
    ps = [c["arms"][a]["test"]["p_value"] for a in ("big", "flat", "noisy")]
    assert [c["arms"][a]["holm_p"] for a in ("big", "flat", "noisy")] == stats.holm(ps)
    table = reporting.seed_comparison_table(c)
    assert "Holm over the 3 arms" in table and "| big | 8 |" in table and "equivalent" in table
    # without a sesoi the table and the entries are as before: no decision, a Bonferroni column
    plain = study.compare_seeds(results, baseline="base", metric="acc", arms=["big"], null="null")
    assert "decision" not in plain["arms"]["big"] and "Bonferroni" in reporting.seed_comparison_table(plain)
