"""The sign of one GRPO update: a completion with advantage +1 becomes more likely and one with advantage -1
less likely, under the real train step (`grpo_jax.update.make_train_step`, AdamW from `make_optimizer`).

Two different completions of one prompt, in a hand-built `Batch` whose old logprobs are the current
policy's (on-policy, ratio 1, so the PPO clip is inactive). The rows are also given in the other order and
with the advantages the other way round: the effect must follow the advantage, not the row position (a
row/advantage misalignment anywhere in the step, e.g. in the minibatch permutation or the microbatch split,
would move the wrong completion).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import update
from grpo_jax.config import TrainConfig, override
from grpo_jax.experience import Batch

T = 4  # completion tokens
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
COMPLETIONS = {"A": [21, 22, 23, 24], "B": [31, 32, 33, 34]}  # no token in common
MIN_CHANGE = 1e-3  # nats: a sequence logprob move this large is a real effect, not rounding


@pytest.fixture(scope="module")
def model():
    cfg = models.tiny()
    return cfg, models.init_params(cfg, jax.random.key(0))


def _config(*extra: str) -> TrainConfig:
    """Defaults (PPO-clip loss, seq-mean-token-mean, beta 0, AdamW with global-norm clipping 1.0), T new
    tokens, a small learning rate so one step stays in the first-order regime."""
    return override(TrainConfig(), [f"sampling.max_new_tokens={T}", "optim.lr=1e-4", *extra])


def _batch(model_cfg, params, names: tuple[str, ...], advantages: tuple[float, ...]) -> Batch:
    """Rows prompt + COMPLETIONS[name], every completion token trained, old logprobs = the policy's own."""
    tokens = jnp.asarray([PROMPT + COMPLETIONS[n] for n in names], jnp.int32)
    attn = jnp.ones(tokens.shape, bool)
    old_logp, _ = update.completion_logprobs(model_cfg, params, tokens, attn, T, 1.0)
    return Batch(tokens=tokens, attn_mask=attn, loss_mask=jnp.ones((len(names), T), bool), old_logp=old_logp,
                 advantages=jnp.asarray(advantages, jnp.float32), temperatures=jnp.ones((len(names), T), jnp.float32))


def _sequence_logprobs(model_cfg, params, batch: Batch) -> np.ndarray:
    """[N] sum over the completion of log p(token), teacher-forced."""
    logp, _ = update.completion_logprobs(model_cfg, params, batch.tokens, batch.attn_mask, T, 1.0)
    return np.asarray(jnp.sum(logp * batch.loss_mask, axis=-1))


@pytest.mark.parametrize("extra", [(), ("minibatches=2",), ("microbatches=2",)], ids=["one_update", "minibatches",
                                                                                      "microbatches"])
def test_update_follows_the_advantage_not_the_row(model, extra):
    model_cfg, params = model
    cfg = _config(*extra)
    optimizer = update.make_optimizer(cfg)
    step = jax.jit(update.make_train_step(model_cfg, cfg, optimizer))
    # (row order, advantages): A favoured in row 0, B favoured in row 0 (advantages swapped), A favoured
    # in row 1 (rows swapped)
    for names, adv in [(("A", "B"), (1.0, -1.0)), (("A", "B"), (-1.0, 1.0)), (("B", "A"), (-1.0, 1.0))]:
        batch = _batch(model_cfg, params, names, adv)
        state = update.initial_state(cfg, model_cfg, jax.tree.map(jnp.copy, params), optimizer, jax.random.key(0))
        before = _sequence_logprobs(model_cfg, params, batch)
        new_state, metrics = step(state, batch, jax.random.key(1), jnp.float32(0.0))
        assert float(metrics["grad_norm"]) > 0 and float(metrics["skipped"]) == 0
        change = _sequence_logprobs(model_cfg, new_state.params, batch) - before
        print(f"\n{extra} rows {names} advantages {adv}: sequence logprob change {np.round(change, 4)}")
        for name, a, d in zip(names, adv, change):
            assert np.sign(d) == np.sign(a) and abs(d) > MIN_CHANGE, (name, a, d)
