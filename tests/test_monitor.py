"""Alarms: each kind fires exactly at the expected step, edge-triggered; missing metrics; resume; reports."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from grpo_jax import monitor as mon
from grpo_jax.config import AlarmRule, MonitorConfig, TrainConfig, default_rules, from_dict, override, to_dict
from grpo_jax.monitor import Monitor

nan, inf = math.nan, math.inf


def fired_steps(rule: AlarmRule, values, *, history: int = 64) -> list[int]:
    """Feed values[i] at step i; return the steps where the rule fired."""
    m = Monitor(MonitorConfig(rules=(rule,), history=history))
    return [a.step for i, v in enumerate(values) for a in m.observe(i, {rule.metric: v})]


def test_below_fires_when_patience_is_reached_then_rearms():
    # Under 0.05 at steps 3, 4, 5 -> streak 3 = patience at step 5; 6 continues the streak (no refire);
    # step 7 clears it; 8, 9, 10 under again -> fires at 10. 0.05 itself is not "below" (strict).
    values = [1.0, 0.5, 0.05, 0.04, 0.03, 0.02, 0.01, 0.1, 0.0, 0.0, 0.0, 0.0]
    assert fired_steps(AlarmRule("entropy/mean", "below", 0.05, patience=3), values) == [5, 10]


def test_above_fires_on_first_strict_crossing():
    values = [0.1, 0.9, 0.9, 0.91, 0.95, 0.2, 0.99]  # 0.9 == threshold does not count
    assert fired_steps(AlarmRule("groups/zero_var_frac", "above", 0.9), values) == [3, 6]


def test_drop_compares_with_the_value_window_observations_back():
    # window 4: at step i the reference is v[i-4]. Step 6: (1 - 0.5)/1 = 0.5, not > 0.5; step 7: 0.55 -> fire.
    values = [1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.5, 0.45, 0.4]
    assert fired_steps(AlarmRule("entropy/mean", "drop", 0.5, window=4), values) == [7]
    # A fall right at the start cannot fire before a reference exists: first at step 4 (ref v[0] = 1, drop 0.9).
    assert fired_steps(AlarmRule("entropy/mean", "drop", 0.5, window=4), [1.0, 0.1, 0.1, 0.1, 0.1]) == [4]


def test_nonfinite_on_loss_and_counter():
    loss = [1.0, 0.5, nan, 0.4, inf, -inf, inf, 0.3]  # fires at 2, clears at 3, fires at 4, streak on to 6
    assert fired_steps(AlarmRule("loss", "nonfinite"), loss) == [2, 4]
    skipped = [0.0, 0.0, 1.0, 0.0, nan]  # threshold 0: any skip, and a NaN counter, fire
    assert fired_steps(AlarmRule("skipped", "nonfinite", 0.0), skipped) == [2, 4]
    assert fired_steps(AlarmRule("loss", "nonfinite", patience=3), [nan, nan, 1.0, nan, nan, nan]) == [5]


def test_warn_vs_pause_and_history_in_alarm():
    rules = (AlarmRule("kl", "above", 1.0), AlarmRule("kl", "above", 5.0, action="pause"))
    m = Monitor(MonitorConfig(rules=rules, history=3))
    assert m.observe(0, {"kl": 0.1}) == [] and m.observe(1, {"kl": 0.2}) == []
    warn = m.observe(2, {"kl": 2.0})
    assert [a.rule.action for a in warn] == ["warn"] and not mon.should_pause(warn)
    both = m.observe(3, {"kl": 9.0})  # the warn rule is still in its streak: only the pause rule fires
    assert [a.rule.action for a in both] == ["pause"] and mon.should_pause(both)
    assert both[0].value == 9.0 and both[0].step == 3
    assert both[0].history == ((1, 0.2), (2, 2.0), (3, 9.0))  # ring buffer of 3, newest last
    assert "kl" in both[0].message and "pause" in both[0].message


def test_missing_or_non_scalar_metrics_are_ignored():
    m = Monitor(MonitorConfig(rules=(AlarmRule("length/mean", "below", 2.0, patience=2),)))
    assert m.observe(0, {"length/mean": 1.0}) == []
    assert m.observe(1, {}) == []  # missing: neither advances nor resets the streak
    assert m.observe(2, {"length/mean": np.zeros(3), "other": "x"}) == []  # non-scalar: treated as missing
    alarms = m.observe(3, {"length/mean": np.float32(1.5)})
    assert [a.step for a in alarms] == [3] and alarms[0].history == ((0, 1.0), (3, 1.5))


def _stream(n: int) -> list[dict]:
    """Synthetic metrics that trip several default rules, with gaps and NaNs."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        d = {"entropy/mean": float(2.0 * 0.9 ** i + 0.01 * rng.random()), "kl": float(rng.random() * 2),
             "loss": nan if i % 17 in (5, 6, 7) else float(rng.normal()), "skipped": float(i % 17 == 5),
             "groups/zero_var_frac": float(rng.random()), "length/mean": float(rng.integers(0, 4))}
        if i % 7 == 3:
            del d["kl"]
        out.append(d)
    return out


def test_state_round_trip_mid_stream_gives_identical_alarms():
    cfg = MonitorConfig(rules=default_rules(), history=32)
    stream = _stream(80)
    whole = Monitor(cfg)
    expected = [a.to_dict() for i, d in enumerate(stream) for a in whole.observe(i, d)]
    first = Monitor(cfg)
    got = [a.to_dict() for i, d in enumerate(stream[:40]) for a in first.observe(i, d)]
    resumed = Monitor(cfg)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))  # strict JSON
    got += [a.to_dict() for i, d in enumerate(stream[40:], 40) for a in resumed.observe(i, d)]
    assert any(a["step"] >= 40 for a in expected)  # the resumed half has alarms to compare
    assert {a["rule"]["metric"] for a in expected} >= {"entropy/mean", "loss", "skipped", "kl"}
    assert json.dumps(got) == json.dumps(expected)


def test_alarm_report_is_written_atomically(tmp_path):
    m = Monitor(MonitorConfig(rules=(AlarmRule("loss", "nonfinite", action="pause"),)))
    m.observe(0, {"loss": 1.0})
    alarms = m.observe(1, {"loss": nan})
    md, js = mon.write_alarm_report(str(tmp_path / "reports" / "alarms.md"), alarms, step=1)
    assert sorted(os.listdir(tmp_path / "reports")) == ["alarms.json", "alarms.md"]  # no temp files left

    def reject(token):
        raise AssertionError(f"non-strict JSON constant {token}")
    report = json.loads(open(js).read(), parse_constant=reject)
    assert report["step"] == 1 and report["paused"] is True
    (a,) = report["alarms"]
    assert a["rule"]["metric"] == "loss" and a["value"] == "nan" and a["history"] == [[0, 1.0], [1, "nan"]]
    text = open(md).read()
    assert "step 1" in text and "loss" in text and "| 0 | 1 |" in text and "| 1 | nan |" in text


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="AlarmRule.kind"):
        AlarmRule("kl", "sideways", 1.0)
    with pytest.raises(ValueError, match="AlarmRule.action"):
        AlarmRule("kl", "above", 1.0, action="stop")
    with pytest.raises(ValueError, match="AlarmRule.threshold"):
        AlarmRule("entropy/mean", "drop", 1.5)
    with pytest.raises(ValueError, match="AlarmRule.patience"):
        AlarmRule("kl", "above", 1.0, patience=0)
    with pytest.raises(ValueError, match="MonitorConfig.history"):
        MonitorConfig(rules=(AlarmRule("entropy/mean", "drop", 0.5, window=20),), history=20)
    with pytest.raises(ValueError, match="MonitorConfig.rules"):
        MonitorConfig(rules=(AlarmRule("kl", "above", 1.0),) * 2)


def test_default_rules_cover_the_trainer_metrics_and_survive_config_json():
    cfg = MonitorConfig()
    watched = {(r.metric, r.kind) for r in cfg.rules}
    assert watched >= {("entropy/mean", "below_first_frac"), ("entropy/p50", "below_first_frac"),
                       ("entropy/mean", "drop"), ("groups/zero_var_frac", "above"),
                       ("collapse/drowned_dims", "above"), ("length/mean_frac", "above"), ("length/mean", "below"),
                       ("length/truncated_frac", "above"), ("repetition/rate", "above"), ("kl", "above"),
                       ("clip_frac_high", "above"), ("clip_frac_low", "above"), ("loss", "nonfinite"),
                       ("skipped", "nonfinite"), ("skipped", "above"), ("stalled_update", "above"),
                       ("rewards/error_frac", "above")}
    assert from_dict(MonitorConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg
    pausing = {r.name for r in cfg.rules if r.action == "pause"}
    assert pausing >= {"entropy_collapse", "group_variance_collapse", "stalled_update", "skipped_updates",
                       "reward_errors"}
    warned = MonitorConfig(collapse_action="warn")
    # only the non-finite loss rule and the skipped updates still pause (the run cannot train at all then), and a
    # reward that fails (a bug to fix, not a collapse to watch)
    assert {r.name for r in warned.rules if r.action == "pause"} == {"", "skipped_updates", "reward_errors"}
    assert from_dict(MonitorConfig, json.loads(json.dumps(to_dict(warned)))) == warned


def _fired(rules, stream):
    m = Monitor(MonitorConfig(rules=rules))
    return [(a.rule.name or a.rule.metric, a.step) for i, d in enumerate(stream) for a in m.observe(i + 1, d)]


def _rule(name):
    (r,) = [r for r in default_rules() if r.name == name]
    return r


# (rule, symptom stream, healthy stream): 30 steps each, values as the trainer logs them
ENTROPY_SICK = [{"entropy/mean": 0.3 * 0.85 ** i, "entropy/p50": 0.05 * 0.85 ** i} for i in range(30)]
ENTROPY_OK = [{"entropy/mean": 0.3 - 0.006 * i, "entropy/p50": 0.05 - 0.001 * i} for i in range(30)]  # ends 0.4x


@pytest.mark.parametrize("name, metric, sick, healthy", [
    ("entropy_collapse", "entropy/mean", ENTROPY_SICK, ENTROPY_OK),  # 0.3 -> under 0.03 by step 15
    ("entropy_median_collapse", "entropy/p50", ENTROPY_SICK, ENTROPY_OK),
    ("group_variance_collapse", "groups/zero_var_frac",
     [{"groups/zero_var_frac": min(1.0, 0.5 + 0.05 * i)} for i in range(30)],  # > 0.9 from step 10 on
     [{"groups/zero_var_frac": 0.5 + 0.3 * (i % 2)} for i in range(30)]),  # 0.8 at worst
    ("drowned_dimension", "collapse/drowned_dims",
     [{"collapse/drowned_dims": float(i >= 5)} for i in range(30)],  # one dimension ignored from step 6
     [{"collapse/drowned_dims": float(i % 3 == 0)} for i in range(30)]),  # a blip now and then
])
def test_default_collapse_alarms_fire_on_their_symptom_and_not_on_a_healthy_run(name, metric, sick, healthy):
    rule = _rule(name)
    fired = _fired((rule,), sick)
    assert [n for n, _ in fired] == [name]  # fires once (edge-triggered)
    first_bad = next(i + 1 for i, d in enumerate(sick) if (
        d[metric] < rule.threshold * sick[0][metric] if rule.kind == "below_first_frac" else d[metric] > rule.threshold))
    assert fired[0][1] == first_bad + rule.patience - 1  # after `patience` consecutive bad steps
    assert _fired((rule,), healthy) == []


def test_length_alarm_is_relative_to_the_budget():
    (rule,) = [r for r in default_rules() if r.metric == "length/mean_frac"]
    assert _fired((rule,), [{"length/mean_frac": 0.95}] * 6) and not _fired((rule,), [{"length/mean_frac": 0.6}] * 30)


def test_below_first_frac_state_survives_a_round_trip():
    rule = AlarmRule("entropy/mean", "below_first_frac", 0.5, patience=1, name="half")
    m = Monitor(MonitorConfig(rules=(rule,)))
    m.observe(1, {"entropy/mean": 0.0})  # not positive: not a reference
    m.observe(2, {"entropy/mean": 0.4})  # the reference
    resumed = Monitor(MonitorConfig(rules=(rule,)))
    resumed.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert [a.step for a in resumed.observe(3, {"entropy/mean": 0.19})] == [3]  # 0.19 < 0.5 * 0.4


def test_rollback_command_targets_the_checkpoint_before_the_streak():
    rule = _rule("entropy_collapse")  # patience 5
    m = Monitor(MonitorConfig(rules=(rule,)))
    alarms = [a for i, d in enumerate(ENTROPY_SICK) for a in m.observe(i + 1, d)]
    # step s logs 0.3 * 0.85^(s-1): step 15 gives 0.0308 (not under 0.1 x 0.3), step 16 0.0262 is the first
    # bad one, so with patience 5 it fires at step 20; a checkpoint at 16 is already inside the streak
    (alarm,) = alarms
    assert alarm.step == 20
    cmd = mon.rollback_command("runs/x", alarms, kept_steps=[5, 10, 16, 20])
    assert cmd == ("python -m grpo_jax.train --out runs/x --rollback-to 10 "
                   "--set temperature.mode=adaptive")


def test_rollback_command_remedies():
    median = _rule("entropy_median_collapse")
    m = Monitor(MonitorConfig(rules=(dataclasses.replace(median, action="pause"),)))
    alarms = [a for i, d in enumerate(ENTROPY_SICK) for a in m.observe(i + 1, d)]
    assert mon.rollback_command("o", alarms, [1]).endswith("--set temperature.mode=adaptive")
    kl = AlarmRule("kl", "above", 1.0, action="pause", name="kl_blowup")
    m = Monitor(MonitorConfig(rules=(kl,)))
    alarms = m.observe(3, {"kl": 2.0})
    # step 3's kl was measured on checkpoint 2's policy, so 1 is the newest clean checkpoint; a person chooses
    assert mon.rollback_command("o", alarms, [1, 2]).endswith("--rollback-to 1 --set KEY=VALUE")


def test_unknown_or_missing_rule_key_is_an_error_naming_the_rule_and_the_key():
    rules = json.dumps([{"metric": "kl", "kind": "above", "threshold": 1.0},
                        {"metric": "kl", "kind": "above", "treshold": 2.0, "name": "kl_high"}])
    with pytest.raises(ValueError, match=r"MonitorConfig.rules\[1\]: rule 'kl_high': unknown key\(s\) "
                                         r"\['treshold'\]; AlarmRule's fields: \['metric', 'kind', 'threshold'"):
        override(TrainConfig(), [f"monitor.rules={rules}"])
    with pytest.raises(ValueError, match=r"rules\[0\]: rule 'kl': missing key\(s\) \['kind'\]"):
        MonitorConfig(rules=({"metric": "kl"},))
    with pytest.raises(ValueError, match=r"rules\[0\]: rule 'kl': AlarmRule.patience: must be an int >= 1"):
        MonitorConfig(rules=({"metric": "kl", "kind": "above", "patience": 0},))
    with pytest.raises(ValueError, match=r"rules\[0\]: must be an AlarmRule or a dict"):
        MonitorConfig(rules=(["kl", "above"],))


def test_health_metrics_flag_a_zero_gradient_with_something_to_learn():
    V = 58
    top = math.log(V)
    flagged = [
        {"grad_norm": 0.0, "groups/reward_var_mean": 0.05, "entropy/mean": 2.0},  # rewards vary, no gradient
        {"grad_norm": 0.0, "groups/reward_var_mean": 0.0, "entropy/mean": top},  # uniform policy, no gradient
    ]
    clean = [
        {"grad_norm": 0.3, "groups/reward_var_mean": 0.05, "entropy/mean": top},  # a gradient
        {"grad_norm": 0.0, "groups/reward_var_mean": 0.0, "entropy/mean": 0.998 * top},  # nothing to learn
        {"grad_norm": nan, "groups/reward_var_mean": 0.05, "entropy/mean": top},  # skipped: other rules
    ]
    assert [mon.health_metrics(m, vocab_size=V)["stalled_update"] for m in flagged] == [1.0, 1.0]
    assert [mon.health_metrics(m, vocab_size=V)["stalled_update"] for m in clean] == [0.0, 0.0, 0.0]
    assert mon.health_metrics({"entropy/mean": top / 2}, vocab_size=V) == {"entropy/frac_of_max": 0.5}
    (rule,) = [r for r in default_rules() if r.name == "stalled_update"]
    stream = [mon.health_metrics(flagged[i % 2], vocab_size=V) for i in range(8)]
    assert _fired((rule,), stream) == [("stalled_update", rule.patience)]
    (warned,) = [r for r in MonitorConfig(collapse_action="warn").rules if r.name == "stalled_update"]
    assert rule.action == "pause" and warned.action == "warn"  # follows the collapse action


def test_skipped_updates_pause_after_three_steps_running():
    (rule,) = [r for r in default_rules() if r.name == "skipped_updates"]
    assert rule.action == "pause"
    assert _fired((rule,), [{"skipped": s} for s in (0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 1.0)]) == [("skipped_updates", 7)]


# a blow-up at step 5 (kl above 1 for steps 5-7), entropy falling by 0.7 a step from step 6 (so it halves
# within 2 steps from step 7 on), under a tenth of its start from step 11: the entropy_collapse alarm's own
# streak begins at 11, the trouble at 5
BLOWUP = ([{"kl": 0.01, "entropy/mean": 2.0}] * 4 + [{"kl": 3.0, "entropy/mean": 1.5}]
          + [{"kl": 2.0 if i == 0 else 1.5 if i == 1 else 0.1, "entropy/mean": 1.05 * 0.7 ** i} for i in range(12)])


def test_rollback_targets_the_checkpoint_before_the_first_symptom_of_any_rule(tmp_path):
    rules = (_rule("entropy_collapse"), AlarmRule("kl", "above", 1.0, patience=3),
             AlarmRule("entropy/mean", "drop", 0.5, window=2))
    m = Monitor(MonitorConfig(rules=rules))
    alarms = [a for i, d in enumerate(BLOWUP) for a in m.observe(i + 1, d)]
    (collapse,) = [a for a in alarms if a.rule.name == "entropy_collapse"]
    assert collapse.step == 15  # under 0.2 (0.1 x 2.0) from step 11, patience 5
    kept = [2, 3, 4, 8, 10, 15]
    assert "--rollback-to 8 " in mon.rollback_command("o", [collapse], kept)  # from the alarm's streak alone
    trouble = m.trouble([collapse], kept)
    # kl holds at 5-7 and the drop rule from 7 on: one unbroken run of symptoms from step 5
    assert trouble["began"] == 5 and trouble["first_symptoms"] == ["kl: kl above 1 for 3 step(s) -> warn"]
    assert trouble["rollback_step"] == 3 and trouble["before_trouble"]  # checkpoint 4's policy ran step 5
    assert trouble["abnormal_at_rollback"] == []
    cmd = mon.rollback_command("o", [collapse], kept, began=trouble["began"])
    assert "--rollback-to 3 " in cmd
    # no clean checkpoint kept: the oldest kept one, and what its first step already showed
    late = m.trouble([collapse], kept_steps=[8, 10, 15])
    assert late["rollback_step"] == 8 and not late["before_trouble"]
    assert late["abnormal_at_rollback"] == ["entropy/mean: entropy/mean drop 0.5 over 2 observations for 1 step(s) "
                                            "-> warn"]
    md, js = mon.write_alarm_report(str(tmp_path / "a"), [collapse], 15, command=cmd, trouble=late)
    text = open(md).read()
    assert "first symptom: step 5" in text and "no kept checkpoint comes from before it" in text
    assert "Roll back to the oldest kept checkpoint (none comes from before the trouble)" in text
    assert json.loads(open(js).read())["trouble"]["began"] == 5
    resumed = Monitor(MonitorConfig(rules=rules))  # the symptoms survive a checkpoint round trip
    resumed.load_state_dict(json.loads(json.dumps(m.state_dict(), allow_nan=False)))
    assert resumed.trouble([collapse], kept) == trouble
