"""A reward that fails is loud: counted per dimension and step, each kind said once (events.jsonl and a one-line
warning), a failure on every row of the first step stops the run naming the reward and the error, and the
`reward_errors` alarm pauses a run whose reward fails on a share of rows, with the reward, the error and the fix
in its message. None from a user reward means "does not apply" (masked, not 0); TRL's reward signature works as
TRL's documentation writes it."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from grpo_jax import advantages, experience, failures, monitor, train
from grpo_jax.config import AdvantageConfig, AlarmRule
from grpo_jax.rewards.registry import RewardSpec, evaluate
from grpo_jax.runlog import read_jsonl
from tests.test_train import TINY, tiny_config

# 5 prompts x 4 completions: 20 rows a step, so a reward failing on calls 0-2 of every 10 fails on 6 (30%)
ROWS = ["prompts_per_step=5", "sampling.group_size=4"]


def _module(tmp_path, monkeypatch, name: str, source: str) -> str:
    """A reward module of the user's, importable by path (a fresh module name per test: loads are cached)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _specs(path: str, weight: float = 0.1) -> str:
    return "rewards.specs=" + json.dumps([{"name": "math"}, {"name": path, "weight": weight}])


def test_failure_counts_per_dimension_and_the_largest_failed_share():
    reasons = [{"math": "ok", "mine": "internal_error"}, {"math": "ok", "mine": "bad_score"},
               {"math": "internal_error", "mine": "not_applicable"}, {"math": "ok", "mine": "ok"}]
    counts = experience.failure_counts(reasons, ["math", "mine"])
    assert counts["rewards/mine/errors"] == 2 and counts["rewards/math/errors"] == 1
    assert counts["rewards/mine/not_applicable"] == 1 and counts["rewards/math/not_applicable"] == 0
    assert counts["rewards/error_frac"] == 2 / 4  # mine's share, the larger


class _Log:
    def __init__(self):
        self.events = []

    def event(self, step, kind, **info):
        self.events.append((step, kind, info))


def test_each_kind_of_failure_is_said_once_and_a_total_failure_on_the_first_step_stops():
    boom = {"dimension": "mine", "reward": "m:r", "kind": "ValueError", "error": "ValueError: boom", "where": "m.py:3 in r"}
    some = [{"mine": "internal_error"}, {"mine": "ok"}]
    seen, log = failures.RewardFailures(), _Log()
    with pytest.warns(RuntimeWarning, match=r"step 1: reward 'm:r' \(dimension 'mine'\): ValueError: boom \(at m\.py:3 "
                                            r"in r\) on 1 of 2 rows"):
        seen.check(1, [boom], some, log, first=True)  # not every row: no stop
    seen.check(2, [boom], some, log, first=False)  # said already: no second event
    assert [(s, k, i["rows"], i["error"]) for s, k, i in log.events] == [(1, "reward_error", 1, "ValueError: boom")]
    every = [{"mine": "internal_error"}, {"mine": "bad_score"}]
    seen.check(3, [boom], every, log, first=False)  # every row, but not the first step: the alarm's business
    with pytest.raises(failures.RewardFailed, match=r"reward 'm:r' \(dimension 'mine'\): ValueError: boom .* failed "
                                                    r"on every row of the first step \(2 completions\)"):
        failures.RewardFailures().check(1, [boom], every, _Log(), first=True)


def test_the_reward_errors_alarm_names_the_reward_the_error_and_the_fix():
    mon = monitor.Monitor(monitor.MonitorConfig(rules=(AlarmRule("rewards/error_frac", "above", 0.1, action="pause",
                                                                 name=failures.REWARD_ERRORS_RULE),)))
    seen = failures.RewardFailures()
    seen.check(4, [{"dimension": "mine", "reward": "m:r", "kind": "ValueError", "error": "ValueError: boom",
                    "where": None}], [{"mine": "internal_error"}] + [{"mine": "ok"}] * 2, _Log(), first=False)
    [alarm] = seen.explain(mon.observe(4, {"rewards/error_frac": 1 / 3}))
    assert "reward 'm:r' (dimension 'mine'): ValueError: boom" in alarm.message
    assert "Fix the reward function" in alarm.message and "Dynamic sampling or a rollback cannot help" in alarm.message
    assert monitor.should_pause([alarm])


def test_a_reward_failing_on_every_row_stops_the_first_step_with_its_name_and_error(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "always_boom", """
        def exploding(completion, **row):
            raise ValueError("boom")
    """)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:  # the command line: one line, naming the reward and the error
        train.main(["--smoke", "--out", str(out), *(f"--set={s}" for s in [*TINY, _specs(f"{name}:exploding")])])
    line = str(e.value)
    assert line.startswith("error: reward 'always_boom:exploding' (dimension 'exploding'): ValueError: boom (at ")
    assert "failed on every row of the first step" in line and "\n" not in line
    assert not read_jsonl(str(out / "metrics.jsonl"))  # stopped before the first update was logged
    [event] = [e for e in read_jsonl(str(out / "events.jsonl")) if e["kind"] == "reward_error"]
    assert event["error"] == "ValueError: boom" and event["rows"] == event["of"] > 0


def test_a_reward_failing_on_30_percent_of_rows_is_counted_and_pauses_the_run_with_its_error(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "sometimes_boom", """
        calls = 0

        def flaky(completion, **row):
            global calls
            calls += 1
            if (calls - 1) % 10 < 3:
                raise ValueError("boom")
            return float(len(completion) % 2)
    """)
    out = tmp_path / "run"
    t = train.Trainer(tiny_config(*ROWS, _specs(f"{name}:flaky")), str(out))
    with pytest.warns(UserWarning, match=r"rewards/error_frac = 0\.3 .*reward 'sometimes_boom:flaky' \(dimension "
                                         r"'flaky'\): ValueError: boom"):
        summary = t.run()
    assert summary["paused"] and summary["steps"] == 1
    [row] = read_jsonl(str(out / "metrics.jsonl"))
    assert row["rewards/flaky/errors"] == 6 and row["rewards/math/errors"] == 0 and row["rewards/error_frac"] == 0.3
    events = read_jsonl(str(out / "events.jsonl"))
    [alarm] = [e for e in events if e["kind"] == "alarm"]
    assert alarm["key"] == "reward_errors" and "ValueError: boom" in alarm["message"]
    assert "sometimes_boom:flaky" in alarm["message"] and "Fix the reward function" in alarm["message"]
    assert "ValueError: boom" in (out / "alarms" / "step-1.md").read_text()


def test_none_means_does_not_apply_and_the_estimators_leave_the_row_out():
    # rows 0-1 of a group of 4 get None from the second reward; GDPO's per-dimension z-score of that dimension
    # is then over rows 2-3 only, as if the group had two rows there (TRL's nansum / per-dimension nanmean)
    specs = [RewardSpec("math"), RewardSpec("tests.test_reward_failures:half_applies", version="1")]
    rewards, infos = evaluate(specs, ["a", "bb", "a", "bb"], [{"prompt": "p", "answer": "1"}] * 4)
    assert np.isnan(rewards[:2, 1]).all() and list(rewards[2:, 1]) == [1.0, 2.0]
    assert [infos["per_response"][i]["half_applies"]["reason"] for i in range(4)][:2] == ["not_applicable"] * 2
    adv, _ = advantages.compute_advantages(rewards[None], np.array([0.0, 1.0], np.float32),
                                           cfg=AdvantageConfig(estimator="gdpo"))
    cfg = AdvantageConfig()
    fused = np.array([0.0, 0.0, *((np.array([1.0, 2.0]) - 1.5) / (np.std([1.0, 2.0], ddof=1) + cfg.eps))])
    expect = (fused - fused.mean()) / (fused.std(ddof=1) + cfg.batch_norm_eps)  # GDPO's batch z-score after
    np.testing.assert_allclose(np.asarray(adv)[0], expect, rtol=1e-5)  # masked rows: 0, not a score of 0


_half_calls = []


def half_applies(completion, **row):
    """None on the first two calls of every four, else the completion's length."""
    _half_calls.append(completion)
    return None if (len(_half_calls) - 1) % 4 < 2 else float(len(completion))


def test_unbounded_user_scores_reach_the_estimators_as_they_are():
    # a penalty of -0.5 and a bonus of 2 are no longer clamped to [0, 1]: the advantage of a group scored
    # (-0.5, 2, 0.5, 0.5) is its z-score, and scaling every score by 100 leaves it unchanged
    r = np.array([[[-0.5], [2.0], [0.5], [0.5]]], np.float32)
    adv, _ = advantages.compute_advantages(r, np.ones(1, np.float32), cfg=AdvantageConfig(estimator="grpo"))
    adv100, _ = advantages.compute_advantages(100 * r, np.ones(1, np.float32), cfg=AdvantageConfig(estimator="grpo"))
    x = r[0, :, 0].astype(np.float64)
    expect = (x - x.mean()) / (x.std(ddof=1) + AdvantageConfig().eps)
    np.testing.assert_allclose(np.asarray(adv)[0], expect, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(adv100), np.asarray(adv), rtol=1e-5)
    assert np.all(np.isfinite(np.asarray(adv)))


# TRL's documented reward shapes (huggingface.co/docs/trl, "Reward Functions": think_format_reward(completions,
# **kwargs) and accuracy_reward(completions, solution, **kwargs) read completion[0]["content"] of conversational
# completions; GRPOTrainer passes prompts, completions, completion_ids and the dataset's other columns by keyword)
def trl_format(completions, **kwargs):
    return [1.0 if c[0]["content"].startswith("<think>") else 0.0 for c in completions]


def trl_accuracy(completions, solution, **kwargs):
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]


def trl_everything(prompts, completions, completion_ids, **kwargs):
    return [float(len(ids)) + (0.5 if isinstance(p, list) else 0.0) for p, ids in zip(prompts, completion_ids)]


def trl_plain(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_trl_reward_functions_work_as_trl_users_write_them():
    chat = {"messages": [{"role": "user", "content": "1+1?"}], "solution": "2", "completion_ids": [5, 6, 7]}
    plain = {"prompt": "1+1=", "solution": "2", "completion_ids": [5]}
    specs = [RewardSpec(f"tests.test_reward_failures:{f}") for f in
             ("trl_format", "trl_accuracy", "trl_everything")]
    rewards, infos = evaluate(specs, ["<think>x</think> 2", "2"], [chat, chat])
    np.testing.assert_array_equal(rewards, [[1.0, 0.0, 3.5], [0.0, 1.0, 3.5]])
    assert all(v.startswith("src-") for v in infos["versions"].values())  # undecorated: versioned by source digest
    # plain-text rows: completions and prompts are strings, as TRL passes them for standard (non-chat) data
    text, _ = evaluate([RewardSpec("tests.test_reward_failures:trl_plain"),
                        RewardSpec("tests.test_reward_failures:trl_everything")], ["abc"], [plain])
    np.testing.assert_array_equal(text, [[3.0, 1.0]])


def trl_conversational_on_plain_rows(completions, **kwargs):
    return [c[0]["content"] for c in completions]  # TRL's conversational indexing, on text completions


def trl_wrong_length(completions, **kwargs):
    return [1.0]


def test_a_batched_reward_that_fails_fails_every_row_with_its_error():
    rows = [{"prompt": "p"}] * 3
    rewards, infos = evaluate([RewardSpec("tests.test_reward_failures:trl_conversational_on_plain_rows"),
                               RewardSpec("tests.test_reward_failures:trl_wrong_length")], ["a", "b", "c"], rows)
    assert np.isnan(rewards).all()
    first, second = infos["per_response"][0].values()
    assert first["reason"] == "internal_error" and first["error"].startswith("TypeError: string indices must be")
    assert second["error_kind"] == "wrong_length" and "returned 1 scores for 3 completions" in second["error"]


def test_a_when_condition_on_an_unbounded_user_reward_is_refused_naming_it():
    from grpo_jax.rewards.registry import dimension_names

    specs = [RewardSpec("tests.test_reward_failures:trl_plain"), RewardSpec("math", when="trl_plain")]
    with pytest.raises(ValueError, match=r"when='trl_plain', which needs reward 'tests\.test_reward_failures:trl_plain' "
                                         r"to declare its high score"):
        dimension_names(specs)


def edited_before(completion, **row):
    return 1.0


def edited_after(completion, **row):
    return 0.0


def test_a_resume_whose_reward_source_changed_says_so(tmp_path):
    from grpo_jax import provenance
    from grpo_jax.config import TrainConfig

    before = RewardSpec("tests.test_reward_failures:edited_before", label="r")
    after = RewardSpec("tests.test_reward_failures:edited_after", label="r")  # the same dimension, edited code
    out, cfg = str(tmp_path), TrainConfig()
    assert not [k for k, _ in provenance.record_start(out, cfg, [before], start_step=0)
                if k == "reward_version_changed"]
    assert not [k for k, _ in provenance.record_start(out, cfg, [before], start_step=2)
                if k == "reward_version_changed"]  # resumed with the same code: nothing to say
    notes = dict(provenance.record_start(out, cfg, [after], start_step=4))
    assert "dimension 'r'" in notes["reward_version_changed"] and "steps from 4 on" in notes["reward_version_changed"]
    assert "src-" in notes["reward_version_changed"]
