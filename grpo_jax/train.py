"""The GRPO step and loop.

One step (DESIGN.md): rollout -> rewards R[B, G, K] -> advantages (+ diagnostics) -> reference logprobs
(beta > 0) -> mu epochs x minibatches (x microbatches, accumulated) of the clipped update -> optax.

`make_train_step(...)` returns the pure, jittable `train_step(state, batch, key) -> (state, metrics)`;
`Trainer` is the host loop around it (sampling, rewards, logging, checkpoints). Keys: the step key is
`fold_in(key(seed), step)`, split into (sample, update); nothing random happens without one.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import warnings
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

import models
from grpo_jax import advantages as adv_lib
from grpo_jax import diagnostics, losses, sampler, sharding
from grpo_jax import rewards as rewards_lib
from grpo_jax.fileio import atomic_write_text
from grpo_jax.config import RESUME_CRITICAL, TrainConfig, to_dict
from models.config import ModelConfig
from models.rope import text_positions


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # [] int32: GRPO steps taken (each makes mu * minibatches optimizer updates)
    params: Any
    opt_state: Any
    ref_params: Any  # frozen reference policy; {} when beta == 0 (nothing held)


@flax.struct.dataclass
class Batch:
    """N = B*G rows of prompt + completion (L = P + T), what the update needs and nothing else."""

    tokens: jax.Array  # [N, L] int32, prompts left-padded to the bucket width P
    attn_mask: jax.Array  # [N, L] bool
    loss_mask: jax.Array  # [N, T] bool: completion tokens up to and including EOS
    old_logp: jax.Array  # [N, T] float32 logprobs under the sampling policy
    advantages: jax.Array  # [N] float32
    temperatures: jax.Array  # [N, T] float32 temperature each token was sampled at (logits are divided by it)
    entropy_coef: jax.Array  # [N] float32 entropy-bonus coefficient (this step's schedule value, per row)


# --------------------------------------------------------------------------------------------------
# pure pieces
# --------------------------------------------------------------------------------------------------

def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    o = cfg.optim
    updates_per_step = cfg.mu * cfg.minibatches
    total = max(1, cfg.steps * updates_per_step)
    if o.schedule == "cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, o.lr, max(o.warmup_steps, 1), total, o.lr * o.final_lr_frac)
    elif o.warmup_steps:
        lr = optax.join_schedules([optax.linear_schedule(0.0, o.lr, o.warmup_steps), optax.constant_schedule(o.lr)],
                                  [o.warmup_steps])
    else:
        lr = optax.constant_schedule(o.lr)
    chain = [optax.clip_by_global_norm(o.max_grad_norm)] if o.max_grad_norm > 0 else []
    chain.append(optax.adamw(lr, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay))
    return optax.chain(*chain)


def learning_rate(cfg: TrainConfig, count) -> jax.Array:
    """The schedule's value at optimizer step `count` (for logging)."""
    o = cfg.optim
    total = max(1, cfg.steps * cfg.mu * cfg.minibatches)
    if o.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, o.lr, max(o.warmup_steps, 1), total,
                                                  o.lr * o.final_lr_frac)(count)
    if o.warmup_steps:
        return jnp.minimum(1.0, count / o.warmup_steps) * o.lr
    return jnp.asarray(o.lr, jnp.float32)


def completion_logprobs(model_cfg: ModelConfig, params, tokens, attn_mask, n_completion: int, temperature):
    """Teacher-forced logprobs and entropies [N, T] of the last T tokens under softmax(logits / temperature);
    temperature is a scalar or per token [N, T] (as the sampler recorded it)."""
    pos = text_positions(attn_mask)
    logits, _ = models.forward(model_cfg, params, tokens, sampler.rope_positions(model_cfg, pos), attn_mask=attn_mask)
    t = jnp.asarray(temperature, jnp.float32)
    t = jnp.where(t > 0, t, 1.0)
    logits = logits[:, -n_completion - 1 : -1] / (t[..., None] if t.ndim else t)
    targets = tokens[:, -n_completion:]
    return models.token_logprobs(logits, targets), models.token_entropy(logits)


def chunked_logprobs(model_cfg: ModelConfig, params, batch: Batch, n_completion: int, chunks: int = 1):
    """Teacher-forced completion logprobs [N, T] of a whole batch, computed `chunks` row-slices at a time
    (lax.map): the same numbers as one pass, with activations a chunk's size (faster on CPU, PERF.md;
    the reference and recomputed old-policy passes use the microbatch count)."""
    def one(b):
        return completion_logprobs(model_cfg, params, b.tokens, b.attn_mask, n_completion, b.temperatures)[0]

    if chunks <= 1:
        return one(batch)
    rows = _split_rows((batch.tokens, batch.attn_mask, batch.temperatures), chunks)
    out = jax.lax.map(lambda x: one(Batch(x[0], x[1], None, None, None, x[2], None)), rows)
    return out.reshape(batch.tokens.shape[0], -1)


def _split_rows(tree, n: int):
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), tree)


def _tree_where(pred, a, b):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def make_micro_loss(model_cfg: ModelConfig, cfg: TrainConfig):
    """`micro_loss(params, batch, ref_logp, key) -> (loss numerator, (denominator, metric sums))` for one
    microbatch: the policy forward and the configured loss (the train step's differentiated function)."""
    loss_cfg, t_len = cfg.loss, cfg.sampling.max_new_tokens
    use_entropy = cfg.entropy.mode != "constant" or cfg.entropy.coef > 0 or loss_cfg.top_entropy_quantile < 1

    def logprobs(params, b: Batch):
        return completion_logprobs(model_cfg, params, b.tokens, b.attn_mask, t_len, b.temperatures)

    def micro_loss(params, mb: Batch, ref_logp, key):
        logp, ent = logprobs(params, mb)
        num, den, metrics = losses.loss_terms(
            loss_cfg, logp=logp, old_logp=mb.old_logp, advantages=mb.advantages, mask=mb.loss_mask,
            ref_logp=ref_logp, entropies=ent if use_entropy else None, entropy_coef=mb.entropy_coef[:, None], key=key)
        m = mb.loss_mask
        metrics["logp_gap_sum"] = jnp.sum(jnp.where(m, jnp.abs(jax.lax.stop_gradient(logp) - mb.old_logp), 0.0))
        metrics["token_entropy_sum"] = jnp.sum(jnp.where(m, jax.lax.stop_gradient(ent), 0.0))
        return num, (den, metrics)

    return micro_loss


def make_train_step(model_cfg: ModelConfig, cfg: TrainConfig, optimizer: optax.GradientTransformation):
    """The pure update `train_step(state, batch, key) -> (state, metrics)` for this run's config."""
    loss_cfg, t_len = cfg.loss, cfg.sampling.max_new_tokens
    grad_fn = jax.value_and_grad(make_micro_loss(model_cfg, cfg), has_aux=True)

    def minibatch_update(carry, xs):
        params, opt_state = carry
        mb, ref_logp, key = xs
        micro = _split_rows((mb, ref_logp), cfg.microbatches)
        keys = jax.random.split(key, cfg.microbatches)

        def accumulate(acc, x):
            (m_b, m_ref), k = x
            (num, (den, metrics)), grads = grad_fn(params, m_b, m_ref, k)
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
        out = {"loss": jnp.where(finite, loss, 0.0), "grad_norm": jnp.where(finite, grad_norm, 0.0),
               "skipped": (~finite).astype(jnp.float32)}
        return (params, opt_state), (out, metrics)

    def train_step(state: TrainState, batch: Batch, key: jax.Array):
        n = batch.tokens.shape[0]
        ref_logp = None
        chunks = cfg.minibatches * cfg.microbatches
        if loss_cfg.beta > 0:
            ref_logp = jax.lax.stop_gradient(chunked_logprobs(model_cfg, state.ref_params, batch, t_len, chunks))
        if cfg.sampling.old_logp_source == "recompute":
            batch = batch.replace(old_logp=jax.lax.stop_gradient(
                chunked_logprobs(model_cfg, state.params, batch, t_len, chunks)))
        ref_rows = ref_logp if ref_logp is not None else jnp.zeros((n, 0), jnp.float32)
        epoch_keys = jax.random.split(key, cfg.mu)

        def epoch(carry, k):
            k_perm, k_loss = jax.random.split(k)
            perm = jax.random.permutation(k_perm, n) if cfg.minibatches > 1 else jnp.arange(n)
            rows = jax.tree.map(lambda x: x[perm], (batch, ref_rows))
            mbs = _split_rows(rows, cfg.minibatches)
            xs = (mbs[0], None if ref_logp is None else mbs[1], jax.random.split(k_loss, cfg.minibatches))
            return jax.lax.scan(minibatch_update, carry, xs)

        (params, opt_state), (outs, metrics) = jax.lax.scan(epoch, (state.params, state.opt_state), epoch_keys)
        metrics = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics)
        merged = jax.tree.map(lambda x: x[0], metrics)
        for i in range(1, cfg.mu * cfg.minibatches):
            merged = losses.merge_metrics(merged, jax.tree.map(lambda x, i=i: x[i], metrics))
        out = losses.finalize_metrics(merged)
        out.update({k: jnp.mean(v) for k, v in outs.items() if k in ("loss", "grad_norm")})
        out["skipped"] = jnp.sum(outs["skipped"])
        count = state.step * cfg.mu * cfg.minibatches
        out["lr"] = learning_rate(cfg, count)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, out

    return train_step


def init_state(params, optimizer, *, keep_reference: bool) -> TrainState:
    ref = jax.tree.map(jnp.copy, params) if keep_reference else {}
    return TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), ref_params=ref)


# --------------------------------------------------------------------------------------------------
# host side: model, data, rewards, the loop
# --------------------------------------------------------------------------------------------------

def build_model(cfg: TrainConfig, vocab_size: int, key: jax.Array):
    """(model config, params) from a HF folder or a preset with the run's overrides (params on host)."""
    spec = cfg.model
    if spec.hf_path:
        model_cfg, params = models.load_hf(spec.hf_path, param_dtype=spec.param_dtype, dtype=spec.dtype)
        return model_cfg, params
    shape = {f: getattr(spec, f) for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim")}
    overrides = {k: v for k, v in shape.items() if v}
    model_cfg = models.preset(spec.preset, vocab_size=vocab_size, param_dtype=spec.param_dtype, dtype=spec.dtype,
                              **overrides)
    return model_cfg, models.init_params(model_cfg, key)


def reward_specs(cfg: TrainConfig, task) -> list[rewards_lib.RewardSpec]:
    raw = cfg.rewards.specs or tuple(task.reward_specs())
    return [rewards_lib.RewardSpec(**dict(s)) for s in raw]


def flatten_metrics(metrics: dict, dims: list[str]) -> dict[str, float]:
    """Scalars as they are; [K] per-dimension vectors as "<group>/<dim>/<stat>"; other arrays dropped."""
    out = {}
    for name, value in metrics.items():
        v = sharding.to_host(value)
        if v.ndim == 0:
            out[name] = float(v)
        elif v.shape == (len(dims),) and name in ("reward/mean", "reward/zero_var_frac_per_dim", "reward/adv_corr"):
            stat = name.split("/", 1)[1]
            out.update({f"reward/{d}/{stat}": float(x) for d, x in zip(dims, v)})
    return out


@functools.partial(jax.jit, static_argnames="cfg")
def advantages_and_diagnostics(rewards_BxGxK, weights_K, ro: sampler.Rollout, *, cfg):
    """Advantages [B, G] (non-finite -> 0) and the collapse / entropy / length diagnostics, in one program."""
    adv, _ = adv_lib.compute_advantages(rewards_BxGxK, weights_K, cfg=cfg)
    adv = jnp.where(jnp.isfinite(adv), adv, 0.0)
    diag = diagnostics.reward_diagnostics(rewards_BxGxK, weights_K, adv)
    diag.update(diagnostics.entropy_diagnostics(ro.entropies, ro.completion_mask))
    diag.update(diagnostics.length_diagnostics(ro.lengths.reshape(-1), ro.truncated.reshape(-1)))
    return adv, diag


class Trainer:
    """The GRPO loop for one run directory: build everything from the config, step, evaluate, save.

    Controls (issue: keep the learning signal alive): entropy-bonus coefficient schedule/adaptation,
    adaptive rollout temperature, alarms that warn or pause, reward-weight curriculum with a hot-reloaded
    weights file, DAPO dynamic sampling, pass-rate band filtering of the data. Their states travel in the
    checkpoint, so a resumed run continues exactly.
    """

    def __init__(self, cfg: TrainConfig, out_dir: str, *, resume: bool = False, quiet: bool = False,
                 rollback_to: int | None = None):
        from grpo_jax import checkpoint as ckpt_lib
        from grpo_jax import logging as log_lib

        self.cfg, self.out_dir = cfg, out_dir
        sharding.initialize_distributed(cfg.mesh)
        self.mesh = sharding.make_mesh(cfg.mesh)
        self._build_data()
        self.specs = reward_specs(cfg, self.task)
        self.dims = rewards_lib.dimension_names(self.specs)
        self._build_controls()
        self.run_key = jax.random.key(cfg.seed)
        k_init = jax.random.fold_in(self.run_key, 0x7FFFFFFF)
        self.model_cfg, params = build_model(cfg, self.tokenizer.vocab_size, k_init)
        params = sharding.shard_params(params, self.mesh)
        self.optimizer = make_optimizer(cfg)
        state = init_state(params, self.optimizer, keep_reference=cfg.loss.beta > 0)
        self.state_shardings = jax.tree.map(lambda x: x.sharding, jax.jit(lambda s: s)(state))
        self.train_step = jax.jit(make_train_step(self.model_cfg, cfg, self.optimizer),
                                  out_shardings=(self.state_shardings, None), donate_argnums=0)
        self.ckpt = ckpt_lib.Checkpointer(os.path.join(out_dir, "checkpoints"), keep_last=cfg.checkpoint.keep_last,
                                          keep_best=cfg.checkpoint.keep_best, best_metric=cfg.checkpoint.best_metric)
        self.state = state
        start = self._restore(rollback_to) if (resume or rollback_to is not None) else None
        os.makedirs(out_dir, exist_ok=True)
        log_dir = out_dir if jax.process_index() == 0 else os.path.join(out_dir, f"process-{jax.process_index()}")
        self.logger = log_lib.RunLogger(log_dir, total_steps=cfg.steps, tensorboard=cfg.logging.tensorboard,
                                        progress=cfg.logging.progress and not quiet and log_dir == out_dir,
                                        resume_step=start)
        if rollback_to is not None:
            self.logger.event(start, "rollback", to_step=start, config=to_dict(cfg))
        if start is None and jax.process_index() == 0:
            _write_json(os.path.join(out_dir, "config.json"), to_dict(cfg))
            self.logger.event(0, "data", **self.data_report)

    # ------------------------------------------------------------------ construction
    def _build_data(self) -> None:
        from grpo_jax import data as data_lib
        from grpo_jax import tasks as tasks_lib

        cfg = self.cfg
        self.task = tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options))
        self.tokenizer = self.task.tokenizer()
        required = self.task.required_fields
        if cfg.task.train_path:
            rows = data_lib.load_jsonl(cfg.task.train_path, required=required)
        else:
            rows = self.task.generate("train", cfg.task.n_train, cfg.seed)
        self.data_report = {"rows": len(rows), "strata": data_lib.strata_summary(rows)}
        if (cfg.task.pass_rate_lo, cfg.task.pass_rate_hi) != (0.0, 1.0):
            rows, band = data_lib.filter_by_pass_rate(rows, cfg.task.pass_rate_lo, cfg.task.pass_rate_hi)
            self.data_report.update(pass_rate_filter=band, pass_rate_strata=data_lib.strata_summary(rows, "pass_rate"))
            if not rows:
                raise ValueError(f"task.pass_rate_lo/hi = [{cfg.task.pass_rate_lo}, {cfg.task.pass_rate_hi}] "
                                 f"keeps no training row ({band})")
        if cfg.task.eval_path:
            self.eval_rows = data_lib.load_jsonl(cfg.task.eval_path, required=required)[: cfg.task.n_eval]
        else:
            self.eval_rows = self.task.generate("heldout", cfg.task.n_eval, cfg.seed) if cfg.task.n_eval else []
        self.stream = data_lib.PromptStream(rows, cfg.prompts_per_step, cfg.seed)

    def _build_controls(self) -> None:
        from grpo_jax import control, monitor

        cfg = self.cfg
        self.entropy_ctl = control.EntropyCoefController(cfg.entropy)
        self.temp_ctl = control.TemperatureController(cfg.temperature, cfg.sampling.temperature)
        self.monitor = monitor.Monitor(cfg.monitor)
        self.reward_weights = control.RewardWeights(self.dims, rewards_lib.weights(self.specs), cfg.rewards.weights)

    def _controls(self):
        return {"entropy": self.entropy_ctl, "temperature": self.temp_ctl, "monitor": self.monitor,
                "reward_weights": self.reward_weights}

    def set_params(self, params) -> None:
        """Start GRPO from these params (e.g. after a warm start): fresh optimizer, reference = params.
        The params are copied: the train step donates its state, and the caller may reuse what it passed."""
        params = jax.tree.map(jnp.copy, sharding.shard_params(params, self.mesh))
        self.state = init_state(params, self.optimizer, keep_reference=self.cfg.loss.beta > 0)

    # ------------------------------------------------------------------ checkpoints
    def _meta(self) -> dict:
        return {"config": to_dict(self.cfg), "cursor": self.stream.cursor.to_dict(), "step": self.step,
                "controls": {k: c.state_dict() for k, c in self._controls().items()}}

    @property
    def step(self) -> int:
        return int(self.state.step)

    def save(self, metrics: dict | None = None) -> None:
        self.ckpt.save(self.step, self.state, meta=self._meta(), metrics=metrics)

    def _restore(self, rollback_to: int | None) -> int | None:
        from grpo_jax import checkpoint as ckpt_lib
        from grpo_jax.data import Cursor

        if self.ckpt.latest_step() is None:
            if rollback_to is not None:
                raise ckpt_lib.CheckpointError(f"--rollback-to {rollback_to}: {self.out_dir} has no checkpoints")
            return None
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state,
                              self.state_shardings)
        state, meta, step = self.ckpt.restore(target, step=rollback_to)
        ckpt_lib.check_compatible(meta["config"], to_dict(self.cfg), RESUME_CRITICAL)
        newer = [s for s in self.ckpt.steps() if s > step]
        if rollback_to is not None and newer:
            _archive_branch(self.out_dir, step, newer)
        for s in newer:  # skipped as corrupt, or abandoned by a rollback (archived above): rewritten by this run
            self.ckpt.delete(s)
        self.state = state
        self.stream.cursor = Cursor.from_dict(meta["cursor"])
        for name, ctl in self._controls().items():
            if name in meta.get("controls", {}):
                ctl.load_state_dict(meta["controls"][name])
        return step

    # ------------------------------------------------------------------ one step
    def _prompts(self, rows):
        tokens, mask = self.tokenizer.encode_batch([r["prompt"] for r in rows])
        return sampler.prepare_prompts(tokens, mask, pad_id=self.tokenizer.pad_id)

    def rollout(self, rows, key, *, group_size, temperature):
        tokens, mask = self._prompts(rows)
        s = self.cfg.sampling
        token_temp = (s.token_entropy_floor, s.token_boost, s.token_max_temperature) if s.token_entropy_floor else None
        ro = sampler.sample(self.model_cfg, self.state.params, tokens, mask, key=key, group_size=group_size,
                            max_new_tokens=s.max_new_tokens, temperature=jnp.float32(temperature), top_k=s.top_k,
                            top_p=s.top_p, eos_ids=(self.tokenizer.eos_id,), pad_id=self.tokenizer.pad_id,
                            token_temperature=token_temp if temperature > 0 else None)
        return tokens, mask, ro

    def score(self, rows, ro):
        """R [B, G, K] and the decoded responses (host side)."""
        toks, lengths = sharding.to_host(ro.tokens), sharding.to_host(ro.lengths)  # gathered across processes
        b, g, _ = toks.shape
        texts = [self.tokenizer.decode(toks[i, j, : lengths[i, j]]) for i in range(b) for j in range(g)]
        samples = [dict(rows[i], response_length=int(lengths[i, j])) for i in range(b) for j in range(g)]
        r, _ = rewards_lib.evaluate(self.specs, texts, samples)
        return r.reshape(b, g, -1), texts

    def collect(self, key, weights):
        """One step's groups: a single rollout, or DAPO dynamic sampling over up to max_rounds rollouts
        keeping only groups whose weighted rewards differ. Returns (rows, prompt tokens, mask, rollout, R,
        texts, metrics)."""
        from grpo_jax.control import GroupBuffer

        cfg, dyn = self.cfg, self.cfg.dynamic
        b, temp = cfg.prompts_per_step, self.temp_ctl.value()
        if not dyn.enabled:
            rows = self.next_rows(b)
            tokens, mask, ro = self.rollout(rows, key, group_size=cfg.sampling.group_size, temperature=temp)
            r, texts = self.score(rows, ro)
            return rows, tokens, mask, ro, r, texts, {}
        draw = int(np.ceil(dyn.oversample * b))
        buffer, rounds = GroupBuffer(b, dyn.max_rounds), []
        while not buffer.done:
            rows = self.next_rows(draw)
            tokens, mask, ro = self.rollout(rows, jax.random.fold_in(key, len(rounds)),
                                            group_size=cfg.sampling.group_size, temperature=temp)
            r, texts = self.score(rows, ro)
            buffer.add(np.nansum(r * weights, axis=-1))
            rounds.append((rows, tokens, mask, ro, r, texts))
        return (*_gather_groups(rounds, buffer.selection(), cfg.sampling.group_size), buffer.metrics())

    def next_rows(self, n: int) -> list:
        """The next n training rows; advances the resumable cursor (one place for both sampling modes)."""
        from grpo_jax.data import next_indices

        idx, self.stream.cursor = next_indices(len(self.stream.rows), n, self.stream.cursor, seed=self.stream.seed)
        return [self.stream.rows[i] for i in idx]

    def make_batch(self, prompt_tokens, prompt_mask, ro, adv, entropy_coef: float) -> Batch:
        seq, seq_mask, _ = sampler.full_sequences(prompt_tokens, prompt_mask, ro, pad_id=self.tokenizer.pad_id)
        n = seq.shape[0]
        batch = Batch(tokens=seq, attn_mask=seq_mask, loss_mask=ro.completion_mask.reshape(n, -1).astype(bool),
                      old_logp=ro.logprobs.reshape(n, -1), advantages=adv.reshape(n),
                      temperatures=ro.temperatures.reshape(n, -1),
                      entropy_coef=jnp.full((n,), entropy_coef, jnp.float32))
        data_ways = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if n % data_ways == 0:
            batch = jax.tree.map(lambda x: jax.device_put(x, sharding.batch_sharding(self.mesh, x.ndim)), batch)
        return batch

    def step_once(self):
        """One GRPO step: (metrics, timings, sample texts, R)."""
        cfg, step = self.cfg, self.step
        k_sample, k_update = jax.random.split(jax.random.fold_in(self.run_key, step))
        change = self.reward_weights.maybe_reload(step)
        if change:
            self.logger.event(step, "reward_weights", **_without_step(change))
        weights = self.reward_weights.at(step)
        t0 = time.perf_counter()
        rows, tokens, mask, ro, r, texts, dyn_metrics = self.collect(k_sample, weights)
        t1 = time.perf_counter()
        adv, diag = advantages_and_diagnostics(jnp.asarray(r), jnp.asarray(weights), ro, cfg=cfg.advantage)
        coef = self.entropy_ctl.value(step)
        self.state, upd = self.train_step(self.state, self.make_batch(tokens, mask, ro, adv, coef), k_update)
        metrics = flatten_metrics({**diag, **upd}, self.dims)
        t2 = time.perf_counter()
        metrics.update(self._reward_stats(r, weights), **dyn_metrics)
        metrics.update({"control/entropy_coef": coef, "control/temperature": self.temp_ctl.value(),
                        "repetition/rate": repetition_rate(sharding.to_host(ro.tokens), sharding.to_host(ro.lengths))})
        metrics.update({f"control/weight/{d}": float(w) for d, w in zip(self.dims, weights)})
        self.entropy_ctl.update(step, metrics["entropy/mean"])
        self.temp_ctl.update(metrics["entropy/mean"])
        if cfg.ref_reset_every and (step + 1) % cfg.ref_reset_every == 0 and cfg.loss.beta > 0:
            self.state = self.state.replace(ref_params=jax.tree.map(jnp.copy, self.state.params))
        n_tokens = int(sharding.to_host(ro.lengths).sum())
        timings = {"time/rollout_and_reward": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
                   "tokens_per_s": n_tokens / max(t1 - t0, 1e-9)}
        return metrics, timings, texts, r

    def _reward_stats(self, r, weights) -> dict:
        total = np.nansum(r * weights, axis=-1)
        out = {"reward/total": float(np.nanmean(total))}
        for k, d in enumerate(self.dims):
            out[f"reward/{d}/std"] = float(np.nanstd(r[..., k]))
            out[f"reward/{d}/mean"] = float(np.nanmean(r[..., k]))
        if "format" in self.dims:
            out["format_rate"] = float(np.nanmean(r[..., self.dims.index("format")] >= 1.0))
        group_var = np.nanvar(total, axis=1)
        out["groups/reward_var_mean"] = float(group_var.mean())
        out["groups/zero_var_frac"] = float((group_var < 1e-12).mean())
        return out

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, rows=None, *, batch_size: int = 256) -> dict:
        """Greedy held-out evaluation: accuracy = primary reward (first dimension) == 1, its mean, format."""
        rows = self.eval_rows if rows is None else rows
        if not rows:
            return {}
        scores = []
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            _, _, ro = self.rollout(chunk, jax.random.key(0), group_size=1, temperature=0.0)
            scores.append(self.score(chunk, ro)[0][:, 0])
        r = np.concatenate(scores)
        out = {"eval/accuracy": float(np.mean(r[:, 0] >= 1.0 - 1e-6)), "eval/score": float(np.mean(r[:, 0]))}
        if "format" in self.dims:
            out["eval/format_rate"] = float(np.mean(r[:, self.dims.index("format")] >= 1.0))
        return out

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Step until cfg.steps or a pausing alarm; returns {"steps", "wall_seconds", "paused"}."""
        from grpo_jax import monitor

        cfg, start_time, paused = self.cfg, time.perf_counter(), False
        eval_every, ckpt_every = cfg.logging.eval_every, cfg.checkpoint.every
        if self.step == 0 and eval_every:
            self.logger.log(0, self.evaluate())
        while self.step < cfg.steps and not paused:
            metrics, timings, texts, _ = self.step_once()
            step = self.step
            last = step == cfg.steps
            if (eval_every and step % eval_every == 0) or last:
                metrics.update(self.evaluate())
            self.logger.log(step, metrics, timings=timings)
            self.logger.log_samples(step, [{"response": t} for t in texts[: cfg.logging.samples_per_step]])
            alarms = self.monitor.observe(step, metrics)
            paused = monitor.should_pause(alarms)
            self._report_alarms(step, alarms)
            if (ckpt_every and step % ckpt_every == 0) or last or paused:
                self.save(metrics)
        self.logger.close()
        self.ckpt.close()
        return {"steps": self.step, "wall_seconds": time.perf_counter() - start_time, "paused": paused}

    def _report_alarms(self, step: int, alarms) -> None:
        from grpo_jax import monitor

        for a in alarms:
            self.logger.event(step, "alarm", **_without_step(a.to_dict()))
            warnings.warn(a.message, stacklevel=2)
        if monitor.should_pause(alarms):
            monitor.write_alarm_report(os.path.join(self.out_dir, "alarms", f"step-{step}"), alarms, step)
            self.logger.event(step, "pause", alarms=[a.rule.key for a in alarms])

    def report(self, summary: dict, *, title: str, sections=()) -> tuple[str, str]:
        """PNG plots from metrics.jsonl plus report.md / report.json in the run directory."""
        from grpo_jax import logging as log_lib

        rows = log_lib.read_jsonl(os.path.join(self.out_dir, "metrics.jsonl"))
        plots = log_lib.plot_run(rows, self.out_dir)
        data = "```\n" + json.dumps(self.data_report, indent=1) + "\n```"
        sections = list(sections) + [("Data (rows kept by each stage, difficulty strata)", data)]
        return log_lib.write_report(self.out_dir, summary, title=title, sections=sections, plots=plots)


def _without_step(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "step"}


def repetition_rate(tokens_BxGxT: np.ndarray, lengths_BxG: np.ndarray, n: int = 3) -> float:
    """Mean over completions of the fraction of repeated n-grams (1 - distinct / total); 0 if too short."""
    rates = []
    for row, length in zip(tokens_BxGxT.reshape(-1, tokens_BxGxT.shape[-1]), lengths_BxG.reshape(-1)):
        grams = [tuple(row[i : i + n]) for i in range(int(length) - n + 1)]
        rates.append(1.0 - len(set(grams)) / len(grams) if grams else 0.0)
    return float(np.mean(rates)) if rates else 0.0


def _gather_groups(rounds, selection, group_size: int):
    """Concatenate the chosen (round, group) pairs of several rollout rounds into one step's batch."""
    width = max(r[1].shape[1] for r in rounds)

    def pad_left(x, fill):
        return jnp.pad(x, ((0, 0), (width - x.shape[1], 0)), constant_values=fill)

    rows, toks, masks, ros, rs, texts = [], [], [], [], [], []
    for rnd, g in selection:
        r_rows, r_tok, r_mask, r_ro, r_r, r_texts = rounds[rnd]
        rows.append(r_rows[g])
        toks.append(pad_left(r_tok[g : g + 1], 0))
        masks.append(pad_left(r_mask[g : g + 1], False))
        ros.append(jax.tree.map(lambda x, g=g: x[g : g + 1], r_ro))
        rs.append(r_r[g : g + 1])
        texts.extend(r_texts[g * group_size : (g + 1) * group_size])
    ro = jax.tree.map(lambda *xs: jnp.concatenate(xs), *ros)
    return rows, jnp.concatenate(toks), jnp.concatenate(masks), ro, np.concatenate(rs), texts


def _archive_branch(out_dir: str, step: int, abandoned: list[int]) -> None:
    """Before a rollback rewrites history after `step`, keep copies of what it replaces (never lose data)."""
    import shutil

    dest = os.path.join(out_dir, "branches", f"from-step-{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(dest, exist_ok=True)
    for name in ("metrics.jsonl", "timings.jsonl", "samples.jsonl"):
        src = os.path.join(out_dir, name)
        if os.path.exists(src):
            shutil.copy2(src, dest)
    for s in abandoned:
        shutil.copytree(os.path.join(out_dir, "checkpoints", str(s)), os.path.join(dest, "checkpoints", str(s)))


def _write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True))


def parse_args(argv=None, *, description: str = "", get_config=None):
    """The CLI every experiment shares: --out, --seed, --smoke, --set key=value ..., --resume, --config.

    get_config(smoke: bool) -> TrainConfig supplies the experiment's defaults (TrainConfig() if None)."""
    import argparse

    from grpo_jax.config import from_dict, override
    from grpo_jax.perf import tune_host_allocator

    tune_host_allocator()  # every launcher comes through here: big XLA:CPU buffers reused, not re-faulted
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/grpo", help="run directory (metrics, checkpoints, report)")
    ap.add_argument("--seed", type=int, default=None, help="run seed (overrides the config's)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long variant (used by the tests)")
    ap.add_argument("--config", default=None, help="a config.json written by an earlier run")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. --set loss.eps_high=0.28 (repeatable)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in --out")
    ap.add_argument("--rollback-to", type=int, default=None, metavar="STEP",
                    help="restart from the kept checkpoint at STEP (with --set overrides); the run log marks the "
                         "branch and the abandoned checkpoints/logs are archived under --out/branches/")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--seeds", default=None, metavar="S1,S2,...",
                    help="studies only: the seeds to train (default: --seed and the next two)")
    ap.add_argument("--summarize-only", action="store_true",
                    help="studies only: rebuild results.md / results.json / plots from the runs already in --out "
                         "(e.g. after training seeds in separate processes with --seeds)")
    args = ap.parse_args(argv)
    cfg = get_config(smoke=args.smoke) if get_config else TrainConfig()
    if args.config:
        with open(args.config) as f:
            cfg = from_dict(TrainConfig, json.load(f))
    cfg = override(cfg, args.overrides + ([f"seed={args.seed}"] if args.seed is not None else []))
    return args, cfg


def main(argv=None) -> dict:
    from grpo_jax.monitor import PAUSE_EXIT_CODE

    args, cfg = parse_args(argv, description="Run GRPO from a config: python -m grpo_jax.train --out DIR --set ...")
    summary = Trainer(cfg, args.out, resume=args.resume, quiet=args.quiet, rollback_to=args.rollback_to).run()
    if summary["paused"]:
        print(f"paused by an alarm at step {summary['steps']}: see {args.out}/alarms/; continue with --resume "
              f"or --rollback-to STEP --set ...", file=sys.stderr)
        sys.exit(PAUSE_EXIT_CODE)
    return summary


if __name__ == "__main__":
    main()
