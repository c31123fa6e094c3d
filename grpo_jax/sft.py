"""Supervised warm start: teach the task's ideal formatted completions until a validation target is met.

GRPO cannot lift a model that never solves a problem (every group all-wrong, zero advantage), so the
default experiment first supervises a from-scratch model on `task.solution(row)` and stops as soon as
greedy accuracy on a validation split (never the held-out split the report uses) reaches a weak baseline.
Stopping on accuracy rather than a step count matters: the jump from ~1% to ~30% happens at a
seed-dependent step (on 3-digit addition at batch 128, measured at 375, 600 and 700 steps for three
seeds).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import data, evaluation, experience, sampler
from grpo_jax.update import completion_logprobs


def sft_batch(actor: experience.Actor, targets, rows, n_completion: int):
    """(tokens [B, P+T], attention mask, loss mask [B, T]) for prompt + target completion + EOS; the prompts
    as rollouts feed them (`experience.prompt_arrays`: the prompt limit applies)."""
    tokenizer = actor.tokenizer
    prompt, prompt_mask = sampler.prepare_prompts(*experience.prompt_arrays(actor, rows), pad_id=tokenizer.pad_id)
    target, target_mask = data.encode_completions(tokenizer, targets, width=n_completion)
    tokens = jnp.concatenate([prompt, jnp.asarray(target)], axis=1)
    attn = jnp.concatenate([prompt_mask, jnp.asarray(target_mask)], axis=1)
    return tokens, attn, jnp.asarray(target_mask)


def make_sft_step(model_cfg, optimizer: optax.GradientTransformation, n_completion: int):
    """Jitted (params, opt_state, tokens, attn, loss_mask) -> (params, opt_state, token-mean NLL)."""
    def loss_fn(params, tokens, attn, loss_mask):
        logp, _ = completion_logprobs(model_cfg, params, tokens, attn, n_completion, 1.0)
        return -jnp.sum(logp * loss_mask) / jnp.maximum(jnp.sum(loss_mask), 1.0)

    def step(params, opt_state, tokens, attn, loss_mask):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, attn, loss_mask)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def warm_start(actor: experience.Actor, params, rows, valid_rows, *, solution, target_accuracy: float,
               max_steps: int, batch_size: int = 128, lr: float = 1e-3, eval_every: int = 25, seed: int = 0,
               log=print) -> tuple[object, dict]:
    """Supervise `params` on `solution(row)` for random training rows until greedy validation accuracy >=
    target (or max_steps). `solution(row)` is the completion text, or a list of every valid one (a task
    with several solution paths), of which each draw supervises one at random, so the warm-started policy
    spreads over the solutions instead of learning one template. Returns (the new params, a summary with
    the accuracy curve); install them with `Trainer.set_params`. `params` are donated: do not reuse them."""
    n = actor.sampling.max_new_tokens
    optimizer = optax.adamw(lr)
    opt_state = optimizer.init(params)
    step_fn = make_sft_step(actor.model_cfg, optimizer, n)
    rng = np.random.default_rng([seed, 1])  # the warm start's own stream: GRPO's cursor is untouched
    curve, start, acc, step = [], time.perf_counter(), 0.0, 0
    while step < max_steps:
        batch = [rows[i] for i in rng.integers(0, len(rows), batch_size)]
        targets = [_target(solution(r), rng) for r in batch]
        params, opt_state, loss = step_fn(params, opt_state, *sft_batch(actor, targets, batch, n))
        step += 1
        if step % eval_every == 0 or step == max_steps:
            acc = evaluation.evaluate(actor, params, valid_rows)["eval/accuracy"]
            curve.append({"step": step, "loss": float(loss), "valid_accuracy": acc})
            log(f"warm start step {step}: loss {float(loss):.3f}, validation accuracy {acc:.3f}")
            if acc >= target_accuracy:
                break
    summary = {"sft_steps": step, "sft_valid_accuracy": acc, "sft_seconds": time.perf_counter() - start,
               "sft_curve": curve}
    return params, summary


def _target(solution: str | Sequence[str], rng: np.random.Generator) -> str:
    """One completion to supervise: the solution, or one of several picked at random (no draw is taken
    for a single solution, so a task with one keeps its stream)."""
    if isinstance(solution, str):
        return solution
    return solution[int(rng.integers(len(solution)))] if len(solution) > 1 else solution[0]
