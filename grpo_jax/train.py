"""The GRPO update and the training loop.

One step (docs/architecture.md): `experience.py` turns data rows into an `Experience` (rollout, rewards
R[B, G, K], totals) and a `Batch`; this module's pure `train_step(state, batch, key, entropy_coef) ->
(state, metrics)` takes the reference logprobs (beta > 0), then runs mu epochs x minibatches (x microbatches,
accumulated) of the loss in `losses.py`, one optax update per minibatch. `Trainer` is the loop around them:
controls, logging, evaluation, checkpoints. Keys: the step key is `fold_in(key(seed), step)`, split into
(sample, update); nothing random happens without one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

import models
from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import control, diagnostics, experience, losses, monitor, provenance, runlog, sharding
from grpo_jax import export as export_lib
from grpo_jax import data as data_lib
from grpo_jax import rewards as rewards_lib
from grpo_jax import tasks as tasks_lib
from grpo_jax.cli import parse_args
from grpo_jax.config import RESUME_CRITICAL, TrainConfig, inert_settings, to_dict
from grpo_jax.experience import Batch
from grpo_jax.fileio import atomic_write_text
from grpo_jax.perf import tune_host_allocator
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
# the pure update
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


def completion_logprobs(model_cfg: ModelConfig, params, tokens, attn_mask, n_completion: int, temperature, *,
                        dropout_key=None):
    """Teacher-forced logprobs and entropies [N, T] of the last T tokens under softmax(logits / temperature);
    temperature is a scalar or per token [N, T] (as the sampler recorded it). dropout_key: LoRA dropout
    (the loss forward only)."""
    pos = text_positions(attn_mask)
    logits, _ = models.forward(model_cfg, params, tokens, rope_positions(model_cfg, pos), attn_mask=attn_mask,
                               dropout_key=dropout_key)
    t = jnp.asarray(temperature, jnp.float32)
    t = jnp.where(t > 0, t, 1.0)
    logits = logits[:, -n_completion - 1 : -1] / (t[..., None] if t.ndim else t)
    targets = tokens[:, -n_completion:]
    return models.token_logprobs(logits, targets), models.token_entropy(logits)


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


def make_minibatch_update(model_cfg: ModelConfig, cfg: TrainConfig, optimizer: optax.GradientTransformation):
    """`update((params, opt_state), (minibatch, ref_logp, sampler_logp, key), entropy_coef, base=None)`:
    gradients accumulated over the microbatches, normalised by the summed loss denominator, one optax update;
    a non-finite loss or gradient norm leaves params and optimizer state unchanged (and counts as skipped).
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
        out = {"loss": jnp.where(finite, loss, 0.0), "grad_norm": jnp.where(finite, grad_norm, 0.0),
               "skipped": (~finite).astype(jnp.float32)}
        return (params, opt_state), (out, metrics)

    return update


def make_train_step(model_cfg: ModelConfig, cfg: TrainConfig, optimizer: optax.GradientTransformation):
    """The pure update `train_step(state, batch, key, entropy_coef) -> (state, metrics)` for this run's
    config; entropy_coef is a traced scalar (its schedule never recompiles the step)."""
    t_len, chunks = cfg.sampling.max_new_tokens, cfg.minibatches * cfg.microbatches
    minibatch_update = make_minibatch_update(model_cfg, cfg, optimizer)
    schedule = lr_schedule(cfg)
    recompute, gap_bound = cfg.sampling.old_logp_source == "recompute", cfg.logging.gap_bound
    # the loss needs the rollout's logprobs beside pi_old only when they differ (recompute) and it uses them
    pass_sampler = recompute and (cfg.loss.corrects_gap or cfg.loss.opsm_delta is not None or cfg.loss.kl_is)

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
        elif cfg.logging.gap_every:  # one extra teacher-forced pass on measured steps only
            measured = state.step % cfg.logging.gap_every == 0
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


def init_state(params, optimizer, *, keep_reference: bool, adapters=None) -> TrainState:
    """Step 0. Without adapters the optimizer trains `params`; with LoRA adapters (`models.lora`) it trains
    those only and `params` become the frozen base (TrainState.base). keep_reference: hold a copy of
    `params` as the reference (with LoRA only needed for ref_reset_every, see `initial_state`)."""
    ref = jax.tree.map(jnp.copy, params) if keep_reference else {}
    if adapters is None:
        return TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), ref_params=ref)
    return TrainState(step=jnp.int32(0), params=adapters, opt_state=optimizer.init(adapters), ref_params=ref,
                      base=params)


def initial_state(cfg: TrainConfig, model_cfg: ModelConfig, params, optimizer, key: jax.Array,
                  mesh=None) -> TrainState:
    """The state a run starts from (placed on `mesh` when given). With LoRA (lora.rank > 0) `params` are the
    frozen base and fresh adapters (B = 0, A from fold_in(key, LORA_INIT_FOLD)) are trained. The KL
    reference is then the base itself, no copy (TRL with peft: adapters disabled), except with
    ref_reset_every, whose resets copy the merged policy into a held reference."""
    place = (lambda tree: tree) if mesh is None else (lambda tree: sharding.shard_params(tree, mesh))
    params = place(params)
    if not cfg.lora.rank:
        return init_state(params, optimizer, keep_reference=cfg.loss.beta > 0)
    adapters = place(lora_lib.init_adapters(model_cfg, cfg.lora.rank, cfg.lora.targets,
                                            jax.random.fold_in(models.as_typed_key(key), LORA_INIT_FOLD)))
    return init_state(params, optimizer, keep_reference=cfg.loss.beta > 0 and cfg.ref_reset_every > 0,
                      adapters=adapters)


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


def build_model(cfg: TrainConfig, vocab_size: int, key: jax.Array, *, tokenizer_name: str = "the task's tokenizer"):
    """(model config, params) from a HF folder or a preset with the run's overrides (params on host).

    vocab_size is the tokenizer's: a loaded model with fewer embedding rows is an error, since JAX clamps
    out-of-range ids in the lookup and the run would train silently on the wrong tokens."""
    spec = cfg.model
    if spec.hf_path:
        model_cfg, params = models.load_hf(spec.hf_path, param_dtype=spec.param_dtype, dtype=spec.dtype)
        model_cfg = model_cfg.replace(remat=spec.remat)  # a training choice, not in the HF config
        if model_cfg.vocab_size < vocab_size:
            raise ValueError(
                f"vocabulary mismatch: the model in model.hf_path={spec.hf_path!r} has vocab_size "
                f"{model_cfg.vocab_size} (config.json), smaller than the {vocab_size} ids of {tokenizer_name}; "
                f"ids {model_cfg.vocab_size}..{vocab_size - 1} would be clamped to the last embedding row and the run "
                "would train on garbage. Use the tokenizer saved with the checkpoint (for jsonl_math: "
                "task.options tokenizer_path = the checkpoint folder) or a model whose vocab_size is at least "
                f"{vocab_size}")
        return model_cfg, params
    model_cfg = preset_config(spec, vocab_size)
    return model_cfg, models.init_params(model_cfg, key)


def preset_config(spec, vocab_size: int) -> ModelConfig:
    """The ModelConfig of model.preset with the run's shape overrides (0 = keep the preset's); also what
    `grpo_jax.export` rebuilds a checkpoint's shapes from."""
    shape = {f: getattr(spec, f) for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim")}
    overrides = {k: v for k, v in shape.items() if v}
    return models.preset(spec.preset, vocab_size=vocab_size, param_dtype=spec.param_dtype, dtype=spec.dtype,
                         remat=spec.remat, **overrides)


def reward_specs(cfg: TrainConfig, task) -> tuple[rewards_lib.RewardSpec, ...]:
    """The run's reward dimensions: rewards.specs, else the task's defaults; a bad entry names its index."""
    raw = cfg.rewards.specs or tuple(task.reward_specs())
    where = "rewards.specs" if cfg.rewards.specs else f"task {task.name!r} default rewards"
    specs = []
    for i, s in enumerate(raw):
        try:
            specs.append(rewards_lib.RewardSpec(**dict(s)))
        except (TypeError, ValueError) as e:  # TypeError: a key RewardSpec does not take
            raise ValueError(f"{where}[{i}] = {json.dumps(s, default=str)}: {e}") from None
    return tuple(specs)


# --------------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------------

class StepOutput(NamedTuple):
    metrics: dict  # flat float metrics of the step (what the monitor watches and metrics.jsonl records)
    timings: dict  # wall-clock figures (timings.jsonl)
    experience: experience.Experience  # the step's rollout, rewards and texts
    histograms: dict  # {name: (bin edges, bin fractions)}, e.g. the token-entropy histogram


class Trainer:
    """The GRPO loop for one run directory: state, controls, logging, evaluation, checkpoints.

    Controls (keep the learning signal alive): entropy-bonus coefficient schedule/adaptation, adaptive
    rollout temperature, alarms that warn or pause, reward-weight curriculum with a hot-reloaded weights
    file, DAPO dynamic sampling, pass-rate band filtering of the data. Their states travel in the
    checkpoint, so a resumed run continues exactly. What one step does is in `step_once`.
    """

    def __init__(self, cfg: TrainConfig, out_dir: str, *, resume: bool = False, quiet: bool = False,
                 rollback_to: int | None = None):
        tune_host_allocator()  # process-wide, idempotent: XLA:CPU's big buffers reused, not re-faulted
        self.cfg, self.out_dir = cfg, out_dir
        sharding.initialize_distributed(cfg.mesh)
        self.mesh = sharding.make_mesh(cfg.mesh)
        self.rollout_mesh = sharding.make_rollout_mesh(cfg.mesh) or self.mesh
        self.task = tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options))
        tokenizer = self.task.tokenizer()
        rows, self.eval_rows, self.data_report = data_lib.load_task_data(self.task, cfg.task, cfg.seed, tokenizer)
        if "format" in self.data_report:  # a file task scores rows of the format its file was read in
            self.task = tasks_lib.bind_format(self.task, self.data_report["format"])
        self.stream = data_lib.PromptStream(rows, cfg.prompts_per_step, cfg.seed)
        specs = reward_specs(cfg, self.task)
        self.entropy_ctl = control.EntropyCoefController(cfg.entropy)
        self.temp_ctl = control.TemperatureController(cfg.temperature, cfg.sampling.temperature)
        self.monitor = monitor.Monitor(cfg.monitor)
        dims = rewards_lib.dimension_names(specs)
        self.reward_weights = control.RewardWeights(dims, rewards_lib.weights(specs), cfg.rewards.weights)
        self.run_key = jax.random.key(cfg.seed)
        model_cfg, params = build_model(cfg, tokenizer.vocab_size, jax.random.fold_in(self.run_key, INIT_KEY_FOLD),
                                        tokenizer_name=repr(tokenizer))
        self.actor = experience.Actor(model_cfg, tokenizer, specs, cfg.sampling, mesh=self.rollout_mesh)
        if cfg.checkpoint.export_hf:  # refused now, not after the last step
            export_lib.check_exportable(model_cfg, "checkpoint.export_hf=true")
        self.optimizer = make_optimizer(cfg)
        self.state = initial_state(cfg, model_cfg, params, self.optimizer,
                                   jax.random.fold_in(self.run_key, INIT_KEY_FOLD), mesh=self.mesh)
        self.state_shardings = jax.tree.map(lambda x: x.sharding, jax.jit(lambda s: s)(self.state))
        # LoRA: the merged policy, laid out as the base (train.policy_params; unused state leaves are pruned)
        self._merged = jax.jit(lambda st: policy_params(model_cfg, cfg, st), out_shardings=self.state_shardings.base)
        self.train_step = jax.jit(make_train_step(model_cfg, cfg, self.optimizer),
                                  out_shardings=(self.state_shardings, None), donate_argnums=0)
        self.ckpt = ckpt_lib.Checkpointer(os.path.join(out_dir, "checkpoints"), keep_last=cfg.checkpoint.keep_last,
                                          keep_best=cfg.checkpoint.keep_best, best_metric=cfg.checkpoint.best_metric)
        start = self._restore(rollback_to) if (resume or rollback_to is not None) else None
        self._open_logs(start, quiet=quiet, rollback=rollback_to is not None, resume=resume)

    def _open_logs(self, start: int | None, *, quiet: bool, rollback: bool, resume: bool = False) -> None:
        cfg, out_dir = self.cfg, self.out_dir
        os.makedirs(out_dir, exist_ok=True)
        # One metrics stream: process 0 writes the run's logs; the others log to a scratch folder removed when
        # the run ends (they see the same metrics; their checkpoint shards go to the shared checkpoint set)
        # a fresh run: what _fresh_start found, and which of its settings act on (almost) nothing
        notes = ([*self._fresh_start(resume=resume), *(("inert_setting", {"message": m}) for m in inert_settings(cfg))]
                 if start is None else [])
        pid = jax.process_index()
        log_dir = out_dir if pid == 0 else tempfile.mkdtemp(prefix=f"grpo-jax-process-{pid}-")
        self.logger = runlog.RunLogger(log_dir, total_steps=cfg.steps, tensorboard=cfg.logging.tensorboard,
                                       progress=cfg.logging.progress and not quiet and log_dir == out_dir,
                                       resume_step=start)
        for kind, info in notes:
            self.logger.event(0, kind, **info)
            warnings.warn(info["message"], RuntimeWarning, stacklevel=3)
        if rollback:
            self.logger.event(start, "rollback", to_step=start, config=to_dict(cfg))
        if start is None and jax.process_index() == 0:
            atomic_write_text(os.path.join(out_dir, "config.json"), json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            self.logger.event(0, "data", **self.data_report)
        if jax.process_index() == 0:  # every start (a resume may run other code): <out>/manifest.json
            for problem in provenance.record_start(out_dir, cfg, self.actor.specs, start_step=start or 0):
                self.logger.event(start or 0, "regression_failed", message=problem)
                warnings.warn(problem, RuntimeWarning, stacklevel=3)

    def _fresh_start(self, *, resume: bool) -> list[tuple[str, dict]]:
        """Before a run starts at step 0 in its folder: the (event kind, info) notes to log and warn. Every
        process decides (so all of them refuse a folder that holds a run); process 0 moves the files.

        A folder whose logs hold steps but which has no checkpoint was interrupted before its first one
        (Ctrl-C, kill -9, a crash): nothing can be resumed, so its logs are moved to
        <out>/interrupted/<time>/ and the run starts again. A folder with checkpoints is refused unless
        --resume or --rollback-to says what to do with it."""
        prefix = "--resume: " if resume else ""
        if not runlog.has_step_rows(self.out_dir):
            if not resume:
                return []
            return [("resume_nothing", {"message": f"--resume: {self.out_dir} has no checkpoint to resume from "
                                                   "(nor logged steps); starting a new run at step 0"})]
        checkpoints = self.ckpt.steps()
        if checkpoints:  # only without --resume: _restore would have found them
            raise FileExistsError(
                f"{self.out_dir} already holds a run (checkpoints at steps {checkpoints}, rows in metrics.jsonl): "
                "continue it with --resume (Trainer(resume=True)), go back to a checkpoint with --rollback-to STEP, "
                "or choose another --out")
        if jax.process_index() != 0:
            return []
        moved = runlog.set_aside(self.out_dir, os.path.join(self.out_dir, "interrupted"))
        return [("restart", {"previous_logs": moved, "message": (
            f"{prefix}{self.out_dir} holds the logs of a run stopped before its first checkpoint (nothing to "
            f"resume); they were moved to {moved} and the run starts again at step 0")})]

    @property
    def step(self) -> int:
        return int(self.state.step)

    def set_params(self, params) -> None:
        """Start GRPO from these params (e.g. after a warm start): fresh optimizer, reference = params (with
        LoRA: params become the frozen base, with fresh adapters). The params are copied: the train step
        donates its state, and the caller may reuse what it passed."""
        params = jax.tree.map(jnp.copy, sharding.shard_params(params, self.mesh))
        self.state = initial_state(self.cfg, self.actor.model_cfg, params, self.optimizer,
                                   jax.random.fold_in(self.run_key, INIT_KEY_FOLD), mesh=self.mesh)

    def policy_params(self):
        """The current policy's full weights (`policy_params`): state.params, or with LoRA the base with the
        adapters merged in. What rollouts, evaluation, reference resets and the export use."""
        return self._merged(self.state) if self.cfg.lora.rank else self.state.params

    # ------------------------------------------------------------------ checkpoints
    def _controls(self) -> dict:
        return {"entropy": self.entropy_ctl, "temperature": self.temp_ctl, "monitor": self.monitor,
                "reward_weights": self.reward_weights}

    def save(self, metrics: dict | None = None) -> None:
        meta = {"config": to_dict(self.cfg), "cursor": self.stream.cursor.to_dict(), "step": self.step,
                "controls": {k: c.state_dict() for k, c in self._controls().items()}}
        self.ckpt.save(self.step, self.state, meta=meta, metrics=metrics)

    def _restore(self, rollback_to: int | None) -> int | None:
        if self.ckpt.latest_step() is None:
            if rollback_to is not None:
                raise ckpt_lib.CheckpointError(f"--rollback-to {rollback_to}: {self.out_dir} has no checkpoints")
            return None
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state,
                              self.state_shardings)
        state, meta, step = self.ckpt.restore(target, step=rollback_to)
        ckpt_lib.check_compatible(meta["config"], to_dict(self.cfg), RESUME_CRITICAL, defaults=to_dict(TrainConfig()))
        newer = [s for s in self.ckpt.steps() if s > step]
        if rollback_to is not None and newer:
            ckpt_lib.archive_branch(self.out_dir, step, newer)
        for s in newer:  # skipped as corrupt, or abandoned by a rollback (archived above): rewritten by this run
            self.ckpt.delete(s)
        self.state = state
        self.stream.cursor = data_lib.Cursor.from_dict(meta["cursor"])
        for name, ctl in self._controls().items():
            if name in meta.get("controls", {}):
                ctl.load_state_dict(meta["controls"][name])
        return step

    # ------------------------------------------------------------------ one step
    def next_rows(self, n: int) -> list:
        """The next n training rows; advances the resumable cursor (one place for both sampling modes)."""
        idx, self.stream.cursor = data_lib.next_indices(len(self.stream.rows), n, self.stream.cursor,
                                                        seed=self.stream.seed)
        return [self.stream.rows[i] for i in idx]

    def step_once(self) -> StepOutput:
        """One GRPO step."""
        cfg, step, dims = self.cfg, self.step, self.actor.dims
        k_sample, k_update = jax.random.split(jax.random.fold_in(self.run_key, step))
        change = self.reward_weights.maybe_reload(
            step, on_reject=lambda info: self.logger.event(step, "reward_weights_rejected", **_without_step(info)))
        if change:
            self.logger.event(step, "reward_weights", **_without_step(change))
        weights = self.reward_weights.at(step)
        coef, temperature = self.entropy_ctl.value(step), self.temp_ctl.value()
        t0 = time.perf_counter()
        params = sharding.on_mesh(self.policy_params(), self.rollout_mesh)  # resharded once a step, if needed
        exp, dyn_metrics = experience.collect(self.actor, params, self.next_rows, k_sample,
                                              n_prompts=cfg.prompts_per_step, weights=weights, dynamic=cfg.dynamic,
                                              advantage=cfg.advantage, temperature=temperature)
        t1 = time.perf_counter()
        adv, diag = experience.advantages_and_diagnostics(exp, weights, cfg=cfg.advantage)
        batch = experience.make_batch(exp, adv, self.mesh, mask_truncated=cfg.loss.mask_truncated)
        self.state, upd = self.train_step(self.state, batch, k_update, jnp.float32(coef))
        metrics, histograms = experience.flatten_metrics({**diag, **upd}, dims)
        if not metrics.pop("gap/measured", 1.0):  # the sampler-trainer gap is measured every gap_every steps
            metrics = {k: v for k, v in metrics.items() if not k.startswith("gap/")}
        t2 = time.perf_counter()
        metrics.update(experience.host_metrics(exp, dims), **dyn_metrics)
        metrics.update({"control/entropy_coef": coef, "control/temperature": temperature})
        metrics.update({f"control/weight/{d}": float(w) for d, w in zip(dims, weights)})
        self._update_controls(step, metrics["entropy/mean"])
        n_tokens = int(sharding.to_host(exp.rollout.lengths).sum())
        timings = {"time/rollout_and_reward": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
                   "tokens_per_s": n_tokens / max(t1 - t0, 1e-9)}
        return StepOutput(metrics, timings, exp, histograms)

    def _update_controls(self, step: int, entropy_mean: float) -> None:
        self.entropy_ctl.update(step, entropy_mean)
        self.temp_ctl.update(entropy_mean)
        if self.cfg.ref_reset_every and (step + 1) % self.cfg.ref_reset_every == 0 and self.cfg.loss.beta > 0:
            # with LoRA the merged policy is a new array already; the plain params are donated next step: copied
            ref = self.policy_params() if self.cfg.lora.rank else jax.tree.map(jnp.copy, self.state.params)
            self.state = self.state.replace(ref_params=ref)

    def evaluate(self, rows=None) -> dict:
        """Greedy held-out evaluation of the current policy (experience.evaluate) on `rows` or the eval split."""
        return experience.evaluate(self.actor, self.policy_params(), self.eval_rows if rows is None else rows)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Step until cfg.steps or a pausing alarm; returns {"steps", "wall_seconds", "paused"}."""
        cfg, start_time, paused = self.cfg, time.perf_counter(), False
        eval_every, ckpt_every = cfg.logging.eval_every, cfg.checkpoint.every
        if self.step == 0 and eval_every:
            self.logger.log(0, self.evaluate())
        while self.step < cfg.steps and not paused:
            metrics, timings, exp, histograms = self.step_once()
            step = self.step
            last = step == cfg.steps
            if (eval_every and step % eval_every == 0) or last:
                metrics.update(self.evaluate())
            self.logger.log(step, metrics, timings=timings, histograms=histograms)
            self.logger.log_samples(step, experience.logged_samples(exp, self.actor.dims, cfg.logging.samples_per_step))
            alarms = self.monitor.observe(step, metrics)
            paused = monitor.should_pause(alarms)
            if (ckpt_every and step % ckpt_every == 0) or last or paused:
                self.save(metrics)
            self._report_alarms(step, alarms)
        if cfg.checkpoint.export_hf and not paused:
            hf_dir = os.path.join(self.out_dir, "hf")
            info = export_lib.export_trainer(self, hf_dir)
            if info is not None:
                self.logger.event(self.step, "export", path=hf_dir, tokenizer=info["tokenizer"])
        self.logger.close()
        if self.logger.out_dir != self.out_dir:  # another process's scratch logs (see _open_logs)
            shutil.rmtree(self.logger.out_dir, ignore_errors=True)
        self.ckpt.close()
        return {"steps": self.step, "wall_seconds": time.perf_counter() - start_time, "paused": paused}

    def _report_alarms(self, step: int, alarms) -> None:
        for a in alarms:
            self.logger.event(step, "alarm", **_without_step(a.to_dict()))
            warnings.warn(a.message, stacklevel=2)
        if monitor.should_pause(alarms):
            command = monitor.rollback_command(self.out_dir, alarms, self.ckpt.steps())
            monitor.write_alarm_report(os.path.join(self.out_dir, "alarms", f"step-{step}"), alarms, step,
                                       command=command)
            self.logger.event(step, "pause", alarms=[a.rule.key for a in alarms], rollback_command=command)

    def report(self, summary: dict, *, title: str, sections=()) -> tuple[str, str]:
        """PNG plots from metrics.jsonl plus report.md / report.json in the run directory."""
        rows = runlog.read_jsonl(os.path.join(self.out_dir, "metrics.jsonl"))
        plots = runlog.plot_run(rows, self.out_dir)
        data = "```\n" + json.dumps(self.data_report, indent=1) + "\n```"
        sections = list(sections) + [("Data (rows kept by each stage, difficulty strata)", data)]
        return runlog.write_report(self.out_dir, summary, title=title, sections=sections, plots=plots)


def _without_step(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "step"}


# --------------------------------------------------------------------------------------------------
# command line (the shared flags: grpo_jax.cli)
# --------------------------------------------------------------------------------------------------

def main(argv=None) -> dict:
    args, cfg = parse_args(argv, description="Run GRPO from a config: python -m grpo_jax.train --out DIR --set ...")
    summary = Trainer(cfg, args.out, resume=args.resume, quiet=args.quiet, rollback_to=args.rollback_to).run()
    if summary["paused"]:
        print(f"paused by an alarm at step {summary['steps']}: {args.out}/alarms/step-{summary['steps']}.md names "
              f"it and the command that rolls back with a control on (or continue unchanged with --resume)",
              file=sys.stderr)
        sys.exit(monitor.PAUSE_EXIT_CODE)
    return summary


if __name__ == "__main__":
    main()
