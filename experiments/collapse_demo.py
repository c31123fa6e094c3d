"""Reward-collapse demo: how each advantage estimator treats an easy and a hard reward dimension.

    python experiments/collapse_demo.py --seed 0

Random multi-reward batches (CPU, seconds): an easy "format" dimension (mostly 1, high weight), a hard
"correct" dimension (rare; binary or graded) and optionally a third "length" dimension. For every
estimator it prints, as a markdown table, the collapse ratio (distinct reward vectors / distinct advantage
values, summed over groups; 1 = no collapse, see grpo_jax/diagnostics.py), the mean number of distinct
advantages per group, and the Pearson correlation of each reward dimension with the advantage.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.advantages import ESTIMATORS, compute_advantages, weighted_total
from grpo_jax.config import AdvantageConfig
from grpo_jax.diagnostics import reward_diagnostics


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str  # row label
    weights: tuple[float, float, float]  # (format, correct, length); length weight 0 = dimension absent (NaN)
    graded: bool  # correctness in {0, .25, .5, .75, 1} instead of {0, 1}


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    seed: int = 0  # run key = PRNGKey(seed); each scenario folds in its index
    num_prompts: int = 256  # B
    group_size: int = 8  # G
    format_rate: float = 0.9  # P(format ok): the easy dimension
    correct_alpha: float = 0.5  # per-prompt solve rate ~ Beta(alpha, beta): mean 1/8, many unsolved prompts
    correct_beta: float = 3.5
    scenarios: tuple[Scenario, ...] = (
        Scenario("binary w=(1,1)", (1.0, 1.0, 0.0), graded=False),
        Scenario("graded w=(2,1)", (2.0, 1.0, 0.0), graded=True),
        Scenario("3 dims w=(2,1,.5)", (2.0, 1.0, 0.5), graded=True),
    )


def get_config() -> DemoConfig:
    return DemoConfig()


def sample_rewards(cfg: DemoConfig, scenario: Scenario, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rewards [B, G, 3] (format, correct, length; length NaN = missing when its weight is 0), weights [3]."""
    k_fmt, k_rate, k_correct, k_partial, k_credit, k_len = jax.random.split(key, 6)
    shape = (cfg.num_prompts, cfg.group_size)
    fmt = jax.random.bernoulli(k_fmt, cfg.format_rate, shape).astype(jnp.float32)
    rate_Bx1 = jax.random.beta(k_rate, cfg.correct_alpha, cfg.correct_beta, (cfg.num_prompts, 1))
    correct = jax.random.bernoulli(k_correct, rate_Bx1, shape).astype(jnp.float32)
    if scenario.graded:  # partial credit (0, .25, .5 or .75) for 30% of the wrong answers
        partial = jax.random.randint(k_partial, shape, 0, 4) / 4.0 * jax.random.bernoulli(k_credit, 0.3, shape)
        correct = jnp.where(correct > 0, 1.0, partial)
    length = jnp.clip(jax.random.randint(k_len, shape, 0, 3) / 2.0 + 0.25 * (fmt - 1.0), 0.0, 1.0)
    length = jnp.where(scenario.weights[2] > 0, length, jnp.nan)
    return jnp.stack([fmt, correct, length], axis=-1), jnp.asarray(scenario.weights, jnp.float32)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=get_config().seed)
    cfg = dataclasses.replace(get_config(), seed=parser.parse_args(argv).seed)
    key = jax.random.PRNGKey(cfg.seed)
    advantages = jax.jit(compute_advantages, static_argnames="cfg")
    diagnostics = jax.jit(reward_diagnostics)
    print(f"B={cfg.num_prompts} prompts x G={cfg.group_size}, seed {cfg.seed}; corr = Pearson(r_k, A)\n")
    columns = ("scenario", "estimator", "collapse ratio", "distinct A / group", "corr format", "corr correct",
               "corr length")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for index, scenario in enumerate(cfg.scenarios):
        rewards, weights = sample_rewards(cfg, scenario, jax.random.fold_in(key, index))
        for name in ESTIMATORS:
            adv, _ = advantages(rewards, weights, cfg=AdvantageConfig(estimator=name))
            out = diagnostics(rewards, weighted_total(rewards, weights), adv)
            corr = [f"{float(c):+.3f}" for c in out["reward/adv_corr"]]
            corr[2] = corr[2] if scenario.weights[2] > 0 else "-"
            distinct = float(jnp.mean(out["adv/distinct_per_group"]))
            ratio = float(out["collapse/ratio"])
            print(f"| {scenario.name} | {name} | {ratio:.3f} | {distinct:.2f} | " + " | ".join(corr) + " |")


if __name__ == "__main__":
    main()
