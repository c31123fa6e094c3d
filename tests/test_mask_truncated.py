"""`loss.mask_truncated`: a completion cut at max_new_tokens without an EOS adds nothing to
the loss or its gradient; the other rows train exactly as if it were not in the batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import experience, sampler, train, update
from tests.test_update_direction import T, _batch, _config, model  # noqa: F401  (model is a fixture)


def _rollout(truncated) -> sampler.Rollout:
    """A 1 x 3 group whose rows all have T completion tokens; `truncated` [3] marks which hit the cap."""
    g = len(truncated)
    return sampler.Rollout(
        prompt_tokens=jnp.ones((1, 4), jnp.int32), prompt_mask=jnp.ones((1, 4), bool),
        tokens=jnp.full((1, g, T), 5, jnp.int32), completion_mask=jnp.ones((1, g, T), jnp.int32),
        logprobs=jnp.zeros((1, g, T)), entropies=jnp.zeros((1, g, T)), policy_entropies=jnp.zeros((1, g, T)),
        lengths=jnp.full((1, g), T, jnp.int32),
        truncated=jnp.asarray([truncated]), temperatures=jnp.ones((1, g, T)), policy_mask=jnp.ones((1, g, T), bool))


def test_batch_masks_only_the_truncated_rows_and_only_when_asked():
    ro = _rollout([False, True, False])
    adv = jnp.asarray([[1.0, -1.0, 0.5]])
    off = experience.batch_from_rollout(ro, adv)
    on = experience.batch_from_rollout(ro, adv, mask_truncated=True)
    np.testing.assert_array_equal(np.asarray(off.loss_mask), np.ones((3, T), bool))
    np.testing.assert_array_equal(np.asarray(on.loss_mask).all(axis=1), [True, False, True])
    np.testing.assert_array_equal(np.asarray(on.loss_mask).any(axis=1), [True, False, True])
    np.testing.assert_array_equal(np.asarray(on.advantages), np.asarray(off.advantages))  # advantages untouched


def test_a_masked_truncated_row_contributes_nothing_to_the_update(model):  # noqa: F811
    """The train step on [A (A=+1), B (A=-1, masked)] equals the step on [A] alone: same loss, same gradient
    norm, same params after the update (Adam's update is a function of the gradient), the params measured
    against the update because the two batch shapes sum in different orders and Adam turns that noise on an
    element whose gradient is ~0 into a visible fraction of a step. Without the mask, B changes all three.
    Checked for the GRPO aggregation, which counts rows, and the token mean."""
    from tests.test_train import _assert_same_update

    model_cfg, params = model
    for agg in ("seq-mean-token-mean", "token-mean"):
        cfg = _config(f"loss.agg_mode={agg}")
        optimizer = update.make_optimizer(cfg)
        step = jax.jit(update.make_train_step(model_cfg, cfg, optimizer))

        def run(batch):
            state = update.initial_state(cfg, model_cfg, jax.tree.map(jnp.copy, params), optimizer,
                                         jax.random.key(0))
            new_state, metrics = step(state, batch, jax.random.key(1), jnp.float32(0.0))
            return float(metrics["loss"]), float(metrics["grad_norm"]), jax.tree.leaves(new_state.params)

        both = _batch(model_cfg, params, ("A", "B"), (1.0, -1.0))
        masked = both.replace(loss_mask=both.loss_mask.at[1].set(False))  # what mask_truncated gives for row B
        alone = _batch(model_cfg, params, ("A",), (1.0,))
        loss_m, norm_m, params_m = run(masked)
        loss_a, norm_a, params_a = run(alone)
        loss_b, norm_b, _ = run(both)
        assert norm_a > 0
        np.testing.assert_allclose(loss_m, loss_a, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(norm_m, norm_a, rtol=1e-5)
        _assert_same_update(params_m, params_a, jax.tree.leaves(params), lr=cfg.optim.lr)
        assert abs(norm_b - norm_a) > 1e-3 * norm_a  # unmasked, the -1 row does change the update


def test_trainer_applies_loss_mask_truncated(tmp_path):
    """Through the Trainer: with `loss.mask_truncated=true` the same first step (same rollout: the key and
    params do not depend on the loss settings) has a different gradient when some completions are cut."""
    from tests.test_train import signal_config

    out = {}
    for flag in ("false", "true"):
        tr = train.Trainer(signal_config("steps=1", f"loss.mask_truncated={flag}"), str(tmp_path / flag), quiet=True)
        step = tr.step_once()
        metrics, exp = step.metrics, step.experience
        out[flag] = (metrics["grad_norm"], np.asarray(exp.rollout.truncated), np.asarray(exp.rollout.tokens))
    np.testing.assert_array_equal(out["true"][2], out["false"][2])  # the same rollout
    truncated = out["true"][1]
    assert truncated.any() and not truncated.all(), truncated  # the 12-token cap cuts some completions
    assert out["false"][0] > 0 and out["true"][0] > 0
    assert abs(out["true"][0] - out["false"][0]) > 1e-6 * out["false"][0]
