"""The pure GRPO update: `train_step(state, batch, key, entropy_coef) -> (state, metrics)`.

One step reads top to bottom in three files: `experience.py` turns data rows into scored groups and the
update's `Batch`; this module's `train_step` takes the reference logprobs (beta > 0), then runs mu epochs x
minibatches (x microbatches, accumulated) of the loss in `losses.py`, one optax update per minibatch. Also
here: `TrainState`, the state a run starts from, the optimizer and its one learning-rate schedule, and the
policy's weights as rollouts, evaluation and export read them (`policy_params`). Nothing here touches files
or the host loop (`train.py`).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

import models
from grpo_jax import diagnostics, losses, sharding
from grpo_jax.config import TrainConfig
from grpo_jax.experience import Batch
from models import lora as lora_lib
from models.config import ModelConfig
from models.rope import rope_positions, text_positions

# The init key is fold_in(key(seed), INIT_KEY_FOLD); step s uses fold_in(key(seed), s), and no run reaches
# 2^31 - 1 steps, so initialisation never shares a key with a step.
INIT_KEY_FOLD = 0x7FFFFFFF
# LoRA adapters are initialised from fold_in(init key, LORA_INIT_FOLD) (init_params splits the init key
# itself, so the two never share a key); adapter dropout in a microbatch's loss forward draws from
# fold_in(that microbatch's loss key, LORA_DROPOUT_FOLD), leaving the loss key itself as it was.
LORA_INIT_FOLD = 1
LORA_DROPOUT_FOLD = 1


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # [] int32: GRPO steps taken (each makes mu * minibatches optimizer updates)
    params: Any  # what the optimizer trains: the policy's weights, or with LoRA (lora.rank > 0) its adapters only
    opt_state: Any
    ref_params: Any  # frozen reference policy; {} when beta == 0 or when it is the LoRA base (nothing held)
    base: Any = flax.struct.field(default_factory=dict)  # LoRA: the frozen base weights; {} without LoRA



# --------------------------------------------------------------------------------------------------
# the state, the optimizer, the policy's weights
# --------------------------------------------------------------------------------------------------

def lr_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Learning rate at optimizer update `count`: linear warm-up from 0, then constant or cosine decay to
    lr * final_lr_frac at the last update (steps * mu * minibatches). The optimizer and the logged "lr"
    both read this one object."""
    o = cfg.optim
    total = max(1, cfg.steps * cfg.mu * cfg.minibatches)
    if o.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, o.lr, max(o.warmup_steps, 1), total, o.lr * o.final_lr_frac)
    if o.warmup_steps:
        return optax.join_schedules([optax.linear_schedule(0.0, o.lr, o.warmup_steps), optax.constant_schedule(o.lr)],
                                    [o.warmup_steps])
    return optax.constant_schedule(o.lr)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    o = cfg.optim
    chain = [optax.clip_by_global_norm(o.max_grad_norm)] if o.max_grad_norm > 0 else []
    chain.append(optax.adamw(lr_schedule(cfg), b1=o.b1, b2=o.b2, weight_decay=o.weight_decay))
    return optax.chain(*chain)


def initial_state(cfg: TrainConfig, model_cfg: ModelConfig, params, optimizer: optax.GradientTransformation,
                  key: jax.Array, mesh=None) -> TrainState:
    """Step 0 of a run (placed on `mesh` when given). Without LoRA the optimizer trains `params`, and a copy
    is held as the KL reference when beta > 0. With LoRA (lora.rank > 0) `params` become the frozen base
    (TrainState.base) and fresh adapters (B = 0, A from fold_in(key, LORA_INIT_FOLD)) are trained; the KL
    reference is then the base itself, no copy (TRL with peft: adapters disabled), except with
    ref_reset_every, whose resets copy the merged policy into a held reference."""
    place = (lambda tree: tree) if mesh is None else (lambda tree: sharding.shard_params(tree, mesh))
    params = place(params)
    keep_reference = cfg.loss.beta > 0 and (not cfg.lora.rank or cfg.ref_reset_every > 0)
    ref = jax.tree.map(jnp.copy, params) if keep_reference else {}
    if not cfg.lora.rank:
        return TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), ref_params=ref)
    adapters = place(lora_lib.init_adapters(model_cfg, cfg.lora.rank, cfg.lora.targets,
                                            jax.random.fold_in(models.as_typed_key(key), LORA_INIT_FOLD)))
    return TrainState(step=jnp.int32(0), params=adapters, opt_state=optimizer.init(adapters), ref_params=ref,
                      base=params)


def forward_params(cfg: TrainConfig, params, base, *, training: bool = False):
    """What `models.forward` runs as the policy inside the step: `params` as they are, or with LoRA the base
    with the adapters `params` attached (`models.lora.attach`: nothing copied). training=True keeps the
    configured adapter dropout, which acts only where the forward also gets a dropout key."""
    if not cfg.lora.rank:
        return params
    return lora_lib.attach(base, params, scale=cfg.lora.scale, dropout=cfg.lora.dropout if training else 0.0)


def reference_params(cfg: TrainConfig, state: TrainState):
    """The KL reference's weights: the held copy, or with LoRA and no held copy the base (adapters off)."""
    if cfg.lora.rank and not cfg.ref_reset_every:
        return state.base
    return state.ref_params


def policy_params(model_cfg: ModelConfig, cfg: TrainConfig, state: TrainState):
    """The policy's full weights, the one source for rollouts, evaluation, reference resets and export:
    state.params, or with LoRA the base with the adapters merged in, W + (alpha / rank) A B (plain params,
    so decoding costs what the base's does)."""
    if not cfg.lora.rank:
        return state.params
    return lora_lib.merge(model_cfg, state.base, state.params, cfg.lora.scale)


# --------------------------------------------------------------------------------------------------
# the step: train_step -> minibatch update -> micro_loss -> completion_logprobs
# --------------------------------------------------------------------------------------------------

def make_train_step(model_cfg: ModelConfig, cfg: TrainConfig, optimizer: optax.GradientTransformation):
    """The pure update `train_step(state, batch, key, entropy_coef) -> (state, metrics)` for this run's
    config; entropy_coef is a traced scalar (its schedule never recompiles the step)."""
    t_len, chunks = cfg.sampling.max_new_tokens, cfg.minibatches * cfg.microbatches
    minibatch_update = make_minibatch_update(model_cfg, cfg, optimizer)
    schedule = lr_schedule(cfg)
    recompute, gap_bound = cfg.sampling.old_logp_source == "recompute", cfg.logging.gap_bound
    # the loss needs the rollout's logprobs beside pi_old only when they differ (recompute) and it uses them
    pass_sampler = recompute and (cfg.loss.corrects_gap or cfg.loss.opsm_delta is not None or cfg.loss.kl_is)
    # off-policy rollouts: the gap is the policy's own staleness, measured every step
    gap_every = 1 if cfg.rollout.off_policy_steps else cfg.logging.gap_every

    def train_step(state: TrainState, batch: Batch, key: jax.Array, entropy_coef: jax.Array):
        key = models.as_typed_key(key)
        n = batch.tokens.shape[0]
        ref_logp = None
        if cfg.loss.beta > 0:
            ref_logp = jax.lax.stop_gradient(chunked_logprobs(model_cfg, reference_params(cfg, state), batch, t_len,
                                                              chunks))
        sampler_logp = batch.old_logp  # the rollout's own logprobs
        policy = forward_params(cfg, state.params, state.base)  # no dropout: pi_old as the sampler saw it
        if recompute:
            batch = batch.replace(old_logp=jax.lax.stop_gradient(
                chunked_logprobs(model_cfg, policy, batch, t_len, chunks)))
            gap = diagnostics.sampler_trainer_gap(batch.old_logp, sampler_logp, batch.loss_mask, bound=gap_bound)
        elif gap_every:  # one extra teacher-forced pass on measured steps only
            measured = state.step % gap_every == 0
            trainer_logp = jax.lax.cond(
                measured, lambda: jax.lax.stop_gradient(chunked_logprobs(model_cfg, policy, batch, t_len, chunks)),
                lambda: sampler_logp)
            gap = diagnostics.sampler_trainer_gap(trainer_logp, sampler_logp, batch.loss_mask, bound=gap_bound)
            gap["gap/measured"] = measured.astype(jnp.float32)
        else:
            gap = {}
        ref_rows = ref_logp if ref_logp is not None else jnp.zeros((n, 0), jnp.float32)
        sampler_rows = sampler_logp if pass_sampler else jnp.zeros((n, 0), jnp.float32)

        def epoch(carry, k):
            k_perm, k_loss = jax.random.split(k)
            perm = jax.random.permutation(k_perm, n) if cfg.minibatches > 1 else jnp.arange(n)
            mbs = _split_rows(jax.tree.map(lambda x: x[perm], (batch, ref_rows, sampler_rows)), cfg.minibatches)
            xs = (mbs[0], None if ref_logp is None else mbs[1], mbs[2] if pass_sampler else None,
                  jax.random.split(k_loss, cfg.minibatches))
            return jax.lax.scan(lambda c, x: minibatch_update(c, x, entropy_coef, state.base), carry, xs)

        carry = (state.params, state.opt_state)
        (params, opt_state), (outs, metrics) = jax.lax.scan(epoch, carry, jax.random.split(key, cfg.mu))
        out = _merge_update_metrics(outs, metrics, cfg.mu * cfg.minibatches)
        out.update(gap)
        out["lr"] = schedule(state.step * cfg.mu * cfg.minibatches)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), out

    return train_step


def _merge_update_metrics(outs: dict, metrics: dict, n_updates: int) -> dict:
    """One step's metrics from its [mu, minibatches] updates: loss terms merged by their sums, loss and
    grad_norm averaged, skipped updates counted."""
    metrics = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics)
    merged = jax.tree.map(lambda x: x[0], metrics)
    for i in range(1, n_updates):
        merged = losses.merge_metrics(merged, jax.tree.map(lambda x, i=i: x[i], metrics))
    out = losses.finalize_metrics(merged)
    out.update({k: jnp.mean(outs[k]) for k in ("loss", "grad_norm")})
    out["skipped"] = jnp.sum(outs["skipped"])
    return out


def make_minibatch_update(model_cfg: ModelConfig, cfg: TrainConfig, optimizer: optax.GradientTransformation):
    """`update((params, opt_state), (minibatch, ref_logp, sampler_logp, key), entropy_coef, base=None)`:
    gradients accumulated over the microbatches, normalised by the summed loss denominator, one optax update;
    a non-finite loss or gradient norm leaves params and optimizer state unchanged, counts as skipped and is
    reported as it is (loss and grad_norm NaN or inf, not replaced).
    With LoRA, params are the adapters and `base` (not differentiated) the frozen weights."""
    grad_fn = jax.value_and_grad(make_micro_loss(model_cfg, cfg), has_aux=True)

    def update(carry, xs, entropy_coef, base=None):
        params, opt_state = carry
        mb, ref_logp, sampler_logp, key = xs
        micro = _split_rows((mb, ref_logp, sampler_logp), cfg.microbatches)
        keys = jax.random.split(key, cfg.microbatches)

        def accumulate(acc, x):
            (m_b, m_ref, m_sampler), k = x
            (num, (den, metrics)), grads = grad_fn(params, m_b, m_ref, m_sampler, k, entropy_coef, base)
            if acc is None:
                return num, den, metrics, grads
            return (acc[0] + num, acc[1] + den, losses.merge_metrics(acc[2], metrics),
                    jax.tree.map(jnp.add, acc[3], grads))

        first = accumulate(None, (jax.tree.map(lambda x: x[0], micro), keys[0]))
        rest = (jax.tree.map(lambda x: x[1:], micro), keys[1:])
        num, den, metrics, grads = jax.lax.scan(lambda a, x: (accumulate(a, x), None), first, rest)[0]
        den = jnp.maximum(den, 1e-8)
        grads = jax.tree.map(lambda g: (g / den).astype(g.dtype), grads)  # bf16 params keep bf16 optimizer state
        loss = num / den
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = _tree_where(finite, new_params, params), _tree_where(finite, new_opt, opt_state)
        # logged as they are (a skipped update's NaN/inf loss too), so the non-finite rules can see them
        out = {"loss": loss, "grad_norm": grad_norm, "skipped": (~finite).astype(jnp.float32)}
        return (params, opt_state), (out, metrics)

    return update


def make_micro_loss(model_cfg: ModelConfig, cfg: TrainConfig):
    """`micro_loss(params, batch, ref_logp, sampler_logp, key, entropy_coef, base=None) -> (loss numerator,
    (denominator, metric sums))` for one microbatch: the policy forward and the configured loss (what the
    step differentiates). sampler_logp: the rollout's logprobs when they differ from batch.old_logp (the
    recomputed pi_old), else None. With LoRA, params are the adapters and base the frozen weights they are
    attached to (`forward_params`); adapter dropout draws from fold_in(key, LORA_DROPOUT_FOLD)."""
    loss_cfg, t_len = cfg.loss, cfg.sampling.max_new_tokens
    use_entropy = cfg.entropy.mode != "constant" or cfg.entropy.coef > 0 or loss_cfg.top_entropy_quantile < 1
    lora_dropout = cfg.lora.rank > 0 and cfg.lora.dropout > 0

    def micro_loss(params, mb: Batch, ref_logp, sampler_logp, key, entropy_coef, base=None):
        dropout_key = jax.random.fold_in(key, LORA_DROPOUT_FOLD) if lora_dropout else None
        logp, ent = completion_logprobs(model_cfg, forward_params(cfg, params, base, training=True), mb.tokens,
                                        mb.attn_mask, t_len, mb.temperatures, dropout_key=dropout_key)
        num, den, metrics = losses.loss_terms(
            loss_cfg, logp=logp, old_logp=mb.old_logp, advantages=mb.advantages, mask=mb.loss_mask,
            ref_logp=ref_logp, entropies=ent if use_entropy else None, entropy_coef=entropy_coef, key=key,
            sampler_logp=sampler_logp)
        m = mb.loss_mask
        metrics["logp_gap_sum"] = jnp.sum(jnp.where(m, jnp.abs(jax.lax.stop_gradient(logp) - mb.old_logp), 0.0))
        metrics["token_entropy_sum"] = jnp.sum(jnp.where(m, jax.lax.stop_gradient(ent), 0.0))
        return num, (den, metrics)

    return micro_loss


def completion_logprobs(model_cfg: ModelConfig, params, tokens, attn_mask, n_completion: int, temperature, *,
                        dropout_key=None):
    """Teacher-forced logprobs and entropies [N, T] of the last T tokens under softmax(logits / temperature);
    temperature is a scalar or per token [N, T] (as the sampler recorded it). dropout_key: LoRA dropout
    (the loss forward only)."""
    pos = text_positions(attn_mask)
    if model_cfg.logits_chunk:
        return _chunked_completion_logprobs(model_cfg, params, tokens, attn_mask, n_completion, temperature,
                                            dropout_key=dropout_key)
    logits, _ = models.forward(model_cfg, params, tokens, rope_positions(model_cfg, pos), attn_mask=attn_mask,
                               dropout_key=dropout_key)
    t = jnp.asarray(temperature, jnp.float32)
    t = jnp.where(t > 0, t, 1.0)
    logits = logits[:, -n_completion - 1 : -1] / (t[..., None] if t.ndim else t)
    targets = tokens[:, -n_completion:]
    return models.token_logprobs(logits, targets), models.token_entropy(logits)


def _chunked_completion_logprobs(model_cfg: ModelConfig, params, tokens, attn_mask, n_completion: int, temperature,
                                 *, dropout_key=None):
    """`completion_logprobs` with the head applied to the completion's positions only, C = logits_chunk tokens
    at a time under `jax.checkpoint`: [N, C, V] float32 logits live at once instead of [N, P + T, V], and the
    backward pass recomputes each chunk's from its [N, C, D] hidden states. T is padded up to a multiple of C
    (the padding's values are dropped)."""
    pos = rope_positions(model_cfg, text_positions(attn_mask))
    hidden = models.forward_hidden(model_cfg, params, tokens, pos, attn_mask=attn_mask, dropout_key=dropout_key)
    n, t, c = tokens.shape[0], n_completion, model_cfg.logits_chunk
    temp = jnp.asarray(temperature, jnp.float32)
    temp = jnp.broadcast_to(jnp.where(temp > 0, temp, 1.0), (n, t))
    pad = -t % c

    def chunks(x, fill=0):  # [N, T, ...] -> [T / C, N, C, ...], T padded with `fill`
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        return x.reshape(n, (t + pad) // c, c, *x.shape[2:]).swapaxes(0, 1)

    head = {k: v for k, v in params.items() if k != "layers"}

    @jax.checkpoint
    def one(xs):
        x_NxCxD, temp_NxC, targets_NxC = xs
        logits = models.head_logits(model_cfg, head, x_NxCxD) / temp_NxC[..., None]
        return models.token_logprobs(logits, targets_NxC), models.token_entropy(logits)

    logp, ent = jax.lax.map(one, (chunks(hidden[:, -t - 1: -1]), chunks(temp, 1.0), chunks(tokens[:, -t:])))
    return tuple(x.swapaxes(0, 1).reshape(n, t + pad)[:, :t] for x in (logp, ent))


def chunked_logprobs(model_cfg: ModelConfig, params, batch: Batch, n_completion: int, chunks: int = 1):
    """Teacher-forced completion logprobs [N, T] of a whole batch, computed `chunks` row-slices at a time
    (lax.map): the same numbers as one pass, with activations a chunk's size (faster on CPU,
    experiments/PERF.md; the reference and recomputed old-policy passes use the microbatch count)."""
    def one(rows):
        tokens, attn_mask, temperatures = rows
        return completion_logprobs(model_cfg, params, tokens, attn_mask, n_completion, temperatures)[0]

    rows = (batch.tokens, batch.attn_mask, batch.temperatures)
    if chunks <= 1:
        return one(rows)
    return jax.lax.map(one, _split_rows(rows, chunks)).reshape(batch.tokens.shape[0], -1)


def _split_rows(tree, n: int):
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), tree)


def _tree_where(pred, a, b):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)
