"""The GRPO training loop: `Trainer` loops over one run (its parts from `assemble`, its folder from
`runfolder`, its rollouts dispatched ahead from `ahead`), and `python -m grpo_jax.train` runs it from the
command line (flags: `cli.py`).

One step (`Trainer.step_once`) is `experience.collect` (rollouts, rewards R[B, G, K]),
`experience.advantages_and_diagnostics`, `experience.make_batch`, then the pure jitted
`update.train_step`. Keys: the step key is `fold_in(key(seed), step)`, split into (sample, update);
nothing random happens without one.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import (aot, control, evaluation, experience, failures, interrupts, monitor, presets, provenance,
                      runfolder, runlock, sharding, tools)
from grpo_jax import export as export_lib
from grpo_jax import data as data_lib
from grpo_jax import rewards as rewards_lib
from grpo_jax.ahead import Pending, RolloutsAhead, periodic_checkpoint
from grpo_jax.assemble import assemble
from grpo_jax.cli import for_people, out_dir, parse_args
from grpo_jax.config import TrainConfig, to_dict


# --------------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepOutput:
    metrics: dict  # flat float metrics of the step (what the monitor watches and metrics.jsonl records)
    timings: dict  # wall-clock figures (timings.jsonl)
    experience: experience.Experience  # the step's rollout, rewards and texts
    histograms: dict  # {name: (bin edges, bin fractions)}, e.g. the token-entropy histogram
    advantages: np.ndarray  # [B, G] the advantage each completion of `experience` was trained with


class Trainer:
    """The GRPO loop over one run folder: the run's parts (`assemble`), its controls, the rollouts dispatched
    ahead (`ahead.RolloutsAhead`) and its folder (`runfolder.RunFolder`: lock, logs, checkpoints).

    Controls (keep the learning signal alive): entropy-bonus coefficient schedule/adaptation, adaptive
    rollout temperature, alarms that warn or pause, reward-weight curriculum with a hot-reloaded weights
    file, DAPO dynamic sampling, pass-rate band filtering of the data. Their states travel in the
    checkpoint, so a resumed run continues exactly. What one step does is in `step_once`.
    """

    def __init__(self, cfg: TrainConfig, out_dir: str, *, resume: bool = False, quiet: bool = False,
                 rollback_to: int | None = None, lock_wait: float = 0.0):
        """Build the run in `out_dir`: fresh, or continued from its newest good checkpoint (`resume`) or from
        the checkpoint at `rollback_to`. Process 0 first locks the folder and holds it until `run` ends."""
        self.cfg, self.out_dir = cfg, out_dir
        sharding.initialize_distributed(cfg.mesh)
        self.folder = runfolder.RunFolder(out_dir, cfg, lock_wait=lock_wait)
        self.lock = self.folder.lock
        try:
            provenance.result_provenance()  # read now, at the start: the report carries the code that ran
            self.parts = p = assemble(cfg)
            self.actor, self.task, self.mesh, self.state = p.actor, p.task, p.mesh, p.state
            self.eval_rows, self.data_report, self.state_shardings = p.eval_rows, p.data_report, p.state_shardings
            self.stream = data_lib.PromptStream(p.rows, cfg.prompts_per_step, cfg.seed)
            self.next_rows = self.stream.take
            self.entropy_ctl = control.EntropyCoefController(cfg.entropy)
            self.temp_ctl = control.TemperatureController(cfg.temperature, cfg.sampling.temperature)
            self.monitor = monitor.Monitor(tools.monitor_config(cfg.monitor, cfg.tool))
            self.failures = failures.RewardFailures()  # reward failures said once each; a total one stops the run
            self.steps_taken = 0  # by this process (a reward failing on every row of the first one stops the run)
            self.reward_weights = control.RewardWeights(self.actor.dims, rewards_lib.weights(self.actor.specs),
                                                        cfg.rewards.weights)
            self.ahead = RolloutsAhead(cfg, self.actor, self.stream, lambda s: self._step_keys(s)[0],
                                       self.temp_ctl.value)
            self.iteration_seconds: list[float] = []  # wall time of each iteration of `run` (benchmarks read it)
            self.ckpt = self.folder.open_checkpoints()
            restored = self.folder.restore(p.state_target(), rollback_to) if resume or rollback_to is not None else None
            start, notes = self._load(restored) if restored else (None, self.folder.fresh_start(resume=resume))
            self.logger = self.folder.open_logs(start, notes, quiet=quiet, rollback=rollback_to is not None,
                                                data_report=self.data_report, specs=self.actor.specs)
        except BaseException:
            self.release_lock()
            raise

    def release_lock(self) -> None:
        """Let another process run in the folder (`run` does this when it ends); idempotent."""
        self.folder.release_lock()

    @property
    def step(self) -> int:
        return int(self.state.step)

    def set_params(self, params) -> None:
        """Start GRPO from these params (e.g. after a warm start): `RunParts.fresh_state`."""
        self.ahead.drop()  # decoded with the params replaced here
        self.state = self.parts.fresh_state(params)

    def policy_params(self):
        """The current policy's full weights (`update.policy_params`): what rollouts, evaluation, reference
        resets and the export use."""
        return self.parts.policy_params(self.state)

    # ------------------------------------------------------------------ checkpoints
    def _controls(self) -> dict:
        return {"entropy": self.entropy_ctl, "temperature": self.temp_ctl, "monitor": self.monitor,
                "reward_weights": self.reward_weights}

    def save(self, metrics: dict | None = None) -> None:
        meta = {"config": to_dict(self.cfg), "cursor": self.ahead.cursor().to_dict(), "step": self.step,
                "controls": {k: c.state_dict() for k, c in self._controls().items()}}
        self.ckpt.save(self.step, self.state, meta=meta, metrics=metrics)

    def _load(self, restored: tuple) -> tuple[int, list]:
        """Continue from what `RunFolder.restore` read: the state, the data cursor, the controls."""
        self.state, meta, step, notes = restored
        self.stream.cursor = data_lib.Cursor.from_dict(meta["cursor"])
        for name, ctl in self._controls().items():
            if name in meta.get("controls", {}):
                ctl.load_state_dict(meta["controls"][name])
        return step, notes

    # ------------------------------------------------------------------ one step
    def _step_keys(self, step: int) -> tuple[jax.Array, jax.Array]:
        """(sampling key, update key) of a step: split(fold_in(key(seed), step))."""
        k_sample, k_update = jax.random.split(jax.random.fold_in(self.parts.run_key, step))
        if self.cfg.sampling.key_offset:  # a null arm: only the rollouts' randomness changes (0 keeps the key)
            k_sample = jax.random.fold_in(k_sample, self.cfg.sampling.key_offset)
        return k_sample, k_update

    def _rollout_params(self):
        return sharding.on_mesh(self.policy_params(), self.parts.rollout_mesh)  # resharded once a step, if needed

    def step_once(self) -> StepOutput:
        """One GRPO step. Its rollout was usually dispatched ahead (`ahead.RolloutsAhead`): at the end of
        the previous step with rollout.overlap, and one step earlier still with off-policy rollouts; the
        next rollouts are dispatched as soon as this step's update is, before the host work that follows."""
        cfg, step = self.cfg, self.step
        k_sample, k_update = self._step_keys(step)
        change = self.reward_weights.maybe_reload(
            step, on_reject=lambda info: self.logger.event(step, "reward_weights_rejected", **_without_step(info)))
        if change:
            self.logger.event(step, "reward_weights", **_without_step(change))
        weights, coef = self.reward_weights.at(step), self.entropy_ctl.value(step)
        t0 = time.perf_counter()
        pending = self.ahead.take(step, self._rollout_params)
        jax.block_until_ready(pending.rollout.tokens)
        t_decoded = time.perf_counter()
        scored = pending.scored.result() if pending.scored is not None else None  # threaded rewards, collected
        params = self._rollout_params() if cfg.dynamic.enabled else None  # later rounds: this step's params
        exp, dyn_metrics = experience.collect(self.actor, params, self.next_rows, k_sample,
                                              n_prompts=cfg.prompts_per_step, weights=weights, dynamic=cfg.dynamic,
                                              advantage=cfg.advantage, temperature=pending.temperature,
                                              first=scored or (pending.rows, pending.rollout))
        self.failures.check(step + 1, exp.errors, exp.reasons, self.logger, first=not self.steps_taken)
        self.steps_taken += 1
        t1 = time.perf_counter()
        adv, diag = experience.advantages_and_diagnostics(exp, weights, cfg=cfg.advantage)
        batch = experience.make_batch(exp, adv, self.mesh, mask_truncated=cfg.loss.mask_truncated)
        self.state, upd = self.parts.train_step(self.state, batch, k_update, jnp.float32(coef))
        self._update_controls(step, float(diag["entropy/mean"]))  # the next rollouts' temperature
        if cfg.rollout.overlap or cfg.rollout.off_policy_steps:
            self.ahead.dispatch(step + 1, self._rollout_params)  # queued behind the update: decoded while the host works
        t_ahead = time.perf_counter()
        if cfg.rollout.off_policy_steps:
            self.ahead.score(step + 1)  # while the device runs this update and decodes the rollout after
        t_ahead = time.perf_counter() - t_ahead
        host = experience.host_metrics(exp, self.actor.dims)  # overlaps the update
        metrics, histograms = experience.flatten_metrics({**diag, **upd}, self.actor.dims)  # waits for the update
        t2 = time.perf_counter()
        metrics = step_metrics(cfg, self.actor, metrics, {**host, **dyn_metrics}, pending, coef=coef, weights=weights)
        n_tokens = int(sharding.to_host(exp.rollout.lengths).sum())
        timings = {"time/rollout_wait": t_decoded - t0, "time/score": t1 - t_decoded, "time/score_ahead": t_ahead,
                   "time/rollout_and_reward": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
                   "tokens_per_s": n_tokens / max(t2 - t0, 1e-9),  # completion tokens per second of step_once
                   **experience.host_timings(exp)}
        return StepOutput(metrics, timings, exp, histograms, sharding.to_host(adv))

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
                                          samples=self.cfg.logging.eval_samples if sampled else 0,
                                          canonical=getattr(self.task, "canonical_answer", None))
        no_tool = evaluation.without_tool(self.actor, self.policy_params(), rows)  # {} without a tool
        if rows is self.eval_rows and len(rows):
            per_problem = ev.per_problem()
            self.logger.log_problems(self.step, {**per_problem, "samples": ev.sampled.shape[1]} if sampled else
                                     {"greedy_correct": per_problem["greedy_correct"]})
        return {**ev.metrics(), **no_tool}

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Step until cfg.steps, a pausing alarm or a signal; returns {"steps", "wall_seconds", "paused",
        "interrupted"}. The folder's lock is released when it returns or raises."""
        try:
            return self._run()
        finally:
            self.release_lock()

    def _run(self) -> dict:
        """Within `interrupts.caught()`, SIGINT / SIGTERM end the loop after the step they arrive in, which is
        then checkpointed (`_stop`); the export waits for a run that ends by itself."""
        cfg, start_time = self.cfg, time.perf_counter()
        with interrupts.caught(enabled=jax.process_count() == 1) as stop:
            paused, metrics = self._loop(stop)
            if stop.signal:
                self._stop(stop.signal, metrics)
        self.ahead.drop()  # rollouts dispatched for steps this run will not take (a pause, a signal)
        if cfg.checkpoint.export_hf and not paused and not stop.signal:
            hf_dir = os.path.join(self.out_dir, "hf")
            info = export_lib.export_trainer(self, hf_dir)
            if info is not None:
                self.logger.event(self.step, "export", path=hf_dir, tokenizer=info["tokenizer"])
        self.folder.close()
        return {"steps": self.step, "wall_seconds": time.perf_counter() - start_time, "paused": paused,
                "interrupted": stop.signal}

    def _loop(self, stop: interrupts.Stop) -> tuple[bool, dict | None]:
        """The steps, each logged, watched and checkpointed when due, until cfg.steps, a pausing alarm or a
        signal (`stop`); returns (paused, the last step's metrics)."""
        cfg, paused, metrics = self.cfg, False, None
        if self.step == 0 and cfg.logging.eval_every:
            self.logger.log(0, self.evaluate(sampled=sampled_eval_due(cfg, 0)))
        iteration_start = time.perf_counter()
        while self.step < cfg.steps and not paused and not stop.signal:
            out = self.step_once()
            metrics, step = out.metrics, self.step
            if (cfg.logging.eval_every and step % cfg.logging.eval_every == 0) or step == cfg.steps:
                metrics.update(self.evaluate(sampled=sampled_eval_due(cfg, step)))
            self.logger.log(step, metrics, timings=out.timings, histograms=out.histograms)
            if step == 1:  # the first update: a format rate of 0 here is a prompt/reward mismatch, said once
                _warn(self.logger, step, "format_zero", experience.format_zero_warning(metrics))
            self.logger.log_samples(step, experience.logged_samples(out.experience, self.actor.dims,
                                                                    cfg.logging.samples_per_step,
                                                                    advantages_BxG=out.advantages))
            alarms = self.failures.explain(self.monitor.observe(step, metrics))
            paused = monitor.should_pause(alarms)
            if periodic_checkpoint(cfg, step) or step == cfg.steps or paused:
                self.save(metrics)
            monitor.log_alarms(self.logger, self.monitor, self.out_dir, step, alarms, kept=self.ckpt.steps)
            now = time.perf_counter()  # the whole iteration (step, logs, evaluation, checkpoint)
            self.iteration_seconds.append(now - iteration_start)
            iteration_start = now
        return paused, metrics

    def _stop(self, signal_name: str, metrics: dict | None) -> None:
        """A signal ended the loop: checkpoint the step reached (unless it is on disk already: a periodic save,
        or the checkpoint this process resumed from) and log an "interrupted" event. Step 0 has nothing to keep.
        When the next step's rollout was decoded one update behind (rollout.off_policy_steps), the resumed run
        decodes it again with the checkpoint's params (the older ones are not kept): the event says so, since
        the two runs differ from there."""
        step = self.step
        saved = step > 0
        if saved and step not in self.ckpt.steps():
            self.save(metrics)
        self.logger.event(step, "interrupted", signal=signal_name, checkpoint=step if saved else None,
                          message=interrupts.interrupted_line(signal_name, step=step, steps=self.cfg.steps),
                          **({"note": f"rollout.off_policy_steps: --resume decodes step {step}'s rollout with the "
                                      "checkpoint's params (this run had it one update behind); the resumed run "
                                      "differs from an uninterrupted one from there"}
                             if self.ahead.lag(step) else {}))

    def report(self, summary: dict, *, title: str, sections=()) -> tuple[str, str]:
        """Plots, report.md and report.json in the run folder (`RunFolder.report`), with the data's report."""
        return self.folder.report(summary, title=title, sections=sections, data_report=self.data_report)


def step_metrics(cfg: TrainConfig, actor: experience.Actor, metrics: dict, host: dict, pending: Pending, *,
                 coef: float, weights) -> dict:
    """A step's flat metrics: the device's (`metrics`), the host's, the controls' values and the health
    figures the monitor reads. The sampler-trainer gap is measured every logging.gap_every steps: dropped when not."""
    if not metrics.pop("gap/measured", 1.0):
        metrics = {k: v for k, v in metrics.items() if not k.startswith("gap/")}
    metrics.update(host)
    metrics.update({"control/entropy_coef": coef, "control/temperature": pending.temperature})
    metrics.update({f"control/weight/{d}": float(w) for d, w in zip(actor.dims, weights)})
    if cfg.rollout.off_policy_steps:  # later dynamic-sampling rounds are decoded with this step's params
        metrics["rollout/lag"] = pending.lag * host.get("dynamic/first_round_frac", 1.0)
    metrics.update(monitor.health_metrics(metrics, vocab_size=actor.model_cfg.vocab_size))
    return metrics


def _warn(logger, step: int, kind: str, message: str | None) -> None:
    """Log a `kind` event and warn, when there is a message."""
    if message:
        logger.event(step, kind, message=message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def sampled_eval_due(cfg: TrainConfig, step: int) -> bool:
    """Whether the evaluation at `step` also samples (logging.eval_samples at T = 1): first, last, every
    logging.eval_samples_every."""
    every = cfg.logging.eval_samples_every
    return bool(cfg.logging.eval_samples) and (step in (0, cfg.steps) or (every and step % every == 0))


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
    args, cfg = parse_args(argv, description="Run GRPO from a config: python -m grpo_jax.train --out DIR --set ...",
                           get_config=lambda smoke: presets.shrink(TrainConfig()) if smoke else TrainConfig())
    if args.compile_only:
        return aot.compile_only(args, cfg)
    out = out_dir(args)
    trainer = open_trainer(cfg, out, resume=args.resume, quiet=args.quiet, rollback_to=args.rollback_to)
    summary = trainer.run()
    if summary["paused"]:
        monitor.exit_paused(out, summary["steps"])
    if summary["interrupted"]:
        interrupts.exit_interrupted(summary["interrupted"], step=summary["steps"], steps=cfg.steps)
    return summary


if __name__ == "__main__":
    main()
