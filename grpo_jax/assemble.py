"""A run's parts built from its config, allocating only what the run itself would: `assemble(cfg) -> RunParts`.

The Trainer loops over the parts; the studies' warm start, pass@k and the benchmarks use them without a Trainer
(no run folder, no lock, no logs). The order below is the order a run has always been built in: the
data stream's rows, then the model's init key, then the state, so a run's numbers do not depend on who
assembles it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from grpo_jax import experience, sharding
from grpo_jax import data as data_lib
from grpo_jax import export as export_lib
from grpo_jax import tasks as tasks_lib
from grpo_jax.build import build_model, check_model_folder, model_positions, reward_specs
from grpo_jax.config import TrainConfig
from grpo_jax.perf import tune_host_allocator
from grpo_jax.update import INIT_KEY_FOLD, initial_state, make_optimizer, make_train_step, policy_params


@dataclasses.dataclass(frozen=True)
class RunParts:
    """Everything a run of `cfg` trains with; nothing here changes while it trains (the state is the
    initial one: the Trainer keeps its own)."""

    cfg: TrainConfig
    mesh: jax.sharding.Mesh  # the update's
    rollout_mesh: jax.sharding.Mesh  # the sampler's (the update's unless mesh.rollout_* says otherwise)
    task: Any  # tasks.Task, bound to its data file's format
    actor: experience.Actor  # model config, tokenizer, reward specs, sampling settings, rollout mesh
    rows: list  # the training rows (data.PromptStream draws from them)
    eval_rows: list
    data_report: dict  # what loading and cleaning the data did (logged as the run's first event)
    optimizer: Any  # optax.GradientTransformation
    state: Any  # update.TrainState at step 0, laid out as train_step returns it
    state_shardings: Any  # a pytree of shardings, the state's
    train_step: Callable  # jitted (state, batch, key, entropy_coef) -> (state, metrics), state donated
    merged: Callable  # jitted state -> the LoRA-merged policy, laid out as the base
    run_key: jax.Array  # key(seed): steps fold their index into it

    def policy_params(self, state):
        """The policy's full weights in `state` (`update.policy_params`): state.params, or with LoRA the base
        with the adapters merged in."""
        return self.merged(state) if self.cfg.lora.rank else state.params

    def fresh_state(self, params):
        """A step-0 state starting from `params` (copied: the train step donates its state): fresh optimizer,
        reference = params; with LoRA params become the frozen base, with fresh adapters."""
        params = jax.tree.map(jnp.copy, sharding.shard_params(params, self.mesh))
        return initial_state(self.cfg, self.actor.model_cfg, params, self.optimizer,
                             jax.random.fold_in(self.run_key, INIT_KEY_FOLD), mesh=self.mesh)

    def state_target(self):
        """The state as ShapeDtypeStructs with its shardings: what `Checkpointer.restore` reads into."""
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state,
                            self.state_shardings)


def assemble(cfg: TrainConfig) -> RunParts:
    """Data, model, optimizer state and the jitted programs of `cfg`."""
    tune_host_allocator()  # process-wide, idempotent: XLA:CPU's big buffers reused, not re-faulted
    mesh = sharding.make_mesh(cfg.mesh)
    rollout_mesh = sharding.make_rollout_mesh(cfg.mesh) or mesh
    check_model_folder(cfg)  # before the task's tokenizer, which is often read from the same folder
    task = tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options))
    tokenizer = task.tokenizer()
    # the prompt budget is checked against the model's positions before any data or weight is read
    limit, how = data_lib.prompt_token_limit(cfg.sampling, *model_positions(cfg))
    rows, eval_rows, data_report = data_lib.load_task_data(task, cfg.task, cfg.seed, tokenizer)
    rows, eval_rows, lengths = data_lib.limit_prompts(rows, eval_rows, tokenizer, limit, how, cfg.sampling.long_prompts)
    if lengths:
        data_report["prompt_lengths"] = lengths
    if "format" in data_report:  # a file task scores rows of the format its file was read in
        task = tasks_lib.bind_format(task, data_report["format"])
    run_key = jax.random.key(cfg.seed)
    model_cfg, params = build_model(cfg, tokenizer.vocab_size, jax.random.fold_in(run_key, INIT_KEY_FOLD),
                                    tokenizer_name=repr(tokenizer))
    actor = experience.Actor(model_cfg, tokenizer, reward_specs(cfg, task), cfg.sampling, mesh=rollout_mesh,
                             prompt_limit=limit, tool=cfg.tool if cfg.tool.enabled else None)
    if cfg.checkpoint.export_hf:  # refused now, not after the last step
        export_lib.check_exportable(model_cfg, "checkpoint.export_hf=true")
    optimizer = make_optimizer(cfg)
    state = initial_state(cfg, model_cfg, params, optimizer, jax.random.fold_in(run_key, INIT_KEY_FOLD), mesh=mesh)
    # the state as train_step returns it (a jit output's spec is normalised, P(None, None) -> P(), and the
    # optimizer's step count committed): step 1's input then has step 2's signature, one compilation
    state_shardings = jax.tree.map(lambda x: x.sharding, jax.jit(lambda s: s)(state))
    state = jax.device_put(state, state_shardings)
    # LoRA: the merged policy, laid out as the base (update.policy_params; unused state leaves are pruned)
    merged = jax.jit(lambda st: policy_params(model_cfg, cfg, st), out_shardings=state_shardings.base)
    train_step = jax.jit(sharding.under_mesh(mesh, make_train_step(model_cfg, cfg, optimizer)),
                         out_shardings=(state_shardings, None), donate_argnums=0)
    return RunParts(cfg, mesh, rollout_mesh, task, actor, rows, eval_rows, data_report, optimizer, state,
               state_shardings, train_step, merged, run_key)
