"""The sampler-trainer gap through the real update step and the Trainer: gap/* metrics against a NumPy
recomputation, measured every gap_every steps, and the corrections acting on (only) a real gap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import experience, sampler, train, update
from tests.test_train import (_assert_moved, _assert_real_signal, _assert_same_update, _leaves, completion_logits,
                              signal_config, step_logprob_tol, tiny_config)
from tests.tolerance import EPS32, gap_tols, logprob_tol

T = 12


def _setup(*extra):
    """(model config, state, jitted step, batch of 4 prompts x G=4 sampled by the state's own params, with
    advantages of both signs) for a tiny model."""
    cfg = tiny_config(*extra)
    model_cfg = models.tiny(vocab_size=58)
    opt = update.make_optimizer(cfg)
    state = update.initial_state(cfg, model_cfg, models.init_params(model_cfg, jax.random.key(0)), opt,
                                 jax.random.key(0))
    step = jax.jit(update.make_train_step(model_cfg, cfg, opt))
    prompts, mask = jnp.full((4, 8), 9), jnp.ones((4, 8), bool)
    ro = sampler.sample(model_cfg, state.params, prompts, mask, key=jax.random.key(1), group_size=4,
                        max_new_tokens=T)
    batch = experience.batch_from_rollout(ro, jnp.linspace(-1, 1, 16))
    return model_cfg, state, (lambda st, bt: step(st, bt, jax.random.key(2), jnp.float32(0.0))), batch


def _logp_tol(model_cfg, state, batch) -> float:
    """How far two float32 programs' logprobs of the batch's completion tokens may be apart (the sampler's and
    the trainer's, the update step's and chunked_logprobs'): tests/tolerance.logprob_tol."""
    logits = completion_logits(model_cfg, state.params, batch)
    return logprob_tol(logits[np.asarray(batch.loss_mask, bool)], model_cfg)


def _numpy_gap(trainer, sampler_lp, mask, bound):
    """The gap metrics from their definitions (diagnostics.sampler_trainer_gap's docstring), in float64."""
    trainer, sampler_lp, mask = (np.asarray(x, np.float64) for x in (trainer, sampler_lp, mask))
    m = mask.astype(bool)
    x = (trainer - sampler_lp)[m]
    rho = np.exp(x)
    seq = np.where(m, trainer - sampler_lp, 0.0).sum(-1)[m.any(-1)]
    return {"gap/abs_logp": np.abs(x).mean(), "gap/kl": (np.expm1(x) - x).mean(), "gap/ratio_max": rho.max(),
            "gap/ratio_min": rho.min(), "gap/ratio_p99": np.percentile(rho, 99),
            "gap/token_out_frac": (np.abs(x) > np.log(bound)).mean(),
            "gap/seq_out_frac": (np.abs(seq) > np.log(bound)).mean()}


def test_gap_metrics_measure_a_known_perturbation():
    # The sampler's logprobs equal teacher forcing (~1e-7), so shifting them by a chosen delta on chosen
    # tokens makes a gap whose every metric we can recompute from the trainer's own logprobs.
    model_cfg, state, step, batch = _setup("sampling.old_logp_source=recompute", "logging.gap_bound=1.5")
    mask = np.asarray(batch.loss_mask)
    rng = np.random.default_rng(0)
    delta = np.where(rng.random(mask.shape) < 0.3, rng.normal(0, 0.6, mask.shape), 0.0).astype(np.float32)
    perturbed = batch.replace(old_logp=batch.old_logp + delta)
    _, metrics = step(state, perturbed)
    trainer = update.chunked_logprobs(model_cfg, state.params, batch, T)
    want = _numpy_gap(trainer, perturbed.old_logp, mask, 1.5)
    assert 0.02 < want["gap/token_out_frac"] < 0.5 and 0 < want["gap/seq_out_frac"] < 1  # both sides of C
    # the step's float32 metrics against the float64 definitions on chunked_logprobs' trainer logprobs: the step
    # computes those in another program (logp_err: logprob_tol), then the metrics round (tests/tolerance.gap_tols)
    delta = _logp_tol(model_cfg, state, batch)
    tols = gap_tols(trainer, perturbed.old_logp, mask, logp_err=delta)
    for name, value in want.items():
        np.testing.assert_allclose(float(metrics[name]), value, rtol=0, atol=tols[name], err_msg=name)
    # unperturbed: the float32 sampler and trainer agree to logprob_tol (delta), and k3 does not round to 0 (its
    # series form): |log rho| <= delta (1 + eps/2), its mean (n roundings) within n eps/2 of that, rho within
    # e^delta and one rounding, k3 <= k3(delta) and its few roundings
    _, clean = step(state, batch)
    n, x = int(mask.sum()), delta * (1 + EPS32 / 2)
    assert float(clean["gap/abs_logp"]) <= x * (1 + n * EPS32 / 2)
    assert float(clean["gap/ratio_max"]) <= np.exp(x) * (1 + EPS32)
    assert 0 <= float(clean["gap/kl"]) <= (np.expm1(x) - x) * (1 + (n + 4) * EPS32 / 2)
    assert float(clean["gap/token_out_frac"]) == 0.0


def test_tis_acts_on_a_gap_and_is_the_plain_update_without_one():
    # tis_cap 1: weight min(pi_old / pi_sampler, 1). Lowering the sampler's logprobs (rho > 1) changes no
    # weight; raising them (rho < 1) shrinks those tokens' gradient, so the update differs.
    _, state, plain_step, batch = _setup("sampling.old_logp_source=recompute")
    _, _, tis_step, _ = _setup("sampling.old_logp_source=recompute", "loss.tis_cap=1.0")
    plain, m_plain = plain_step(state, batch)
    tis, m_tis = tis_step(state, batch)
    _assert_real_signal([float(m_plain["grad_norm"]), float(m_tis["grad_norm"])])
    # the token mean of min(rho, 1), |log rho| <= logprob_tol (sampler against the recomputed pi_old): within
    # 1 - e^-delta <= delta of 1, and the mean's n roundings
    delta = _logp_tol(models.tiny(vocab_size=58), state, batch)
    n = int(np.asarray(batch.loss_mask).sum())
    np.testing.assert_allclose(float(m_tis["is_weight"]), 1.0, rtol=0, atol=delta + n * EPS32 / 2)
    # no gap: the same update (rho = 1 +- 1e-7 becomes weight min(rho, 1); Adam's first step amplifies
    # that on elements whose gradient is ~0, hence _assert_same_update's tolerance, not equality)
    _assert_same_update(_leaves(tis.params), _leaves(plain.params), _leaves(state.params))
    lowered, _ = tis_step(state, batch.replace(old_logp=batch.old_logp - 0.5))
    # rho = e^0.5 > 1 is capped to 1: still the same update
    _assert_same_update(_leaves(lowered.params), _leaves(plain.params), _leaves(state.params))
    # raising the first 8 rows' sampler logprobs by 0.5 weighs their tokens e^-0.5 and leaves the rest at 1
    # (uniform weights would not do: Adam's first step does not see the gradient's scale)
    rows = (jnp.arange(16) < 8)[:, None]
    raised, m_raised = tis_step(state, batch.replace(old_logp=batch.old_logp + jnp.where(rows, 0.5, 0.0)))
    mask = np.asarray(batch.loss_mask)
    n_raised = mask[:8].sum()
    want = (n_raised * np.exp(-0.5) + (mask.sum() - n_raised)) / mask.sum()
    np.testing.assert_allclose(float(m_raised["is_weight"]), want, rtol=1e-4)
    _assert_moved(_leaves(plain.params), _leaves(raised.params), at_least=1e-6)


def test_icepop_masking_every_token_leaves_no_policy_gradient():
    # Every sampler logprob raised by 1: rho = e^-1 < 0.5 on every token, so IcePop (0.5, 2) masks all of
    # them; with no KL and no entropy term nothing else has a gradient.
    _, state, step, batch = _setup("sampling.old_logp_source=recompute", "loss.icepop=[0.5, 2.0]")
    _, m_clean = step(state, batch)
    assert float(m_clean["grad_norm"]) > 0 and float(m_clean["icepop_masked"]) == 0.0
    new, metrics = step(state, batch.replace(old_logp=batch.old_logp + 1.0))
    assert float(metrics["icepop_masked"]) == 1.0 and float(metrics["grad_norm"]) == 0.0
    for a, b in zip(_leaves(new.params), _leaves(state.params)):
        np.testing.assert_array_equal(a, b)


def test_trainer_logs_the_gap_every_n_steps(tmp_path):
    # gap_every=2 with the sampler's logprobs as pi_old: steps 0 and 2 pay the extra teacher-forced pass
    # and log gap/*, step 1 logs none; a float32 run's gap is rounding noise.
    tr = train.Trainer(signal_config("logging.gap_every=2"), str(tmp_path), quiet=True)
    rows, deltas = [], []
    for _ in range(3):
        params = jax.tree.map(np.asarray, tr.policy_params())  # a copy: the step donates the state
        out = tr.step_once()
        rows.append(out.metrics)
        deltas.append(step_logprob_tol(tr, params, out))  # sampler against trainer, logprob_tol
    _assert_real_signal([r["grad_norm"] for r in rows])
    assert [("gap/kl" in r) for r in rows] == [True, False, True]
    assert not any(k.startswith("gap/") for k in rows[1]) and "gap/measured" not in rows[0]
    for r, delta in ((rows[0], deltas[0]), (rows[2], deltas[2])):  # a mean of |log rho| <= delta, n roundings
        n = r["num_tokens"]
        assert r["gap/abs_logp"] <= delta * (1 + (n + 1) * EPS32 / 2)
        assert r["gap/token_out_frac"] == 0.0 and r["gap/seq_out_frac"] == 0.0
