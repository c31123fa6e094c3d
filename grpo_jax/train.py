"""The GRPO training loop: `Trainer` runs one run directory (state, controls, logging, evaluation,
checkpoints, rollback), and `python -m grpo_jax.train` runs it from the command line (flags: `cli.py`).

One step (`Trainer.step_once`) is `experience.collect` (rollouts, rewards R[B, G, K]),
`experience.advantages_and_diagnostics`, `experience.make_batch`, then the pure jitted
`update.train_step`. Keys: the step key is `fold_in(key(seed), step)`, split into (sample, update);
nothing random happens without one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import jax
import jax.numpy as jnp

from grpo_jax import aot
from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import control, evaluation, experience, monitor, provenance, runlock, runlog, sampler, sharding
from grpo_jax import export as export_lib
from grpo_jax import data as data_lib
from grpo_jax import rewards as rewards_lib
from grpo_jax import tasks as tasks_lib
from grpo_jax.build import build_model, check_model_folder, lora_note, reward_specs
from grpo_jax.cli import for_people, parse_args
from grpo_jax.config import RESUME_CRITICAL, TrainConfig, inert_settings, to_dict
from grpo_jax.fileio import atomic_write_text
from grpo_jax.perf import tune_host_allocator
from grpo_jax.update import INIT_KEY_FOLD, initial_state, make_optimizer, make_train_step, policy_params


# --------------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepOutput:
    metrics: dict  # flat float metrics of the step (what the monitor watches and metrics.jsonl records)
    timings: dict  # wall-clock figures (timings.jsonl)
    experience: experience.Experience  # the step's rollout, rewards and texts
    histograms: dict  # {name: (bin edges, bin fractions)}, e.g. the token-entropy histogram


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A rollout dispatched before the step that trains on it (`Trainer._decode_with_current`)."""

    rows: list  # round 0's data rows
    rollout: sampler.Rollout  # device arrays, perhaps still being computed (JAX's asynchronous dispatch)
    cursor_before: data_lib.Cursor  # the data stream's cursor before these rows (a checkpoint saves the oldest)
    temperature: float  # what it was sampled at
    lag: int  # updates between the params that decoded it and the params of the step that trains on it
    scored: experience.Scoring | Exception | None = None  # scored ahead (off-policy), or what scoring raised


class Trainer:
    """The GRPO loop for one run directory: state, controls, logging, evaluation, checkpoints.

    Controls (keep the learning signal alive): entropy-bonus coefficient schedule/adaptation, adaptive
    rollout temperature, alarms that warn or pause, reward-weight curriculum with a hot-reloaded weights
    file, DAPO dynamic sampling, pass-rate band filtering of the data. Their states travel in the
    checkpoint, so a resumed run continues exactly. What one step does is in `step_once`.
    """

    def __init__(self, cfg: TrainConfig, out_dir: str, *, resume: bool = False, quiet: bool = False,
                 rollback_to: int | None = None, lock_wait: float = 0.0):
        """Build the run in `out_dir`: fresh, or continued from its newest good checkpoint (`resume`) or from
        the checkpoint at `rollback_to`. Process 0 first locks the folder (`runlock`: another process running
        there is refused at once, or after `lock_wait` seconds of waiting) and holds it until `run` ends."""
        self.cfg, self.out_dir = cfg, out_dir
        sharding.initialize_distributed(cfg.mesh)
        self.lock = runlock.acquire(out_dir, wait=lock_wait) if jax.process_index() == 0 else None
        try:
            tune_host_allocator()  # process-wide, idempotent: XLA:CPU's big buffers reused, not re-faulted
            provenance.result_provenance()  # read now, at the start: the report carries the code that ran
            self._build()
            self._restore_notes: list[tuple[str, dict]] = []  # what a restore changed, logged once the logs open
            start = self._restore(rollback_to) if (resume or rollback_to is not None) else None
            self._open_logs(start, quiet=quiet, rollback=rollback_to is not None, resume=resume)
        except BaseException:
            self.release_lock()
            raise

    def release_lock(self) -> None:
        """Let another process run in the folder (`run` does this when it ends); idempotent."""
        if self.lock is not None:
            self.lock.release()

    def _build(self) -> None:
        """Data, controls, model, optimizer state and the jitted programs of `self.cfg`."""
        cfg, out_dir = self.cfg, self.out_dir
        self.mesh = sharding.make_mesh(cfg.mesh)
        self.rollout_mesh = sharding.make_rollout_mesh(cfg.mesh) or self.mesh
        check_model_folder(cfg)  # before the task's tokenizer, which is often read from the same folder
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
        # the state as train_step returns it (a jit output's spec is normalised, P(None, None) -> P(), and the
        # optimizer's step count committed): step 1's input then has step 2's signature, one compilation
        self.state = jax.device_put(self.state, self.state_shardings)
        # LoRA: the merged policy, laid out as the base (update.policy_params; unused state leaves are pruned)
        self._merged = jax.jit(lambda st: policy_params(model_cfg, cfg, st), out_shardings=self.state_shardings.base)
        self.train_step = jax.jit(sharding.under_mesh(self.mesh, make_train_step(model_cfg, cfg, self.optimizer)),
                                  out_shardings=(self.state_shardings, None), donate_argnums=0)
        self.iteration_seconds: list[float] = []  # wall time of each loop iteration of `run` (benchmarks read it)
        self._pending: dict[int, _Pending] = {}  # step -> its rollout, dispatched ahead (rollout.overlap / off_policy)
        self.ckpt = ckpt_lib.Checkpointer(os.path.join(out_dir, "checkpoints"), keep_last=cfg.checkpoint.keep_last,
                                          keep_best=cfg.checkpoint.keep_best, best_metric=cfg.checkpoint.best_metric)

    def _open_logs(self, start: int | None, *, quiet: bool, rollback: bool, resume: bool = False) -> None:
        cfg, out_dir = self.cfg, self.out_dir
        os.makedirs(out_dir, exist_ok=True)
        # One metrics stream: process 0 writes the run's logs; the others log to a scratch folder removed when
        # the run ends (they see the same metrics; their checkpoint shards go to the shared checkpoint set)
        # a fresh run: what _fresh_start found, and which of its settings act on (almost) nothing
        notes = ([*self._fresh_start(resume=resume), *(("inert_setting", {"message": m}) for m in inert_settings(cfg)),
                  *(("lora_off", {"message": m}) for m in [lora_note(cfg)] if m)]
                 if start is None else self._restore_notes)
        pid = jax.process_index()
        log_dir = out_dir if pid == 0 else tempfile.mkdtemp(prefix=f"grpo-jax-process-{pid}-")
        self.logger = runlog.RunLogger(log_dir, total_steps=cfg.steps, tensorboard=cfg.logging.tensorboard,
                                       progress=cfg.logging.progress and not quiet and log_dir == out_dir,
                                       resume_step=start)
        for kind, info in notes:
            self.logger.event(start or 0, kind, **info)
            warnings.warn(info["message"], RuntimeWarning, stacklevel=3)
        if rollback:
            self.logger.event(start, "rollback", to_step=start, config=to_dict(cfg))
        if start is None and jax.process_index() == 0:
            atomic_write_text(os.path.join(out_dir, "config.json"), json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            self.logger.event(0, "data", **self.data_report)
        if jax.process_index() == 0 and not quiet:  # what cleaning did to the data, seen before training on it
            for setting, key in (("task.train_path", "sanitize"), ("task.eval_path", "eval_sanitize")):
                line = data_lib.cleaning_summary(setting, self.data_report.get(key, {}))
                if line:
                    print(line, file=sys.stderr, flush=True)
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
        self._drop_pending()  # decoded with the params replaced here
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
        # rows drawn for rollouts dispatched ahead are drawn again by a resumed run: the cursor before them
        cursor = next(iter(self._pending.values())).cursor_before if self._pending else self.stream.cursor
        meta = {"config": to_dict(self.cfg), "cursor": cursor.to_dict(), "step": self.step,
                "controls": {k: c.state_dict() for k, c in self._controls().items()}}
        self.ckpt.save(self.step, self.state, meta=meta, metrics=metrics)

    def _restore(self, rollback_to: int | None) -> int | None:
        if self.ckpt.latest_step() is None:
            if rollback_to is not None:
                raise ckpt_lib.CheckpointError(f"--rollback-to {rollback_to}: {self.out_dir} has no checkpoints")
            return None
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state,
                              self.state_shardings)
        state, meta, step = self.ckpt.restore(target, step=rollback_to, may_lack=("ref_params",))
        if jax.tree_util.tree_leaves(self.state.ref_params) and not jax.tree_util.tree_leaves(state.ref_params):
            # written while loss.beta was 0 (a KL switched on at a rollback): the reference is the policy restored
            state = state.replace(ref_params=jax.tree.map(jnp.copy, state.params))
            self._restore_notes.append(("kl_reference", {
                "message": f"checkpoint step {step} holds no KL reference (loss.beta was 0 when it was written): the "
                           f"KL reference is the policy of step {step}"}))
        ckpt_lib.check_compatible(meta["config"], to_dict(self.cfg), RESUME_CRITICAL, defaults=to_dict(TrainConfig()))
        mismatch = runlog.logs_mismatch(self.out_dir, step, meta, critical=RESUME_CRITICAL)
        if mismatch:  # refused before anything in the folder changes
            raise ckpt_lib.CheckpointError(
                f"cannot {'roll back' if rollback_to is not None else 'resume'} {self.out_dir}: its checkpoints and "
                f"its logs are of different runs: {mismatch}. Move the other run's checkpoints or logs elsewhere, "
                "or choose another --out")
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

    def _step_keys(self, step: int) -> tuple[jax.Array, jax.Array]:
        """(sampling key, update key) of a step: split(fold_in(key(seed), step))."""
        k_sample, k_update = jax.random.split(jax.random.fold_in(self.run_key, step))
        if self.cfg.sampling.key_offset:  # a null arm: only the rollouts' randomness changes (0 keeps the key)
            k_sample = jax.random.fold_in(k_sample, self.cfg.sampling.key_offset)
        return k_sample, k_update

    def _rollout_params(self):
        return sharding.on_mesh(self.policy_params(), self.rollout_mesh)  # resharded once a step, if needed

    def _decode_with_current(self, step: int) -> None:
        """The current params are those of `step`: dispatch the rollouts they decode and that are not yet
        dispatched, in step order (their rows are drawn in that order): `step`'s own rollout, and with
        one-step off-policy rollouts also the next step's, unless that step starts afresh after a checkpoint
        (its rollout is then decoded with its own params, as a resumed run decodes it). Nothing waits here:
        the device runs them while the host goes on."""
        cfg = self.cfg
        ahead = (step, step + 1) if cfg.rollout.off_policy_steps else (step,)
        for s in ahead:
            if s >= cfg.steps or s in self._pending or (s > step and self._periodic_checkpoint(s)):
                continue
            before = self.stream.cursor
            rows = self.next_rows(experience.round_size(cfg.prompts_per_step, cfg.dynamic))
            temperature = self.temp_ctl.value()
            key = experience.round_key(self._step_keys(s)[0], 0, cfg.dynamic)
            ro = experience.rollout(self.actor, self._rollout_params(), rows, key,
                                    group_size=cfg.sampling.group_size, temperature=temperature)
            self._pending[s] = _Pending(rows, ro, before, temperature, lag=s - step)

    def _score_ahead(self, step: int) -> None:
        """Score `step`'s rollout, decoded ahead with the previous params, now: the host works while the device
        runs the update just dispatched and the rollout after. Its first round only (dynamic sampling draws
        later rounds when the step runs); what scoring raises is kept and raised by that step, so the step
        that is running now is logged and checkpointed first. Rewards that wait (`user_reward(threads=)`) go on
        in their threads while this step logs; `step` collects them."""
        pending = self._pending.get(step)
        if pending is None or pending.scored is not None:
            return
        try:
            scored = experience.start_scoring(self.actor, pending.rows, pending.rollout)
        except Exception as e:  # noqa: BLE001 - raised by the step that trains on it
            scored = e
        self._pending[step] = dataclasses.replace(pending, scored=scored)

    def _drop_pending(self) -> None:
        """Forget the rollouts dispatched ahead; their rows go back to the stream (the oldest one's cursor)."""
        if self._pending:
            self.stream.cursor = next(iter(self._pending.values())).cursor_before
        for pending in self._pending.values():
            if isinstance(pending.scored, experience.Scoring):
                pending.scored.close()
        self._pending.clear()

    def _periodic_checkpoint(self, step: int) -> bool:
        """Whether `run` writes a periodic checkpoint at `step` (checkpoint.every). A run resumed from it decodes
        `step`'s rollout with its own params (the params before are not kept), so the uninterrupted run does
        too (`_decode_with_current`)."""
        every = self.cfg.checkpoint.every
        return bool(every) and step % every == 0

    def step_once(self) -> StepOutput:
        """One GRPO step. Its rollout was usually dispatched ahead (`_decode_with_current`): at the end of
        the previous step with rollout.overlap, and one step earlier still with off-policy rollouts; the
        next rollouts are dispatched as soon as this step's update is, before the host work that follows."""
        cfg, step, dims = self.cfg, self.step, self.actor.dims
        k_sample, k_update = self._step_keys(step)
        change = self.reward_weights.maybe_reload(
            step, on_reject=lambda info: self.logger.event(step, "reward_weights_rejected", **_without_step(info)))
        if change:
            self.logger.event(step, "reward_weights", **_without_step(change))
        weights = self.reward_weights.at(step)
        coef = self.entropy_ctl.value(step)
        t0 = time.perf_counter()
        if step not in self._pending:
            self._decode_with_current(step)
        pending = self._pending.pop(step)
        temperature = pending.temperature
        if isinstance(pending.scored, Exception):  # raised while this rollout was scored ahead
            raise pending.scored
        jax.block_until_ready(pending.rollout.tokens)
        t_decoded = time.perf_counter()
        scored = pending.scored.result() if pending.scored is not None else None  # threaded rewards, collected
        params = self._rollout_params() if cfg.dynamic.enabled else None  # later rounds: this step's params
        exp, dyn_metrics = experience.collect(self.actor, params, self.next_rows, k_sample,
                                              n_prompts=cfg.prompts_per_step, weights=weights, dynamic=cfg.dynamic,
                                              advantage=cfg.advantage, temperature=temperature,
                                              first=scored or (pending.rows, pending.rollout))
        t1 = time.perf_counter()
        adv, diag = experience.advantages_and_diagnostics(exp, weights, cfg=cfg.advantage)
        batch = experience.make_batch(exp, adv, self.mesh, mask_truncated=cfg.loss.mask_truncated)
        self.state, upd = self.train_step(self.state, batch, k_update, jnp.float32(coef))
        self._update_controls(step, float(diag["entropy/mean"]))  # the next rollouts' temperature
        if cfg.rollout.overlap or cfg.rollout.off_policy_steps:
            self._decode_with_current(step + 1)  # queued behind the update: decoded while the host works
        t_scored_ahead = time.perf_counter()
        if cfg.rollout.off_policy_steps:
            self._score_ahead(step + 1)  # while the device runs this update and decodes the rollout after
        t_scored_ahead = time.perf_counter() - t_scored_ahead
        host = experience.host_metrics(exp, dims)  # overlaps the update
        metrics, histograms = experience.flatten_metrics({**diag, **upd}, dims)  # waits for the update
        if not metrics.pop("gap/measured", 1.0):  # the sampler-trainer gap is measured every gap_every steps
            metrics = {k: v for k, v in metrics.items() if not k.startswith("gap/")}
        t2 = time.perf_counter()
        metrics.update(host, **dyn_metrics)
        metrics.update({"control/entropy_coef": coef, "control/temperature": temperature})
        metrics.update({f"control/weight/{d}": float(w) for d, w in zip(dims, weights)})
        if cfg.rollout.off_policy_steps:  # later dynamic-sampling rounds are decoded with this step's params
            metrics["rollout/lag"] = pending.lag * dyn_metrics.get("dynamic/first_round_frac", 1.0)
        metrics.update(monitor.health_metrics(metrics, vocab_size=self.actor.model_cfg.vocab_size))
        n_tokens = int(sharding.to_host(exp.rollout.lengths).sum())
        timings = {"time/rollout_wait": t_decoded - t0, "time/score": t1 - t_decoded,
                   "time/score_ahead": t_scored_ahead, "time/rollout_and_reward": t1 - t0, "time/update": t2 - t1,
                   "time/step": t2 - t0,
                   "tokens_per_s": n_tokens / max(t2 - t0, 1e-9)}  # completion tokens per second of step_once
        return StepOutput(metrics, timings, exp, histograms)

    def _update_controls(self, step: int, entropy_mean: float) -> None:
        self.entropy_ctl.update(step, entropy_mean)
        self.temp_ctl.update(entropy_mean)
        if self.cfg.ref_reset_every and (step + 1) % self.cfg.ref_reset_every == 0 and self.cfg.loss.beta > 0:
            # with LoRA the merged policy is a new array already; the plain params are donated next step: copied
            ref = self.policy_params() if self.cfg.lora.rank else jax.tree.map(jnp.copy, self.state.params)
            self.state = self.state.replace(ref_params=ref)

    def evaluate(self, rows=None, *, sampled: bool = False) -> dict:
        """Held-out evaluation of the current policy on `rows` or the eval split (`evaluation`): greedy, and
        when `sampled` logging.eval_samples completions at T = 1 per problem. Logs each problem's result
        (problems.jsonl, for paired statistics) and returns the flat figures."""
        rows = self.eval_rows if rows is None else rows
        ev = evaluation.evaluate_problems(self.actor, self.policy_params(), rows,
                                          samples=self.cfg.logging.eval_samples if sampled else 0)
        if rows is self.eval_rows and len(rows):
            per_problem = ev.per_problem()
            self.logger.log_problems(self.step, {**per_problem, "samples": ev.sampled.shape[1]} if sampled else
                                     {"greedy_correct": per_problem["greedy_correct"]})
        return ev.metrics()

    def _sampled_eval_due(self, step: int) -> bool:
        every = self.cfg.logging.eval_samples_every
        return bool(self.cfg.logging.eval_samples) and (step in (0, self.cfg.steps) or (every and step % every == 0))

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Step until cfg.steps or a pausing alarm; returns {"steps", "wall_seconds", "paused"}. The folder's
        lock is released when it returns or raises."""
        try:
            return self._run()
        finally:
            self.release_lock()

    def _run(self) -> dict:
        cfg, start_time, paused = self.cfg, time.perf_counter(), False
        eval_every = cfg.logging.eval_every
        if self.step == 0 and eval_every:
            self.logger.log(0, self.evaluate(sampled=self._sampled_eval_due(0)))
        iteration_start = time.perf_counter()
        while self.step < cfg.steps and not paused:
            out = self.step_once()
            metrics, step = out.metrics, self.step
            last = step == cfg.steps
            if (eval_every and step % eval_every == 0) or last:
                metrics.update(self.evaluate(sampled=self._sampled_eval_due(step)))
            self.logger.log(step, metrics, timings=out.timings, histograms=out.histograms)
            if step == 1:  # the first update: a format rate of 0 here is a prompt/reward mismatch, said once
                self._warn_format_zero(metrics)
            samples = experience.logged_samples(out.experience, self.actor.dims, cfg.logging.samples_per_step)
            self.logger.log_samples(step, samples)
            alarms = self.monitor.observe(step, metrics)
            paused = monitor.should_pause(alarms)
            if self._periodic_checkpoint(step) or last or paused:
                self.save(metrics)
            self._report_alarms(step, alarms)
            now = time.perf_counter()  # the whole iteration (step, logs, evaluation, checkpoint)
            self.iteration_seconds.append(now - iteration_start)
            iteration_start = now
        self._drop_pending()  # rollouts dispatched for steps this run will not take (a pause)
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

    def _warn_format_zero(self, metrics: dict) -> None:
        """Log a `format_zero` event and warn when no completion of the first step passed the format reward."""
        message = experience.format_zero_warning(metrics)
        if message:
            self.logger.event(self.step, "format_zero", message=message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _report_alarms(self, step: int, alarms) -> None:
        for a in alarms:
            self.logger.event(step, "alarm", **_without_step(a.to_dict()))
            warnings.warn(a.message, stacklevel=2)
        if monitor.should_pause(alarms):
            kept = self.ckpt.steps()
            trouble = self.monitor.trouble(alarms, kept)  # where it began, and the checkpoint from before it
            command = monitor.rollback_command(self.out_dir, alarms, kept, began=trouble["began"])
            monitor.write_alarm_report(os.path.join(self.out_dir, "alarms", f"step-{step}"), alarms, step,
                                       command=command, trouble=trouble)
            self.logger.event(step, "pause", alarms=[a.rule.key for a in alarms], rollback_command=command,
                              trouble=trouble)

    def report(self, summary: dict, *, title: str, sections=()) -> tuple[str, str]:
        """PNG plots from metrics.jsonl plus report.md / report.json in the run directory; report.json
        carries the provenance of the process writing it (`provenance.result_provenance`)."""
        rows = runlog.read_jsonl(os.path.join(self.out_dir, "metrics.jsonl"))
        plots = runlog.plot_run(rows, self.out_dir)
        data = "```\n" + json.dumps(self.data_report, indent=1) + "\n```"
        sections = list(sections) + [("Data (rows kept by each stage, difficulty strata)", data)]
        return runlog.write_report(self.out_dir, summary, title=title, sections=sections, plots=plots,
                                   provenance=provenance.result_provenance())


def _without_step(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "step"}


# --------------------------------------------------------------------------------------------------
# command line (the shared flags: grpo_jax.cli)
# --------------------------------------------------------------------------------------------------

def open_trainer(cfg: TrainConfig, out_dir: str, **kwargs) -> Trainer:
    """`Trainer(cfg, out_dir, **kwargs)` for a command line: a folder another run holds ends the process with
    that run's description (`runlock`) instead of a traceback."""
    try:
        return Trainer(cfg, out_dir, **kwargs)
    except runlock.RunLocked as e:
        raise SystemExit(f"error: {e}") from None


@for_people
def main(argv=None) -> dict:
    args, cfg = parse_args(argv, description="Run GRPO from a config: python -m grpo_jax.train --out DIR --set ...")
    if args.compile_only:
        return aot.compile_only(args, cfg)
    trainer = open_trainer(cfg, args.out, resume=args.resume, quiet=args.quiet, rollback_to=args.rollback_to)
    summary = trainer.run()
    if summary["paused"]:
        monitor.exit_paused(args.out, summary["steps"])
    return summary


if __name__ == "__main__":
    main()
