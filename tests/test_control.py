"""Training controls: entropy coefficient, temperature, reward-weight curriculum + hot reload, DAPO sampling."""

from __future__ import annotations

import json
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import control, sampler
from grpo_jax.config import EntropyCoefConfig, RewardWeightsConfig, TemperatureConfig, from_dict, to_dict
from grpo_jax.control import EntropyCoefController, GroupBuffer, RewardWeights, TemperatureController


def json_round_trip(d: dict) -> dict:
    return json.loads(json.dumps(d, allow_nan=False))


# ---------------------------------------------------------------- entropy coefficient

def test_entropy_coef_constant_and_warmup_values():
    assert EntropyCoefController(EntropyCoefConfig(coef=0.003)).value(12345) == 0.003
    ctl = EntropyCoefController(EntropyCoefConfig(mode="warmup", coef=0.01, warmup_start=10, warmup_steps=20))
    # 0 up to step 10, then 0.01 * (step - 10) / 20: step 15 -> 0.0025, step 30 -> 0.01, flat after.
    got = [ctl.value(s) for s in (0, 10, 15, 20, 30, 100)]
    np.testing.assert_allclose(got, [0.0, 0.0, 0.0025, 0.005, 0.01, 0.01], rtol=1e-12)
    assert ctl.update(29, 0.0) == ctl.value(30)  # non-adaptive update just reports the next step's value
    jump = EntropyCoefController(EntropyCoefConfig(mode="warmup", coef=0.01, warmup_start=10))
    assert [jump.value(s) for s in (9, 10, 11)] == [0.0, 0.0, 0.01]


def test_entropy_coef_adaptive_multiplicative_moves_and_stays_in_bounds():
    cfg = EntropyCoefConfig(mode="adaptive", coef=0.01, adapt_rate=0.1, target_entropy=0.5,
                            min_coef=0.005, max_coef=0.02)
    ctl = EntropyCoefController(cfg)
    ups = [ctl.update(s, 0.1) for s in range(10)]  # entropy under target: x1.1 per step -> 0.011, 0.0121, ...
    assert ups[0] == pytest.approx(0.011) and ups[1] == pytest.approx(0.0121)
    assert ups[-1] == 0.02 and all(b >= a for a, b in zip(ups, ups[1:]))  # 0.01 * 1.1^8 > 0.02: clipped
    assert ctl.update(10, math.nan) == 0.02  # no information, no move
    downs = [ctl.update(s, 2.0) for s in range(11, 30)]  # above target: /1.1 per step down to min
    assert downs[0] == pytest.approx(0.02 / 1.1) and downs[-1] == 0.005
    assert all(cfg.min_coef <= c <= cfg.max_coef for c in ups + downs)
    assert ctl.value(999) == 0.005  # adaptive value is the state, whatever the step


def test_entropy_coef_adaptive_additive():
    ctl = EntropyCoefController(EntropyCoefConfig(mode="adaptive", adapt="additive", coef=0.0, adapt_rate=0.004,
                                                  max_coef=0.01))
    assert [ctl.update(0, 0.0) for _ in range(4)] == pytest.approx([0.004, 0.008, 0.01, 0.01])
    assert [ctl.update(0, 9.9) for _ in range(4)] == pytest.approx([0.006, 0.002, 0.0, 0.0])


def test_entropy_coef_state_round_trip_is_bitwise():
    cfg = EntropyCoefConfig(mode="adaptive", coef=0.01, adapt_rate=0.07, target_entropy=0.5, max_coef=1.0)
    entropies = np.random.default_rng(1).uniform(0, 1, 40)
    a = EntropyCoefController(cfg)
    want = [a.update(s, e) for s, e in enumerate(entropies)]
    b = EntropyCoefController(cfg)
    got = [b.update(s, e) for s, e in enumerate(entropies[:17])]
    c = EntropyCoefController(cfg)
    c.load_state_dict(json_round_trip(b.state_dict()))
    got += [c.update(s, e) for s, e in enumerate(entropies[17:], 17)]
    assert got == want


def test_entropy_coef_validation_names_the_field():
    with pytest.raises(ValueError, match="EntropyCoefConfig.mode"):
        EntropyCoefConfig(mode="cosine")
    with pytest.raises(ValueError, match="EntropyCoefConfig.coef"):
        EntropyCoefConfig(mode="adaptive", coef=0.5, max_coef=0.1)
    with pytest.raises(ValueError, match="EntropyCoefConfig.coef"):
        EntropyCoefConfig(mode="adaptive", coef=0.0)  # multiplicative from 0 could never move
    with pytest.raises(ValueError, match="EntropyCoefConfig.warmup_steps"):
        EntropyCoefConfig(mode="warmup", warmup_steps=-1)


# ---------------------------------------------------------------- temperature

def test_temperature_rises_on_low_entropy_is_bounded_and_returns_to_base():
    cfg = TemperatureConfig(mode="adaptive", max_temp=1.2, entropy_floor=0.2, hysteresis=0.1,
                            step_up=0.1, step_down=0.05, window=2)
    ctl = TemperatureController(cfg, 1.0)
    assert [ctl.update(0.05) for _ in range(3)] == pytest.approx([1.1, 1.2, 1.2])  # capped at max_temp
    assert ctl.update(0.25) == 1.2  # window mean (0.05 + 0.25) / 2 = 0.15 < floor: stays up
    assert ctl.update(0.25) == 1.2  # mean 0.25 in the hysteresis band [0.2, 0.3): hold
    assert ctl.update(0.5) == pytest.approx(1.15)  # mean 0.375 >= 0.3: step down
    tail = [ctl.update(0.5) for _ in range(6)]
    assert tail[:3] == pytest.approx([1.1, 1.05, 1.0]) and tail[-1] == 1.0 and min(tail) == 1.0  # not below base
    assert ctl.update(math.nan) == 1.0
    fixed = TemperatureController(TemperatureConfig(), 0.7)
    assert [fixed.update(0.0) for _ in range(3)] == [0.7, 0.7, 0.7]


def test_temperature_ceiling_lowers_to_min_and_recovers():
    cfg = TemperatureConfig(mode="adaptive", min_temp=0.9, entropy_floor=0.1, entropy_ceiling=2.0,
                            hysteresis=0.1, step_up=0.05, step_down=0.05, window=1)
    ctl = TemperatureController(cfg, 1.0)
    assert [ctl.update(3.0) for _ in range(3)] == pytest.approx([0.95, 0.9, 0.9])
    assert [ctl.update(1.0) for _ in range(3)] == pytest.approx([0.95, 1.0, 1.0])


def test_temperature_state_round_trip():
    cfg = TemperatureConfig(mode="adaptive", entropy_floor=0.5, window=4)
    # Low, then high entropy around the split at 11: the restored window still holds lows (mean 0.3 < floor at
    # step 11), so a resume that lost the window would lower the temperature one step early.
    ent = np.concatenate([np.full(11, 0.1), np.full(5, 0.9), np.random.default_rng(2).uniform(0, 1, 20)])
    a = TemperatureController(cfg, 1.0)
    want = [a.update(e) for e in ent]
    b = TemperatureController(cfg, 1.0)
    got = [b.update(e) for e in ent[:11]]
    c = TemperatureController(cfg, 1.0)
    c.load_state_dict(json_round_trip(b.state_dict()))
    assert got + [c.update(e) for e in ent[11:]] == want
    assert len(set(want)) > 2  # the stream moved the temperature


def _entropy(z: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def test_per_token_temperature_is_jittable_and_boosts_exactly_the_low_entropy_rows():
    logits = np.array([
        [0.0, 0.0, 0.0, 0.0],  # uniform: H = ln 4 ~ 1.39 at any temperature
        [2.0, 0.0, 0.0, 0.0],  # H ~ 0.9 at T=1 but ~0.008 at T=0.25: low only at the base temperature
        [-np.inf, 5.0, -np.inf, -np.inf],  # one allowed token (masked logits): H = 0
        [1.0, 0.9, 0.0, -1.0],  # H ~ 1.2
    ], np.float32)
    base, floor = 0.25, 0.5
    h = _entropy(logits.astype(np.float64) / base)
    expected = np.where(h < floor, 0.5, 0.25)  # hot = min(0.25 * 2, 0.6) = 0.5
    np.testing.assert_array_equal(expected, [0.25, 0.5, 0.5, 0.25])

    fn = jax.jit(lambda z, b, f, k, m: sampler.per_token_temperature(
        z, base_temperature=b, entropy_floor=f, boost=k, max_temperature=m))
    out = fn(jnp.asarray(logits), 0.25, 0.5, 2.0, 0.6)
    assert out.shape == (4,) and out.dtype == jnp.float32
    np.testing.assert_array_equal(out, expected)
    capped = np.where(h < floor, np.float32(0.6), np.float32(0.25))  # 0.25 * 4 = 1 > max 0.6
    np.testing.assert_array_equal(fn(jnp.asarray(logits), 0.25, 0.5, 4.0, 0.6), capped)
    np.testing.assert_array_equal(fn(jnp.asarray(logits), 0.0, 0.5, 2.0, 0.6), np.zeros(4))  # greedy stays greedy


# ---------------------------------------------------------------- reward weights

DIMS = ("correct", "format", "quality")


def _weights(tmp_path=None, **kw) -> RewardWeights:
    path = str(tmp_path / "weights.json") if tmp_path is not None else ""
    cfg = RewardWeightsConfig(weights_file=path, **kw)
    return RewardWeights(DIMS, [1.0, 0.5, 1.0], cfg)


def test_curriculum_multiplies_the_weights_piecewise_linearly():
    rw = _weights(schedule=(("quality", ((100, 0.0), (300, 1.0))), ("format", ((0, 1.0), (200, 0.0)))))
    # step 150: quality factor (150-100)/200 = 0.25 -> 0.25; format factor 1 - 150/200 = 0.25 -> 0.5*0.25.
    expected = {0: [1, 0.5, 0], 100: [1, 0.25, 0], 150: [1, 0.125, 0.25], 300: [1, 0, 1], 10_000: [1, 0, 1]}
    for step, w in expected.items():
        got = rw.at(step)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, np.float32(w), err_msg=f"step {step}")
    assert rw.maybe_reload(0) is None  # no file configured


def _write(tmp_path, text: str) -> None:
    (tmp_path / "weights.json").write_text(text)


def test_hot_reload_applies_changes_and_ignores_bad_files(tmp_path):
    rw = _weights(tmp_path, schedule=(("quality", ((0, 0.5), (10, 0.5))),))
    with pytest.warns(UserWarning, match="cannot|unreadable|No such file"):
        assert rw.maybe_reload(0) is None  # not created yet: warn once, keep the base weights
    np.testing.assert_array_equal(rw.at(0), np.float32([1, 0.5, 0.5]))
    _write(tmp_path, '{"quality": 2.0}')
    change = rw.maybe_reload(3)
    assert change == {"step": 3, "old": {"correct": 1.0, "format": 0.5, "quality": 1.0},
                      "new": {"correct": 1.0, "format": 0.5, "quality": 2.0}}
    np.testing.assert_array_equal(rw.at(3), np.float32([1, 0.5, 1.0]))  # file overrides base, curriculum x0.5
    assert rw.maybe_reload(4) is None  # unchanged content

    bad = {'{"quality": ': "not valid JSON", '[1, 2]': "JSON object",
           '{"bogus": 1}': r"unknown dimensions \['bogus'\]", '{"quality": NaN}': "finite",
           '{"quality": "2"}': "finite", '{"format": -1}': ">= 0"}
    for step, (text, problem) in enumerate(bad.items(), 5):
        _write(tmp_path, text)
        with pytest.warns(UserWarning, match=problem):
            assert rw.maybe_reload(step) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert rw.maybe_reload(step) is None  # the same bad content is reported once
        np.testing.assert_array_equal(rw.at(step), np.float32([1, 0.5, 1.0]))  # old weights kept

    _write(tmp_path, '{"quality": 3.0, "format": 0.25}')
    assert rw.maybe_reload(20) == {"step": 20, "old": {"correct": 1.0, "format": 0.5, "quality": 2.0},
                                   "new": {"correct": 1.0, "format": 0.25, "quality": 3.0}}
    _write(tmp_path, '{"quality": 4.0, "format": 0.25}')  # same size, likely the same mtime: hash catches it
    assert rw.maybe_reload(21)["new"]["quality"] == 4.0
    _write(tmp_path, '{"format": 0.25,   "quality": 4.0}')  # new content, same weights: nothing to log
    assert rw.maybe_reload(22) is None

    resumed = _weights(tmp_path, schedule=(("quality", ((0, 0.5), (10, 0.5))),))
    resumed.load_state_dict(json_round_trip(rw.state_dict()))
    np.testing.assert_array_equal(resumed.at(23), rw.at(23))  # before any re-read: the checkpointed weights
    assert resumed.maybe_reload(23) is None  # same weights as before the checkpoint: no duplicate record
    np.testing.assert_array_equal(resumed.at(23), rw.at(23))


@pytest.mark.parametrize("text, problem", [
    pytest.param('{"quality": 1' + "0" * 400 + "}", "an integer of 401 digits", id="401-digit-int"),  # float() overflows
    pytest.param('{"quality": 1e400}', "got inf", id="1e400"),  # the JSON parser reads it as inf
    pytest.param('{"quality": -1e400}', "got -inf", id="-1e400"),
    pytest.param('{"quality": NaN}', "got nan", id="NaN"),
    pytest.param('{"quality": Infinity}', "got inf", id="Infinity"),
    pytest.param('{"quality": -Infinity}', "got -inf", id="-Infinity"),
    pytest.param('{"quality": -0.0}', "is -0: write 0", id="-0.0"),  # a signed zero: neither a weight nor negative
    pytest.param("[" * 100_000 + "]" * 100_000, "not valid JSON", id="nested-past-the-recursion-limit"),
    pytest.param('{"quality": 1' + "0" * 5000 + "}", "not valid JSON", id="5001-digit-int"),  # Python's 4300-digit limit
])
def test_any_number_the_parser_gives_is_rejected_with_a_logged_event_never_raised(tmp_path, text, problem):
    rw = _weights(tmp_path)
    _write(tmp_path, '{"quality": 2.0}')
    rw.maybe_reload(0)
    _write(tmp_path, text)
    rejected = []
    with pytest.warns(UserWarning, match="ignored at step 1"):
        assert rw.maybe_reload(1, on_reject=rejected.append) is None
    (event,) = rejected
    assert problem in event["problem"] and event["kept"]["quality"] == 2.0, event["problem"]
    json.dumps(event, allow_nan=False)  # the event is loggable as strict JSON
    np.testing.assert_array_equal(rw.at(1), np.float32([1, 0.5, 2.0]))


def test_negative_weights_allowed_only_where_declared(tmp_path):
    rw = RewardWeights(("correct", "penalty"), [1.0, -0.5], RewardWeightsConfig(
        weights_file=str(tmp_path / "weights.json")))
    _write(tmp_path, '{"penalty": -1.0}')  # negative base weight: a penalty dimension may stay negative
    assert rw.maybe_reload(0)["new"] == {"correct": 1.0, "penalty": -1.0}
    _write(tmp_path, '{"correct": -1.0}')
    with pytest.warns(UserWarning, match="'correct' must be >= 0"):
        assert rw.maybe_reload(1) is None
    ok = RewardWeights(("correct", "penalty"), [1.0, 0.5], RewardWeightsConfig(
        weights_file=str(tmp_path / "weights.json"), allow_negative=("correct",)))
    assert ok.maybe_reload(0)["new"]["correct"] == -1.0


def test_reward_weights_config_validation_and_json():
    with pytest.raises(ValueError, match="RewardWeightsConfig.schedule"):
        RewardWeightsConfig(schedule=(("quality", ((10, 1.0), (5, 0.0))),))  # steps not increasing
    with pytest.raises(ValueError, match="RewardWeightsConfig.schedule"):
        RewardWeightsConfig(schedule=(("quality", ((0, -1.0),)),))
    with pytest.raises(ValueError, match="RewardWeightsConfig.schedule"):
        RewardWeightsConfig(schedule=(("quality", ((0.5, 1.0),)),))  # fractional step
    with pytest.raises(ValueError, match="RewardWeightsConfig.schedule"):
        RewardWeightsConfig(schedule=(("q", ((0, 1.0),)), ("q", ((0, 1.0),))))
    with pytest.raises(ValueError, match="unknown dimensions \\['style'\\]"):
        _weights(schedule=(("style", ((0, 1.0),)),))
    cfg = RewardWeightsConfig(schedule=[["quality", [[0, 0], [100, 1]]]])  # JSON lists normalise to tuples
    assert cfg.schedule == (("quality", ((0, 0.0), (100, 1.0))),)
    assert from_dict(RewardWeightsConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg


# ---------------------------------------------------------------- dynamic sampling

def test_dynamic_sampling_select_keeps_informative_groups_in_order():
    nan = np.nan
    totals = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [nan, 1, 0], [nan, nan, nan], [2, 2, nan]])
    # Informative (finite entries not all equal): rows 1, 3, 4. NaN-only and constant-plus-NaN rows are not.
    np.testing.assert_array_equal(control.dynamic_sampling_select(totals, need=10), [1, 3, 4])
    np.testing.assert_array_equal(control.dynamic_sampling_select(totals, need=2), [1, 3])
    np.testing.assert_array_equal(control.dynamic_sampling_select(totals[[0, 2]], need=2), [])


class _TotalsBuffer(GroupBuffer):
    """A GroupBuffer fed group totals: informative = the totals vary (the weighted-total rule)."""

    def add_totals(self, totals):
        self.add(control.informative_mask(np.asarray(totals, float)))


def test_group_buffer_fills_across_rounds():
    buf = _TotalsBuffer(need=4, max_rounds=3)
    buf.add_totals([[1, 1], [0, 1], [0, 0], [1, 0]])  # informative 1, 3
    assert not buf.done and buf.rounds == 1
    buf.add_totals([[0, 0], [1, 1], [1, 0], [1, 1]])  # informative 2
    buf.add_totals([[1, 0], [0, 1], [0, 1], [0, 0]])  # informative 0, 1, 2: only one more needed
    assert buf.done and buf.selection() == [(0, 1), (0, 3), (1, 2), (2, 0)]
    # 12 groups seen, 4 kept -> 8 dropped; no zero-variance fill; 2 of the 4 from the first round.
    assert buf.metrics() == {"dynamic/rounds": 3.0, "dynamic/kept": 4.0, "dynamic/dropped": 8.0,
                             "dynamic/filled_frac": 0.0, "dynamic/first_round_frac": 0.5}
    with pytest.raises(RuntimeError, match="done"):
        buf.add_totals([[0, 1]])


def test_group_buffer_respects_the_cap_and_fills_with_zero_variance_groups():
    buf = _TotalsBuffer(need=4, max_rounds=2)
    buf.add_totals([[1, 1], [0, 1], [0, 0], [1, 1]])  # informative 1; zero-variance 0, 2, 3
    buf.add_totals([[0, 0], [1, 1], [2, 2], [3, 3]])  # none informative
    assert buf.done and buf.rounds == 2
    assert buf.selection() == [(0, 1), (0, 0), (0, 2), (0, 3)]  # informative first, then fill in arrival order
    assert buf.metrics() == {"dynamic/rounds": 2.0, "dynamic/kept": 1.0, "dynamic/dropped": 4.0,
                             "dynamic/filled_frac": 0.75, "dynamic/first_round_frac": 1.0}  # all 4 from round 0


def _run_buffer(seed: int, need: int, max_rounds: int):
    rng = np.random.default_rng(seed)
    rounds, buf = [], _TotalsBuffer(need=need, max_rounds=max_rounds)
    while not buf.done:
        rounds.append(rng.integers(0, 2, size=(4, 2)).astype(float))  # p(zero variance) = 1/2 per group
        buf.add_totals(rounds[-1])
    return rounds, buf


@pytest.mark.parametrize("seed", range(20))
def test_group_buffer_properties(seed):
    need, max_rounds = 5, 3
    rounds, buf = _run_buffer(seed, need, max_rounds)
    informative = [(r, i) for r, t in enumerate(rounds) for i in np.flatnonzero(np.ptp(t, axis=1) > 0)]
    chosen = buf.selection()
    assert buf.rounds == len(rounds) <= max_rounds
    assert len(chosen) == need == len(set(chosen))
    assert chosen[: min(need, len(informative))] == informative[:need]  # first informative, arrival order
    if len(informative) >= need:
        assert all(np.ptp(rounds[r][i]) > 0 for r, i in chosen)  # never a zero-variance group then
    else:
        assert len(rounds) == max_rounds and buf.metrics()["dynamic/filled_frac"] == (need - len(informative)) / need
    again = _run_buffer(seed, need, max_rounds)[1]
    assert again.selection() == chosen and again.metrics() == buf.metrics()  # deterministic
