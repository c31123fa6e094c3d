"""Training on the policy's own tokens only: a completion may hold tokens the policy did not draw (a tool's output
inserted by the host), marked False in `Rollout.policy_mask`. They stay in the model's input (later tokens are
conditioned on them) and leave every per-token term: the loss and its aggregation's token counts, the ratio and
clip fractions, the KL and entropy terms, the entropy diagnostics and the sampler-trainer gap.

The hand-built two-turn row: policy tokens, a tool's output, policy tokens ending in EOS, then padding. The tool's
positions carry extreme values (a ratio of e^20, entropies of 9 nats, a reference logprob far away), so any of them
leaking into a statistic would move it by orders of magnitude more than the rounding tolerances allow; and the
reference computation's rows, with the tool's tokens removed, are narrower than T, so a statistic that counted
masked positions (a token count, a row length) would differ too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import advantages as adv_lib
from grpo_jax import diagnostics, experience, losses, sampler, update
from grpo_jax.config import LossConfig, TrainConfig, override
from grpo_jax.experience import Batch
from grpo_jax.rewards.format import SEGMENT_KINDS
from tests.tolerance import EPS32, rounding_tol, sum_tol

T = 12
# row 0: policy 0..3, tool output 4..6, policy 7..9 (EOS at 9), padding 10..11; row 1: a second turn ends at 11;
# row 2: no tool call, 6 tokens; row 3: a tool's output from the completion's second token on (positions 1..2)
COMPLETION_LEN = (10, 12, 6, 8)
TOOL_SPANS = ((4, 7), (2, 5), None, (1, 3))


def _masks() -> tuple[np.ndarray, np.ndarray]:
    """(completion mask, policy mask) [N, T] bool of the hand-built rows."""
    comp = np.arange(T)[None, :] < np.asarray(COMPLETION_LEN)[:, None]
    policy = np.ones_like(comp)
    for i, span in enumerate(TOOL_SPANS):
        if span:
            policy[i, span[0]: span[1]] = False
    return comp, policy


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Per-token loss inputs [N, T] float32: ordinary values on policy tokens, extreme ones on the tool's."""
    rng = np.random.default_rng(seed)
    comp, policy = _masks()
    n = comp.shape[0]
    logp = -rng.uniform(0.05, 3.0, (n, T))
    x = {"logp": logp, "old_logp": logp + rng.normal(0, 0.3, (n, T)), "ref_logp": logp + rng.normal(0, 0.5, (n, T)),
         "entropies": rng.uniform(0.0, 2.5, (n, T)), "sampler_logp": logp + rng.normal(0, 0.1, (n, T))}
    tool = comp & ~policy
    x["logp"] = np.where(tool, -0.01, x["logp"])
    x["old_logp"] = np.where(tool, -40.0, x["old_logp"])  # a ratio clamped at e^20 if it counted
    x["ref_logp"] = np.where(tool, -60.0, x["ref_logp"])
    x["entropies"] = np.where(tool, 9.0, x["entropies"])
    x["sampler_logp"] = np.where(tool, -30.0, x["sampler_logp"])
    x = {k: v.astype(np.float32) for k, v in x.items()}
    x["advantages"] = np.asarray([1.0, -0.7, 0.4, -1.2], np.float32)
    return x


def _compact(x: dict[str, np.ndarray], keep: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The same rows with the tokens outside `keep` removed: each row's kept tokens moved to its front, the rest
    padding (value 0, mask False), in rows as wide as the most kept tokens of a row (so narrower than T: a
    statistic that counted masked positions would count a different number of them). What a completion
    without the tool's output would be to the loss."""
    width = int(keep.sum(-1).max())
    out = {k: (v if v.ndim == 1 else np.zeros((v.shape[0], width), v.dtype)) for k, v in x.items()}
    mask = np.zeros((keep.shape[0], width), bool)
    for i, row in enumerate(keep):
        cols = np.flatnonzero(row)
        mask[i, : len(cols)] = True
        for k, v in x.items():
            if v.ndim == 2:
                out[k][i, : len(cols)] = v[i, cols]
    return out, mask


def _loss(cfg: LossConfig, x: dict, mask: np.ndarray, coef: float = 0.03):
    num, den, metrics = losses.loss_terms(cfg, logp=x["logp"], old_logp=x["old_logp"], advantages=x["advantages"],
                                          mask=mask, ref_logp=x["ref_logp"], entropies=x["entropies"],
                                          entropy_coef=coef, key=jax.random.key(0), sampler_logp=x["sampler_logp"])
    return num / den, metrics


def _per_token_terms(cfg: LossConfig, x: dict, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The per-token values each summed statistic adds up (on the kept tokens), to size its rounding tolerance."""
    m = jnp.asarray(mask)
    logp, old = jnp.where(m, x["logp"], 0.0), jnp.where(m, x["old_logp"], 0.0)
    adv = jnp.where(m, jnp.asarray(x["advantages"])[:, None], 0.0)
    pg, maps = losses.POLICY_LOSSES[cfg.policy_loss](cfg, logp=logp, old_logp=old, adv=adv, mask=m,
                                                   key=jax.random.key(0))
    kl = losses.kl_estimate(logp, jnp.where(m, x["ref_logp"], 0.0), estimator=cfg.kl_estimator)
    terms = {"pg_loss": pg, "ratio": maps["ratio"], "ppo_kl": logp - old, "kl": kl, "entropy": x["entropies"]}
    return {k: np.asarray(v)[mask] for k, v in terms.items()}


LOSSES = [("ppo", "token-mean"), ("ppo", "seq-mean-token-mean"), ("gspo", "token-mean"),
          ("gspo", "seq-mean-token-mean"), ("cispo", "seq-mean-token-sum-norm")]


@pytest.mark.parametrize("policy_loss,agg", LOSSES, ids=[f"{p}-{a}" for p, a in LOSSES])
def test_loss_with_tool_tokens_masked_equals_the_loss_without_them(policy_loss, agg):
    cfg = LossConfig(policy_loss=policy_loss, agg_mode=agg, max_len_norm=T, beta=0.05, tis_cap=2.0)
    comp, policy = _masks()
    x = _inputs()
    loss, metrics = _loss(cfg, x, comp & policy)
    x_c, mask_c = _compact(x, comp & policy)
    loss_c, metrics_c = _loss(cfg, x_c, mask_c)
    terms = _per_token_terms(cfg, x_c, mask_c)
    n = int(mask_c.sum())
    assert float(metrics["num_tokens"]) == n == int((comp & policy).sum())
    assert float(metrics["num_seqs"]) == float(metrics_c["num_seqs"]) == comp.shape[0]
    for name in ("ratio_min", "ratio_max", "clip_frac_low_sum", "clip_frac_high_sum", "tis_capped_sum"):
        assert float(metrics[name]) == float(metrics_c[name]), name
    # the two sum the same per-token values in another order: each within sum_tol of the exact sum (a few
    # roundings made each term: ops), so within twice that of each other
    for name, t in terms.items():
        tol = 2 * sum_tol(t, ops=8)
        assert abs(float(metrics[f"{name}_sum"]) - float(metrics_c[f"{name}_sum"])) <= tol, name
    per_token_scale = np.abs(terms["pg_loss"]) * 2.0 + cfg.beta * np.abs(terms["kl"]) + 0.03 * terms["entropy"]
    loss_tol = 2 * sum_tol(per_token_scale, ops=8) / min(float(mask_c.any(-1).sum()), n) + rounding_tol(loss_c, 2)
    assert abs(float(loss) - float(loss_c)) <= loss_tol, (float(loss), float(loss_c), loss_tol)
    # and the tool's tokens would have mattered: the same loss over every completion token is far away
    loss_all, _ = _loss(cfg, x, comp)
    assert abs(float(loss_all) - float(loss)) > 100 * loss_tol


@pytest.mark.parametrize("policy_loss,agg", LOSSES[:4], ids=[f"{p}-{a}" for p, a in LOSSES[:4]])
def test_the_loss_gradient_is_zero_on_tool_tokens(policy_loss, agg):
    """The loss's gradient with respect to each token's logprob and entropy (what the model's logits at that
    position reach the loss through) is exactly 0 at the tool's positions, and not everywhere else."""
    cfg = LossConfig(policy_loss=policy_loss, agg_mode=agg, beta=0.05)
    comp, policy = _masks()
    x = _inputs()

    def f(logp, ent):
        return _loss(cfg, {**x, "logp": logp, "entropies": ent}, comp & policy)[0]

    g_logp, g_ent = jax.grad(f, argnums=(0, 1))(jnp.asarray(x["logp"]), jnp.asarray(x["entropies"]))
    tool = comp & ~policy
    for g in (np.asarray(g_logp), np.asarray(g_ent)):
        assert np.all(g[tool] == 0.0) and np.all(g[~comp] == 0.0)
        assert np.count_nonzero(g[comp & policy]) > 0.5 * (comp & policy).sum()


def test_entropy_and_gap_statistics_ignore_tool_tokens():
    comp, policy = _masks()
    x = _inputs()
    keep = comp & policy
    x_c, mask_c = _compact(x, keep)
    n = int(keep.sum())
    ent = diagnostics.entropy_diagnostics(x["entropies"], keep)
    ent_c = diagnostics.entropy_diagnostics(x_c["entropies"], mask_c)
    assert int(ent["entropy/num_tokens"]) == n
    for k in ent:  # percentiles and histogram read the same sorted values: exact; the means sum them in another order
        tol = 2 * sum_tol(x_c["entropies"][mask_c], ops=2) / n if k in ("entropy/mean",) else 0.0
        if k == "entropy/bimodality":  # a ratio of moment sums, each relative n * eps, a few composed
            tol = 16 * n * EPS32 * abs(float(ent_c[k]))
        np.testing.assert_allclose(np.asarray(ent[k]), np.asarray(ent_c[k]), rtol=0, atol=tol, err_msg=k)
    gap = diagnostics.sampler_trainer_gap(x["logp"], x["sampler_logp"], keep, bound=2.0)
    gap_c = diagnostics.sampler_trainer_gap(x_c["logp"], x_c["sampler_logp"], mask_c, bound=2.0)
    terms = np.abs(x_c["logp"] - x_c["sampler_logp"])[mask_c]
    for k in gap:
        tol = 2 * sum_tol(terms, ops=6) / n if k in ("gap/abs_logp", "gap/kl") else 0.0
        np.testing.assert_allclose(float(gap[k]), float(gap_c[k]), rtol=0, atol=tol, err_msg=k)
    # with the tool's tokens counted, the gap would be e^30-sized
    assert float(diagnostics.sampler_trainer_gap(x["logp"], x["sampler_logp"], comp, bound=2.0)["gap/ratio_max"]) > 1e8


# --------------------------------------------------------------------------------------------- the rollout path


PROMPT = [11, 12, 13, 14]


def _rollout(policy: np.ndarray, seed: int = 0) -> sampler.Rollout:
    """B = 2 prompts x G = 2 of the hand-built rows, with tokens, sampler entropies and temperatures."""
    comp, _ = _masks()
    rng = np.random.default_rng(seed)
    tokens = np.where(comp, rng.integers(20, 100, comp.shape), 0).astype(np.int32)
    x = _inputs(seed)
    shape = (2, 2, T)
    return sampler.Rollout(
        prompt_tokens=jnp.asarray([PROMPT, PROMPT], jnp.int32), prompt_mask=jnp.ones((2, 4), bool),
        tokens=jnp.asarray(tokens.reshape(shape)), completion_mask=jnp.asarray(comp.astype(np.int32).reshape(shape)),
        logprobs=jnp.asarray(np.where(comp, x["old_logp"], 0).reshape(shape)),
        entropies=jnp.asarray(np.where(comp, x["entropies"], 0).reshape(shape)),
        policy_entropies=jnp.asarray(np.where(comp, x["entropies"], 0).reshape(shape)),
        lengths=jnp.asarray(np.asarray(COMPLETION_LEN, np.int32).reshape(2, 2)),
        truncated=jnp.zeros((2, 2), bool), temperatures=jnp.ones(shape, jnp.float32),
        policy_mask=jnp.asarray(policy.reshape(shape)))


ADV = jnp.asarray([[1.0, -0.7], [0.4, -1.2]])


def test_batch_loss_mask_is_the_policy_tokens_and_attention_keeps_the_tool_output():
    comp, policy = _masks()
    batch = experience.batch_from_rollout(_rollout(policy), ADV)
    np.testing.assert_array_equal(np.asarray(batch.loss_mask), comp & policy)
    np.testing.assert_array_equal(np.asarray(batch.attn_mask)[:, len(PROMPT):], comp)


def test_step_diagnostics_read_the_policy_tokens_and_lengths_every_token():
    """The sampled and the T = 1 entropy statistics (all tokens and per kind) are over the policy's tokens;
    the length statistics still count the tool's output, which the model reads."""
    comp, policy = _masks()
    ro = _rollout(policy)
    kinds = jnp.asarray(np.random.default_rng(0).integers(0, 3, (2, 2, T)), jnp.int8)
    _, diag = experience._advantages_and_diagnostics(jnp.ones((2, 2, 1)), jnp.ones(1), ro, kinds,
                                                    cfg=TrainConfig().advantage)
    keep = comp & policy
    assert int(diag["entropy/num_tokens"]) == int(diag["entropy_t1/num_tokens"]) == keep.sum()
    k = np.asarray(kinds).reshape(keep.shape)
    assert sum(int(diag[f"entropy_t1/{name}/num_tokens"]) for name in SEGMENT_KINDS) == keep.sum()
    assert int(diag["entropy_t1/other/num_tokens"]) == (keep & (k == 0)).sum()
    ent = _inputs()["entropies"]
    assert float(diag["entropy/p95"]) < 9.0 and float(diag["entropy/mean"]) == pytest.approx(
        ent[keep].mean(), rel=0, abs=2 * sum_tol(ent[keep], ops=2) / keep.sum())
    assert float(diag["length/mean"]) == np.mean(COMPLETION_LEN)


def test_all_policy_rollout_gives_the_batch_and_diagnostics_of_before():
    """policy_mask all True (what the sampler returns) is the path without a policy mask, bit for bit: the batch
    built from the completion mask alone, and the entropy diagnostics over the completion mask."""
    comp, _ = _masks()
    ro = _rollout(np.ones_like(comp))
    batch = experience.batch_from_rollout(ro, ADV, mask_truncated=True)
    np.testing.assert_array_equal(np.asarray(batch.loss_mask), np.asarray(ro.completion_mask).reshape(4, T) > 0)
    kinds = jnp.asarray(np.random.default_rng(0).integers(0, 3, (2, 2, T)), jnp.int8)
    rewards = jnp.asarray(np.random.default_rng(1).uniform(0, 1, (2, 2, 1)), jnp.float32)
    args = (rewards, jnp.ones(1), ro, kinds)
    _, diag = experience._advantages_and_diagnostics(*args, cfg=TrainConfig().advantage)
    before = _diagnostics_over_the_completion_mask(*args, cfg=TrainConfig().advantage)
    assert before.keys() == diag.keys()
    for k, v in before.items():
        np.testing.assert_array_equal(np.asarray(diag[k]), np.asarray(v), err_msg=k)


@functools.partial(jax.jit, static_argnames="cfg")
def _diagnostics_over_the_completion_mask(rewards_BxGxK, weights_K, ro: sampler.Rollout, kinds_BxGxT, *, cfg):
    """`experience._advantages_and_diagnostics` as it is without a policy mask: every completion token counts."""
    adv, aux = adv_lib.compute_advantages(rewards_BxGxK, weights_K, cfg=cfg)
    adv = jnp.where(jnp.isfinite(adv), adv, 0.0)
    diag = diagnostics.reward_diagnostics(rewards_BxGxK, aux["totals"], adv)
    diag["collapse/drowned_dims"] = diagnostics.drowned_dimensions(
        diag["reward/adv_corr_within"], diag["reward/zero_var_frac_per_dim"], weights_K)
    diag.update(diagnostics.entropy_diagnostics(ro.entropies, ro.completion_mask))
    diag.update(diagnostics.entropy_by_kind(ro.policy_entropies, ro.completion_mask, kinds_BxGxT, SEGMENT_KINDS))
    diag.update(diagnostics.length_diagnostics(ro.lengths.reshape(-1), ro.truncated.reshape(-1),
                                               max_len=ro.tokens.shape[-1]))
    return diag


def test_sampler_marks_every_token_as_drawn_by_the_policy():
    cfg = models.tiny()
    params = models.init_params(cfg, jax.random.key(0))
    ro = sampler.sample(cfg, params, jnp.asarray([PROMPT]), jnp.ones((1, 4), bool), key=jax.random.key(1),
                        group_size=2, max_new_tokens=5, eos_ids=(3,))
    assert ro.policy_mask.shape == ro.tokens.shape and ro.policy_mask.dtype == jnp.bool_
    assert bool(jnp.all(ro.policy_mask))


@pytest.fixture(scope="module")
def model():
    cfg = models.tiny()
    return cfg, models.init_params(cfg, jax.random.key(0))


def _step(model_cfg, params, batch: Batch, *extra: str):
    cfg = override(TrainConfig(), [f"sampling.max_new_tokens={T}", "optim.lr=1e-3", "loss.beta=0.05",
                                   "entropy.coef=0.01", "logging.gap_every=1", *extra])
    optimizer = update.make_optimizer(cfg)
    state = update.initial_state(cfg, model_cfg, jax.tree.map(jnp.copy, params), optimizer, jax.random.key(0))
    return jax.jit(update.make_train_step(model_cfg, cfg, optimizer))(state, batch, jax.random.key(1),
                                                                       jnp.float32(cfg.entropy.coef))


@pytest.mark.parametrize("extra", [(), ("sampling.old_logp_source=recompute", "loss.tis_cap=2.0")],
                         ids=["sampler_logp", "recompute"])
def test_train_step_update_does_not_depend_on_the_tool_tokens_logits(model, extra):
    """A real update (grad_norm > 0, params move) that is bit for bit the same when the tool's positions get
    other sampler logprobs and other temperatures (the temperature divides exactly those positions' logits).
    Their token ids are not perturbed: they are the context the second turn is conditioned on."""
    model_cfg, params = model
    comp, policy = _masks()
    ro = _rollout(policy)
    batch = experience.batch_from_rollout(ro, ADV)
    tool = jnp.asarray(comp & ~policy)
    other = batch.replace(old_logp=jnp.where(tool, -7.0, batch.old_logp),
                          temperatures=jnp.where(tool, 0.25, batch.temperatures))
    state, metrics = _step(model_cfg, params, batch, *extra)
    state_o, metrics_o = _step(model_cfg, params, other, *extra)
    assert float(metrics["grad_norm"]) > 0 and float(metrics["skipped"]) == 0
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params, params))
    assert any(moved)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(state_o.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for k in metrics:
        np.testing.assert_array_equal(np.asarray(metrics[k]), np.asarray(metrics_o[k]), err_msg=k)
    assert float(metrics["num_tokens"]) == (comp & policy).sum()  # the loss counted the policy's tokens only
