"""The host side of a step: Experience -> Batch, dynamic-sampling group selection, one weighted total."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import experience, train
from grpo_jax.advantages import weighted_total
from grpo_jax.config import DynamicSamplingConfig
from tests.test_train import tiny_config

BATCH_FIELDS = [f.name for f in dataclasses.fields(experience.Batch)]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return train.Trainer(tiny_config("steps=1"), str(tmp_path_factory.mktemp("run")), quiet=True)


def _experience(tr, key=0, n=4):
    weights = tr.reward_weights.at(0)
    return experience.experience(tr.actor, tr.state.params, tr.next_rows(n), jax.random.key(key),
                                 temperature=1.0), weights


def test_batch_from_experience_sets_every_field_with_the_rollouts_rows(trainer):
    exp, weights = _experience(trainer)
    adv = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)
    batch = experience.make_batch(exp, adv, trainer.mesh)
    ro = exp.rollout
    p, t = ro.prompt_tokens.shape[1], ro.tokens.shape[2]
    for name in BATCH_FIELDS:
        value = getattr(batch, name)
        assert isinstance(value, jax.Array), name  # nothing left as None or a placeholder
        assert value.shape[0] == 16, name
    assert batch.tokens.shape == (16, p + t) and batch.loss_mask.shape == (16, t)
    # row n = (b, g) row-major: prompt b then completion (b, g)
    np.testing.assert_array_equal(batch.tokens[5, :p], ro.prompt_tokens[1])
    np.testing.assert_array_equal(batch.tokens[5, p:], ro.tokens[1, 1])
    np.testing.assert_array_equal(batch.advantages, np.arange(16))
    np.testing.assert_array_equal(batch.old_logp, np.asarray(ro.logprobs).reshape(16, t))


@pytest.mark.parametrize("missing", BATCH_FIELDS)
def test_a_batch_with_a_field_left_unset_fails_at_construction(missing):
    values = {name: jnp.zeros((2, 3)) for name in BATCH_FIELDS if name != missing}
    with pytest.raises(TypeError, match=missing):
        experience.Batch(**values)


def test_rollout_prompts_are_left_aligned_once(trainer):
    exp, _ = _experience(trainer)
    mask = np.asarray(exp.rollout.prompt_mask)
    width = mask.shape[1]
    assert width & (width - 1) == 0  # a power-of-two bucket
    assert mask[:, -1].all()  # real tokens flush right
    # each row's mask is zeros then ones: no hole in the middle
    assert all(np.all(np.diff(row.astype(int)) >= 0) for row in mask)


def test_select_groups_across_rounds_keeps_each_groups_sequences(trainer):
    """Groups picked from two rounds (different prompts, possibly different bucket widths) give the same
    prompt + completion tokens, masks and rewards as in their own round, only padded further left."""
    rounds = [_experience(trainer, key=k, n=n)[0] for k, n in ((1, 4), (2, 3))]
    selection = [(1, 2), (0, 0), (1, 0)]
    picked = experience.select_groups(rounds, selection, pad_id=trainer.actor.tokenizer.pad_id)
    seq, seq_mask = (np.asarray(x) for x in experience.full_sequences(picked.rollout))
    g = picked.rollout.tokens.shape[1]
    for j, (rnd, i) in enumerate(selection):
        own, own_mask = (np.asarray(x) for x in experience.full_sequences(rounds[rnd].rollout))
        for k in range(g):
            mine, theirs = seq[j * g + k][seq_mask[j * g + k]], own[i * g + k][own_mask[i * g + k]]
            np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_array_equal(picked.rewards[j], rounds[rnd].rewards[i])
        assert picked.rows[j] == rounds[rnd].rows[i]
        assert picked.texts[j * g : (j + 1) * g] == rounds[rnd].texts[i * g : (i + 1) * g]


def test_collect_with_dynamic_sampling_keeps_only_groups_whose_totals_vary(trainer):
    weights = trainer.reward_weights.at(0)
    dyn = DynamicSamplingConfig(enabled=True, oversample=2.0, max_rounds=2)
    exp, metrics = experience.collect(trainer.actor, trainer.state.params, trainer.next_rows, jax.random.key(3),
                                      n_prompts=3, weights=weights, dynamic=dyn,
                                      advantage=trainer.cfg.advantage, temperature=1.0)
    assert exp.rewards.shape[:2] == (3, 4) and len(exp.rows) == 3 and len(exp.texts) == 12
    totals = np.asarray(weighted_total(exp.rewards, weights))
    informative = totals.max(axis=1) > totals.min(axis=1)
    # informative groups first; fill (zero-variance groups) only when the rounds ran out
    assert informative.sum() == metrics["dynamic/kept"]
    assert list(informative) == sorted(informative, reverse=True)
