"""What a multi-reward advantage estimator does to the pairs of a group, and what that predicts for training:
the check a multi-reward study passes before it is pre-registered.

Groups of G completions scored on K binary dimensions, R[B, G, K], weights w[K], one dimension the correctness:
- `pair_orderings`: every within-group pair ordered by GRPO's sum (w . r) and by GDPO's per-dimension z-scores
  summed (`advantages.gdpo`'s fused score; its batch step is one affine map for the whole batch, so it keeps
  the order). Counted: the pairs GRPO ties that GDPO orders, the pairs GDPO reverses, and for pairs of one correct
  and one wrong completion which one each estimator puts first. With equal weights GDPO prefers the correct
  completion of a pair the sum ties only when correctness is further from half its group than the other
  dimension is (the z-score of a binary reward steps by 1 / std, and std is symmetric in p and 1 - p).
- `simulate`: a tabular policy per problem, a softmax over the outcome classes (reward vectors) its samples
  showed, started at their observed rates, trained by an estimator's advantages on groups drawn from it. Its
  mean probability of a correct outcome after `steps` updates predicts the direction and the rough size of an
  estimator's effect. It shares nothing between problems and never reaches an outcome a problem's samples did
  not show: a prediction of the mechanism, not of a run's numbers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.advantages import compute_advantages
from grpo_jax.config import AdvantageConfig

# Two fused GDPO scores closer than this are a tie. Each is a float32 sum of K z-scores of magnitude at most
# (G - 1) / sqrt(G) (under 4 for G = 16), so rounding moves it by at most ~K * 4 * 2**-23 ~ 1e-6 for K = 2;
# two genuinely different binary z-score sums differ by at least |1/std(m) - 1/std(m')| over the group's
# possible counts m, ~1.5e-2 for G = 16 (m(16 - m) = 63 against 64). 1e-4 sits between them with room.
TIE_TOL = 1e-4


def fused_scores(rewards_BxGxK: np.ndarray, weights_K: np.ndarray, cfg: AdvantageConfig | None = None) -> np.ndarray:
    """GDPO's per-row score before its batch step: sum_k w_k (r_k - mean_k) / (std_k + eps) per group [B, G]."""
    cfg = cfg or AdvantageConfig(estimator="gdpo")
    _, aux = compute_advantages(jnp.asarray(rewards_BxGxK, jnp.float32), jnp.asarray(weights_K, jnp.float32),
                                cfg=dataclasses.replace(cfg, estimator="gdpo"))
    return np.asarray(aux["scores"], np.float64)


def _signs(x_BxG: np.ndarray, tol: float) -> np.ndarray:
    """sign(x_i - x_j) for every pair i < j of each group, [B, G(G-1)/2]; |difference| <= tol is 0."""
    i, j = np.triu_indices(x_BxG.shape[1], k=1)
    d = x_BxG[:, i] - x_BxG[:, j]
    return np.where(np.abs(d) <= tol, 0, np.sign(d)).astype(np.int8)


def pair_orderings(rewards_BxGxK, weights_K, *, correct: int = 0, cfg: AdvantageConfig | None = None) -> dict:
    """Shares of within-group pairs as GRPO (the weighted sum) and GDPO (the fused z-scores) order them.

    `pairs`: all within-group pairs; `grpo_ties`, `gdpo_orders_a_grpo_tie`, `reversed` (the two strictly
    disagree): shares of all pairs. `mixed`: pairs of one correct and one wrong completion (dimension `correct`
    = 1 against 0), as a share of all pairs; `mixed_grpo_ties`, `mixed_grpo_prefers_wrong`: shares of the mixed
    pairs; `tie_gdpo_prefers_correct` / `tie_gdpo_prefers_wrong`: shares of the mixed pairs GRPO ties, by which
    completion GDPO puts first; `gdpo_prefers_wrong`: share of mixed pairs GDPO puts the wrong one first."""
    r = np.asarray(rewards_BxGxK, np.float64)
    w = np.asarray(weights_K, np.float64)
    grpo = _signs(r @ w, 0.0)  # exact: sums of binary rewards times the weights, in float64
    gdpo = _signs(fused_scores(r, w, cfg), TIE_TOL)
    c = _signs(r[..., correct], 0.0)  # +1: the first of the pair is the correct one
    mixed = c != 0
    tie = grpo == 0
    n_mixed, n_mixed_tie = int(mixed.sum()), int((mixed & tie).sum())
    share = lambda n, d: float(n) / d if d else float("nan")  # noqa: E731
    return {
        "pairs": int(grpo.size),
        "grpo_ties": share(tie.sum(), grpo.size),
        "gdpo_orders_a_grpo_tie": share((tie & (gdpo != 0)).sum(), grpo.size),
        "reversed": share((grpo * gdpo < 0).sum(), grpo.size),
        "mixed": share(n_mixed, grpo.size),
        "mixed_grpo_ties": share(n_mixed_tie, n_mixed),
        "mixed_grpo_prefers_wrong": share((mixed & (grpo * c < 0)).sum(), n_mixed),
        "tie_gdpo_prefers_correct": share((mixed & tie & (gdpo * c > 0)).sum(), n_mixed_tie),
        "tie_gdpo_prefers_wrong": share((mixed & tie & (gdpo * c < 0)).sum(), n_mixed_tie),
        "gdpo_prefers_wrong": share((mixed & (gdpo * c < 0)).sum(), n_mixed),
    }


def outcome_classes(rewards_PxNxK: np.ndarray, smoothing: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(classes [C, K]: every reward vector seen on any problem, probs [P, C]: each problem's observed rate of
    each class, `smoothing` added to the classes the problem showed and nothing to those it did not)."""
    r = np.asarray(rewards_PxNxK)
    classes, index = np.unique(r.reshape(-1, r.shape[-1]), axis=0, return_inverse=True)
    counts = np.zeros((r.shape[0], len(classes)))
    np.add.at(counts, (np.repeat(np.arange(r.shape[0]), r.shape[1]), index.reshape(-1)), 1.0)
    counts = np.where(counts > 0, counts + smoothing, 0.0)
    return classes.astype(np.float32), counts / counts.sum(axis=1, keepdims=True)


@functools.partial(jax.jit, static_argnames=("cfg", "steps", "group"))
def _simulate(logits_PxC, classes_CxK, weights_K, key, lr, *, cfg: AdvantageConfig, steps: int, group: int):
    def step(logits, k):
        draws = jax.random.categorical(k, logits[:, None, :], axis=-1, shape=(logits.shape[0], group))  # [P, G]
        adv, _ = compute_advantages(classes_CxK[draws], weights_K, cfg=cfg)  # [P, G]
        probs = jax.nn.softmax(logits, axis=-1)
        onehot = jax.nn.one_hot(draws, logits.shape[1])
        grad = jnp.mean(adv[..., None] * (onehot - probs[:, None, :]), axis=1)  # d/dlogits of mean_g A log pi
        return logits + lr * grad, None

    logits, _ = jax.lax.scan(step, logits_PxC, jax.random.split(key, steps))
    return jax.nn.softmax(logits, axis=-1)


def simulate(probs_PxC: np.ndarray, classes_CxK: np.ndarray, weights_K, *, estimator: str, lr: float, steps: int,
             group: int, seed: int, reward_of=None) -> np.ndarray:
    """The tabular policies [P, C] after `steps` updates of `lr` on groups of `group` draws per problem, every
    problem in every step's batch. reward_of: classes [C, K] -> the rewards the estimator sees [C, K'] (e.g. a
    conditioned reward); default the classes themselves."""
    probs = np.asarray(probs_PxC, np.float64)
    logits = np.where(probs > 0, np.log(np.where(probs > 0, probs, 1.0)), -1e9).astype(np.float32)
    seen = np.asarray(classes_CxK if reward_of is None else reward_of(classes_CxK), np.float32)
    out = _simulate(jnp.asarray(logits), jnp.asarray(seen), jnp.asarray(weights_K, jnp.float32),
                    jax.random.key(seed), jnp.float32(lr), cfg=AdvantageConfig(estimator=estimator), steps=steps,
                    group=group)
    return np.asarray(out, np.float64)


def rate(probs_PxC: np.ndarray, classes_CxK: np.ndarray, dim: int) -> float:
    """Mean over problems of the probability that dimension `dim` is satisfied."""
    return float(np.mean(np.asarray(probs_PxC) @ (np.asarray(classes_CxK)[:, dim] > 0)))


def calibrate_lr(probs_PxC, classes_CxK, *, correct: int, gain: float, steps: int, group: int, seed: int,
                 lo: float = 1e-3, hi: float = 100.0, iters: int = 30) -> float:
    """The lr at which GRPO on the correctness dimension alone raises the mean probability of a correct outcome
    by `gain` in `steps` updates (bisection in log space; the gain grows with lr). Raises ValueError when
    `gain` is out of reach within [lo, hi]."""
    only_correct = lambda c: c[:, correct:correct + 1]  # noqa: E731
    start = rate(probs_PxC, classes_CxK, correct)

    def gained(lr):
        p = simulate(probs_PxC, classes_CxK, [1.0], estimator="grpo", lr=lr, steps=steps, group=group, seed=seed,
                     reward_of=only_correct)
        return rate(p, classes_CxK, correct) - start

    if not gained(lo) <= gain <= gained(hi):
        raise ValueError(f"calibrate_lr: a gain of {gain:.3f} is not reached between lr {lo} and {hi}")
    for _ in range(iters):
        mid = float(np.sqrt(lo * hi))
        lo, hi = (mid, hi) if gained(mid) < gain else (lo, mid)
    return float(np.sqrt(lo * hi))
