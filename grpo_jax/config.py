"""Frozen, validated configs for everything a run reads: the GRPO maths (advantage estimation, the policy
loss), the training controls (entropy coefficient, temperature, reward weights), the alarms, and the run.

Every field is checked in ``__post_init__`` through shared helpers (``_fail``, ``_check_choice``,
``is_finite_number``); an invalid value raises ``ValueError`` naming the class and field.
This module is the ground floor: it imports nothing from the package (nor jax; from ``models`` only the
option lists of ``models.config``), so the code that reads a config never has to be imported to build one.

Each list of names validated here is defined here, once, and the module that implements the names reads
it from here instead of copying it (``registry`` fails at import when a listed name has no implementation
or an implementation is not listed). ``REMAT_MODES`` and ``LORA_TARGETS`` are the model's own options:
they live in ``models.config`` (the floor below, imported here without jax) and are read from there.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import math
import numbers
import re
import types
import typing
from collections.abc import Mapping

from models.config import LORA_TARGETS, REMAT_MODES

ADVANTAGE_ESTIMATORS = (
    "grpo",  # weighted sum over K, then group z-score (DeepSeekMath; TRL sum_then_normalize)
    "grpo_batch_std",  # group mean, batch std (TRL scale_rewards="batch")
    "drgrpo",  # group mean only, no std (Dr. GRPO)
    "rloo",  # leave-one-out baseline, G/(G-1) (R - mean)
    "reinforce_pp_baseline",  # group mean, then batch whitening (REINFORCE++-baseline)
    "gdpo",  # per-dimension group z-score, weighted sum, batch z-score (GDPO)
    "per_dim",  # per-dimension group z-score, weighted sum, no batch step
    "passk",  # pass@k advantage of binary outcomes (Chen et al. 2025; verl _calc_passk_adv)
)
POLICY_LOSSES = (  # the keys of grpo_jax.losses.POLICY_LOSSES, in this order
    "ppo",  # PPO-clip / GRPO token ratio pi_theta / pi_old
    "vanilla",  # verl's name for "ppo" (the same function)
    "gspo",  # sequence-level length-normalised ratio, clipped per sequence (GSPO)
    "gspo_token",  # GSPO's sequence ratio with a per-token gradient (GSPO-token)
    "clip_cov",  # PPO-clip, gradient detached on a few high-covariance tokens (Clip-Cov)
    "kl_cov",  # no clip; |log ratio| penalty on the top-covariance tokens (KL-Cov)
    "cispo",  # clipped, stop-gradient IS weight x log pi_theta (CISPO, MiniMax-M1)
    "sapo",  # soft sigmoid gate instead of the hard clip (SAPO)
    "gmpo",  # geometric mean of the token ratios, log-ratio clipped (GMPO)
    "dppo_tv",  # -A rho inside a binary total-variation trust region (DPPO)
    "dppo_kl",  # -A rho inside a binary-KL trust region (DPPO)
)
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
# Row formats of data files: "auto", then the keys of grpo_jax.tasks.adapters.FORMATS (columns and native rows:
# its module docstring) in detection order: "auto" takes the first of them whose columns a row has.
ROW_FORMATS = ("auto", "humaneval", "mbpp", "mcq", "arc", "gsm8k", "math", "translation", "wmt", "prompt_answer")
CHAT_MODES = ("auto", "always", "never")  # which rows get the chat template (grpo_jax.tasks.chat reads this)
# Prompt cleaning: grpo_jax.rewards.sanitize.ACTIONS is this list without "off" (no cleaning at all).
SANITIZE_ACTIONS = ("strip", "drop", "flag", "off")
# What happens to a prompt longer than sampling.max_prompt_tokens (grpo_jax.data.limit_prompt_lengths): the row
# is left out of the data, or its tokens are cut from the left, keeping the end of the prompt (as TRL does).
LONG_PROMPT_ACTIONS = ("drop", "truncate_left")

# Clip ranges used when eps_low / eps_high are left as None.
_PPO_EPS = (0.2, 0.2)  # PPO / GRPO / verl clip_ratio default
_GSPO_EPS = (3e-4, 4e-4)  # GSPO paper v2 §5.1
# eps_low / eps_high defaults per policy loss where they differ from _PPO_EPS (what each means: docs/algorithms.md §4)
_LOSS_EPS = {
    "gspo": _GSPO_EPS, "gspo_token": _GSPO_EPS,
    "cispo": (1.0, 4.0),  # IS weight clipped to [0, 5]: no lower bound (MiniMax-M1), eps_max 5 (ScaleRL; TRL docs)
    "gmpo": (0.4, 0.4),  # log-ratio clipped to [-0.4, 0.4] (GMPO paper §4; verl geo_mean with clip_ratio 0.4)
    "dppo_tv": (0.2, 0.2),  # binary-TV trust region delta (prime-rl dppo_mask_low / dppo_mask_high defaults)
    "dppo_kl": (0.2, 0.2),  # binary-KL trust region delta (verl dppo_kl reads the same clip_ratio_low / _high)
}


class UserError(ValueError):
    """A problem in the user's config, data or folders; the message names the key, file, row or folder and
    says what to do (a command line prints it as one line: `cli.for_people`). A ValueError, so code that
    catches those keeps working."""


def _fail(cls: str, field: str, msg: str) -> None:
    raise ValueError(f"{cls}.{field}: {msg}")


def _at_least(obj: typing.Any, fields: tuple[str, ...], lo: int, why: str = "") -> None:
    """Each of `fields` of the config `obj` must be >= lo (`why`: what the bound means, for the message)."""
    for f in fields:
        value = getattr(obj, f)
        if value < lo:
            _fail(type(obj).__name__, f, f"must be >= {lo}{why}, got {value}")


def _check_choice(cls: str, field: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        _fail(cls, field, f"unknown value {value!r}; known: {', '.join(known)}")


def is_finite_number(x) -> bool:
    """Whether x is a number that is finite as a float (an int beyond float range, e.g. 10**400, is not)."""
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def registry(kind: str, names: tuple[str, ...], found: Mapping[str, typing.Any]) -> dict[str, typing.Any]:
    """`found` (name -> implementation) in the order of `names`, the list of `kind` names defined here.

    The implementing module calls it at import, so a listed name with no implementation, or an
    implementation under a name not listed, fails on import instead of when a run asks for it."""
    missing = [n for n in names if n not in found]
    unlisted = [n for n in found if n not in names]
    if missing or unlisted:
        raise ValueError(f"{kind} names differ from grpo_jax.config's list {names}: not implemented {missing}, "
                         f"not listed {unlisted}")
    return {n: found[n] for n in names}


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """How rewards R[B, G, K] and weights w[K] become advantages A[B, G]."""

    estimator: str = "grpo"  # one of ADVANTAGE_ESTIMATORS
    std_ddof: int = 1  # 1 = Bessel-corrected std as torch.std in TRL, verl, tunix GRPO; 0 = population std
    eps: float = 1e-6  # added to the group std: 1e-6 matches verl compute_grpo_outcome_advantage and tunix
    batch_norm_eps: float = 1e-4  # added to the batch std (gdpo, rpp baseline, grpo_batch_std): TRL, NVlabs GDPO
    pass_k: int = 2  # passk: the k of pass@k (k = 1 is GRPO with the population std)
    pass_threshold: float = 1.0  # passk: a row is a success when its weighted total reaches this
    pos_scale: float = 1.0  # W-REINFORCE (Zhu et al. 2025): positive advantages x this; 1 = off, 0 = negatives only

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_choice(name, "estimator", self.estimator, ADVANTAGE_ESTIMATORS)
        if self.std_ddof not in (0, 1):
            _fail(name, "std_ddof", f"must be 0 or 1, got {self.std_ddof!r}")
        if not self.eps >= 0.0:
            _fail(name, "eps", f"must be >= 0, got {self.eps!r}")
        if not self.batch_norm_eps >= 0.0:
            _fail(name, "batch_norm_eps", f"must be >= 0, got {self.batch_norm_eps!r}")
        if not (isinstance(self.pass_k, int) and self.pass_k >= 1):
            _fail(name, "pass_k", f"must be an int >= 1, got {self.pass_k!r}")
        if not (is_finite_number(self.pos_scale) and 0.0 <= self.pos_scale <= 1.0):
            _fail(name, "pos_scale", f"must be a number in [0, 1], got {self.pos_scale!r}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Per-token policy loss, KL to the reference and the aggregation into (numerator, denominator).

    eps_low / eps_high = None are resolved in ``__post_init__`` from policy_loss; ``dataclasses.replace``
    then keeps the resolved numbers, so pass eps_low=None, eps_high=None again when switching loss family.
    """

    policy_loss: str = "ppo"  # one of POLICY_LOSSES ("vanilla" is verl's name for "ppo")
    eps_low: float | None = None  # lower clip 1-eps_low; None -> the loss's default (_LOSS_EPS; else 0.2)
    eps_high: float | None = None  # upper clip 1+eps_high; None -> the loss's default; DAPO clip-higher 0.28
    dual_clip_c: float | None = None  # dual-clip bound for A<0 (loss <= -c*A); None = off, verl uses 3.0
    log_ratio_clamp: float = 20.0  # |log ratio| clamp before exp, as verl (also the k3 log-ratio clamp)
    agg_mode: str = "seq-mean-token-mean"  # one of AGG_MODES; GRPO paper default
    max_len_norm: int | None = None  # L of seq-mean-token-sum-norm (max completion length); required there
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS (Schulman); k3 as GRPO paper
    kl_clamp: float = 10.0  # k3 value clamp to [-kl_clamp, kl_clamp], as verl low_var_kl
    beta: float = 0.0  # KL coefficient in the loss; 0 = no KL term (DAPO, Dr. GRPO)
    clip_cov_ratio: float = 2e-4  # Clip-Cov: fraction r of valid tokens whose gradient is detached
    clip_cov_lb: float = 1.0  # Clip-Cov: lower covariance bound omega_low
    clip_cov_ub: float = 5.0  # Clip-Cov: upper covariance bound omega_high
    kl_cov_ratio: float = 2e-4  # KL-Cov: fraction k of valid tokens (top covariance) that get the KL penalty
    kl_cov_coef: float = 1.0  # KL-Cov: coefficient of |log ratio| on the selected tokens (verl ppo_kl_coef)
    top_entropy_quantile: float = 1.0  # fraction rho of highest-entropy tokens trained on (as TRL); 1.0 = all
    mask_truncated: bool = False  # completions cut at max_new_tokens (no EOS) add nothing to the loss (TRL)
    sapo_tau_pos: float = 1.0  # SAPO gate temperature for A > 0 (SAPO paper; TRL sapo_temperature_pos)
    sapo_tau_neg: float = 1.05  # SAPO gate temperature for A <= 0 (TRL sapo_temperature_neg)
    # Sampler-trainer corrections, rho_s = pi_old / pi_sampler per token (pi_old: the trainer's teacher-forced
    # logprobs before the update, so all but opsm_delta / kl_is need sampling.old_logp_source=recompute).
    # All off by default: the default run's gap is ~1e-6 in float32 (docs/algorithms.md §4.10).
    tis_cap: float | None = None  # token truncated IS: policy loss x min(rho_s, C) (TRL token_truncate, C 3)
    icepop: tuple | None = None  # (C_low, C_high): masked IS, weight rho_s inside, 0 outside (IcePop: 0.5, 5)
    seq_mask: tuple | None = None  # (low, high): rows whose geometric-mean rho_s is outside masked (verl geometric)
    opsm_delta: float | None = None  # rows with A < 0 and mean(log pi_sampler - log pi_theta) > delta masked
    kl_is: bool = False  # KL term x pi_theta / pi_sampler (DeepSeek-V3.2 unbiased KL; TRL use_bias_correction_kl)
    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_choice(name, "policy_loss", self.policy_loss, POLICY_LOSSES)
        _check_choice(name, "agg_mode", self.agg_mode, AGG_MODES)
        _check_choice(name, "kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        default_low, default_high = _LOSS_EPS.get(self.policy_loss, _PPO_EPS)
        if self.eps_low is None:
            object.__setattr__(self, "eps_low", default_low)
        if self.eps_high is None:
            object.__setattr__(self, "eps_high", default_high)
        if not 0.0 <= self.eps_low <= 1.0:  # 1: no lower bound (ratios are >= 0)
            _fail(name, "eps_low", f"must be in [0, 1], got {self.eps_low!r}")
        if not self.eps_high >= 0.0:
            _fail(name, "eps_high", f"must be >= 0, got {self.eps_high!r}")
        if self.dual_clip_c is not None and not self.dual_clip_c > 1.0:
            _fail(name, "dual_clip_c", f"must be None or > 1, got {self.dual_clip_c!r}")
        if not self.log_ratio_clamp > 0.0:
            _fail(name, "log_ratio_clamp", f"must be > 0, got {self.log_ratio_clamp!r}")
        if self.agg_mode == "seq-mean-token-sum-norm":
            if not isinstance(self.max_len_norm, int) or self.max_len_norm <= 0:
                msg = f"must be a positive int for agg_mode={self.agg_mode!r}, got {self.max_len_norm!r}"
                _fail(name, "max_len_norm", msg)
        if not self.kl_clamp > 0.0:
            _fail(name, "kl_clamp", f"must be > 0, got {self.kl_clamp!r}")
        if not self.beta >= 0.0:
            _fail(name, "beta", f"must be >= 0, got {self.beta!r}")
        for field in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0.0 < getattr(self, field) <= 1.0:
                _fail(name, field, f"must be in (0, 1], got {getattr(self, field)!r}")
        if not self.clip_cov_lb < self.clip_cov_ub:
            _fail(name, "clip_cov_ub", f"must be > clip_cov_lb={self.clip_cov_lb!r}, got {self.clip_cov_ub!r}")
        if not self.kl_cov_coef >= 0.0:
            _fail(name, "kl_cov_coef", f"must be >= 0, got {self.kl_cov_coef!r}")
        if not 0.0 < self.top_entropy_quantile <= 1.0:
            _fail(name, "top_entropy_quantile", f"must be in (0, 1], got {self.top_entropy_quantile!r}")
        for field in ("sapo_tau_pos", "sapo_tau_neg"):
            if not getattr(self, field) > 0.0:
                _fail(name, field, f"must be > 0, got {getattr(self, field)!r}")
        if self.tis_cap is not None and not self.tis_cap > 0.0:
            _fail(name, "tis_cap", f"must be None or > 0, got {self.tis_cap!r}")
        for field in ("icepop", "seq_mask"):
            bounds = getattr(self, field)
            if bounds is None:
                continue
            if not (isinstance(bounds, (tuple, list)) and len(bounds) == 2
                    and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
                    and 0.0 <= bounds[0] < bounds[1]):
                _fail(name, field, f"must be None or [low, high] with 0 <= low < high, got {bounds!r}")
            object.__setattr__(self, field, (float(bounds[0]), float(bounds[1])))
        if self.opsm_delta is not None and not self.opsm_delta >= 0.0:
            _fail(name, "opsm_delta", f"must be None or >= 0, got {self.opsm_delta!r}")

    @property
    def corrects_gap(self) -> bool:
        """Whether a correction needs pi_old / pi_sampler (the trainer's logprobs beside the sampler's)."""
        return self.tis_cap is not None or self.icepop is not None or self.seq_mask is not None


# --------------------------------------------------------------------------------------------------
# Training controls (read by grpo_jax.control): entropy-bonus coefficient, rollout temperature,
# reward-weight curriculum
# --------------------------------------------------------------------------------------------------

ENTROPY_COEF_MODES = ("constant", "warmup", "adaptive")
ADAPT_RULES = ("multiplicative", "additive")


@dataclasses.dataclass(frozen=True)
class EntropyCoefConfig:
    """The coefficient c(step) of the entropy bonus (loss -= c * H)."""

    mode: str = "constant"  # one of ENTROPY_COEF_MODES
    coef: float = 0.0  # constant value; warmup target; adaptive starting value
    warmup_start: int = 0  # warmup: c = 0 for step <= warmup_start ...
    warmup_steps: int = 0  # ... then linear to coef, reached at warmup_start + warmup_steps (0 = jump)
    target_entropy: float = 0.3  # adaptive: mean token entropy (nats) to steer toward
    adapt_rate: float = 0.05  # adaptive: factor (1 + rate) per step, or the absolute step when additive
    adapt: str = "multiplicative"  # one of ADAPT_RULES
    min_coef: float = 0.0  # adaptive: lower bound
    max_coef: float = 0.05  # adaptive: upper bound

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_choice(name, "mode", self.mode, ENTROPY_COEF_MODES)
        _check_choice(name, "adapt", self.adapt, ADAPT_RULES)
        for field in ("coef", "target_entropy", "adapt_rate", "min_coef", "max_coef"):
            if not is_finite_number(getattr(self, field)) or getattr(self, field) < 0:
                _fail(name, field, f"must be a finite number >= 0, got {getattr(self, field)!r}")
        for field in ("warmup_start", "warmup_steps"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 0:
                _fail(name, field, f"must be an int >= 0, got {getattr(self, field)!r}")
        if self.mode == "adaptive":
            if not self.min_coef <= self.coef <= self.max_coef:
                _fail(name, "coef", f"must lie in [min_coef, max_coef] = [{self.min_coef}, {self.max_coef}], "
                                    f"got {self.coef!r}")
            if self.adapt == "multiplicative" and self.coef == 0:
                _fail(name, "coef", "must be > 0 with multiplicative adaptation (0 * factor stays 0)")
            if not self.adapt_rate > 0:
                _fail(name, "adapt_rate", f"must be > 0 in adaptive mode, got {self.adapt_rate!r}")


TEMPERATURE_MODES = ("fixed", "adaptive")


@dataclasses.dataclass(frozen=True)
class TemperatureConfig:
    """Rollout temperature, optionally steered by the rollouts' mean token entropy."""

    mode: str = "fixed"  # one of TEMPERATURE_MODES; the base temperature is sampling.temperature
    min_temp: float = 0.5  # lower bound (only reached when entropy_ceiling is set)
    max_temp: float = 1.5  # upper bound
    entropy_floor: float = 0.1  # window-mean entropy (nats) under this raises the temperature
    entropy_ceiling: float | None = None  # window-mean entropy above this lowers it (None = never below base)
    hysteresis: float = 0.05  # return toward base only once entropy is past floor + h (ceiling - h)
    step_up: float = 0.05  # temperature increment per update
    step_down: float = 0.05  # temperature decrement per update
    window: int = 5  # number of recent rollouts averaged

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_choice(name, "mode", self.mode, TEMPERATURE_MODES)
        for field in ("min_temp", "max_temp", "entropy_floor", "hysteresis", "step_up", "step_down"):
            if not is_finite_number(getattr(self, field)) or getattr(self, field) < 0:
                _fail(name, field, f"must be a finite number >= 0, got {getattr(self, field)!r}")
        if not 0 < self.min_temp <= self.max_temp:
            _fail(name, "min_temp", f"need 0 < min_temp <= max_temp, got {self.min_temp}, {self.max_temp}")
        if self.entropy_ceiling is not None and not self.entropy_ceiling > self.entropy_floor + 2 * self.hysteresis:
            _fail(name, "entropy_ceiling", f"must be None or > entropy_floor + 2 * hysteresis, "
                                           f"got {self.entropy_ceiling!r}")
        if not isinstance(self.window, int) or self.window < 1:
            _fail(name, "window", f"must be an int >= 1, got {self.window!r}")


@dataclasses.dataclass(frozen=True)
class RewardWeightsConfig:
    """Reward-weight curriculum and hot-reload file.

    Effective weight of dimension k at step s: ``w_k(s) = file_or_base_k * m_k(s)``. The weights file
    (JSON {dimension: weight}) overrides the base weights for the dimensions it names; the curriculum
    *multiplies*, so m_k is a 0..1 ramp (or any factor) and a re-tuned file weight keeps its ramp.
    m_k is piecewise-linear through the (step, factor) points, flat before the first and after the last;
    dimensions without a schedule have m_k = 1.
    """

    schedule: tuple = ()  # ((dimension, ((step, factor), ...)), ...); e.g. (("quality", ((0, 0.), (200, 1.))),)
    weights_file: str = ""  # JSON {dimension: weight}, re-read when its content changes; "" = none
    allow_negative: tuple = ()  # dimensions whose file weight may be < 0 (those with a negative base also may)

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.weights_file, str):
            _fail(name, "weights_file", f"must be a path string, got {self.weights_file!r}")
        if not all(isinstance(d, str) for d in self.allow_negative):
            _fail(name, "allow_negative", f"must be dimension names, got {self.allow_negative!r}")
        object.__setattr__(self, "allow_negative", tuple(self.allow_negative))
        object.__setattr__(self, "schedule", tuple(_parse_schedule_entry(e) for e in self.schedule))
        dims = [d for d, _ in self.schedule]
        if len(set(dims)) != len(dims):
            _fail(name, "schedule", f"a dimension is scheduled twice: {dims}")


def _parse_schedule_entry(entry) -> tuple[str, tuple[tuple[int, float], ...]]:
    """(dim, points) with int steps strictly increasing and finite factors >= 0; lists accepted (JSON)."""
    bad = f"entries must be (dimension, ((step, factor), ...)), got {entry!r}"
    if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not isinstance(entry[0], str):
        _fail("RewardWeightsConfig", "schedule", bad)
    dim, points = entry
    try:
        pts = tuple((int(s), float(w)) for s, w in points)
        integral = all(s == raw_s for (s, _), (raw_s, _) in zip(pts, points))
    except (TypeError, ValueError):
        pts, integral = (), False
    if not pts or not integral:
        _fail("RewardWeightsConfig", "schedule", bad)
    steps = [s for s, _ in pts]
    if steps != sorted(set(steps)) or steps[0] < 0:
        _fail("RewardWeightsConfig", "schedule", f"{dim!r}: steps must be >= 0 and strictly increasing, got {steps}")
    if not all(math.isfinite(w) and w >= 0 for _, w in pts):
        _fail("RewardWeightsConfig", "schedule", f"{dim!r}: factors must be finite and >= 0, got {pts}")
    return dim, pts


# --------------------------------------------------------------------------------------------------
# Alarms (read by grpo_jax.monitor)
# --------------------------------------------------------------------------------------------------

ALARM_KINDS = ("below", "above", "drop", "below_first_frac", "nonfinite")
ALARM_ACTIONS = ("warn", "pause")


@dataclasses.dataclass(frozen=True)
class AlarmRule:
    """One condition on one metric.

    below / above: value < / > threshold. drop: relative fall (ref - value) / |ref| > threshold, where ref is
    the value `window` observations earlier (e.g. 0.5 over 20 = entropy halved in 20 steps).
    below_first_frac: value < threshold * the metric's first finite positive observation of the run (e.g.
    0.1 = entropy under a tenth of where RL started). nonfinite: value is NaN/inf, or > threshold (threshold
    0 on a counter such as "skipped" fires on any skip).
    """

    metric: str  # metric name in the trainer's flat dict, e.g. "entropy/mean"
    kind: str  # one of ALARM_KINDS
    threshold: float = math.inf  # see the class docstring; inf suits "nonfinite" on a loss
    action: str = "warn"  # one of ALARM_ACTIONS
    window: int = 20  # drop: look-back in observations of the metric
    patience: int = 1  # consecutive observations the condition must hold before firing
    name: str = ""  # identifier in state and reports; "" = derived from the fields

    def __post_init__(self) -> None:
        cls = type(self).__name__
        if not isinstance(self.metric, str) or not self.metric:
            _fail(cls, "metric", f"must be a non-empty metric name, got {self.metric!r}")
        if self.kind not in ALARM_KINDS:
            _fail(cls, "kind", f"unknown value {self.kind!r}; known: {', '.join(ALARM_KINDS)}")
        if self.action not in ALARM_ACTIONS:
            _fail(cls, "action", f"unknown value {self.action!r}; known: {', '.join(ALARM_ACTIONS)}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or \
                math.isnan(self.threshold):
            _fail(cls, "threshold", f"must be a number, got {self.threshold!r}")
        if self.kind in ("drop", "below_first_frac") and not 0 < self.threshold <= 1:
            _fail(cls, "threshold", f"a relative threshold must be in (0, 1], got {self.threshold!r}")
        for field in ("window", "patience"):
            if isinstance(getattr(self, field), bool) or not isinstance(getattr(self, field), int) or \
                    getattr(self, field) < 1:
                _fail(cls, field, f"must be an int >= 1, got {getattr(self, field)!r}")

    @property
    def key(self) -> str:
        return self.name or f"{self.metric}:{self.kind}:{self.threshold!r}:{self.action}"

    def describe(self) -> str:
        extra = f" over {self.window} observations" if self.kind == "drop" else ""
        limit = "" if self.kind == "nonfinite" and math.isinf(self.threshold) else f" {self.threshold:g}"
        return f"{self.metric} {self.kind}{limit}{extra} for {self.patience} step(s) -> {self.action}"


# Rules whose action is MonitorConfig.collapse_action: the collapses that end learning, and an update that
# stalls (a zero gradient although there is something to learn).
COLLAPSE_RULES = ("entropy_collapse", "group_variance_collapse", "stalled_update", "tool_never_called",
                  "tool_always_errors")


def default_rules() -> tuple[AlarmRule, ...]:
    """Rules worth having on any GRPO run. The two collapses that end learning and a stalled update pause by
    default (`MonitorConfig.collapse_action` turns them into warnings), as do a persistently non-finite loss
    and updates skipped 3 steps running; the rest warn, because e.g. a short answer or a clipped ratio is
    often fine. `stalled_update` is a figure the trainer derives (`monitor.health_metrics`)."""
    return (
        # entropy collapse (Cui et al. 2025): mean token entropy under a tenth of its start for 5 steps
        AlarmRule("entropy/mean", "below_first_frac", 0.1, action="pause", patience=5, name="entropy_collapse"),
        # the median falls first (a long tail holds the mean up): a warning
        AlarmRule("entropy/p50", "below_first_frac", 0.1, patience=5, name="entropy_median_collapse"),
        AlarmRule("entropy/mean", "drop", 0.5, window=20),  # halved within 20 steps
        # group variance collapse: most groups give no gradient (DAPO)
        AlarmRule("groups/zero_var_frac", "above", 0.9, action="pause", patience=5, name="group_variance_collapse"),
        # reward collapse: a weighted dimension varies within groups but the advantage ignores it
        AlarmRule("collapse/drowned_dims", "above", 0.5, patience=10, name="drowned_dimension"),
        AlarmRule("length/mean_frac", "above", 0.9, patience=5),  # blow-up, relative to max_new_tokens
        AlarmRule("length/mean", "below", 2.0, patience=5),  # collapse to empty answers
        AlarmRule("length/truncated_frac", "above", 0.5, patience=5),
        AlarmRule("repetition/rate", "above", 0.3, patience=3),
        AlarmRule("kl", "above", 1.0, patience=3),
        # the sampler and the trainer disagree on the rollout's tokens: KL(sampler || trainer) per token (k3)
        AlarmRule("gap/kl", "above", 0.01, patience=3, name="sampler_trainer_gap"),
        AlarmRule("clip_frac_high", "above", 0.2, patience=3),
        AlarmRule("clip_frac_low", "above", 0.2, patience=3),
        AlarmRule("loss", "nonfinite", action="pause", patience=3),  # one NaN step is skipped; three is broken
        AlarmRule("skipped", "nonfinite", 0.0),  # any skipped update
        # every update skipped (a non-finite loss or gradient) 3 steps running: the policy no longer trains
        AlarmRule("skipped", "above", 0.0, action="pause", patience=3, name="skipped_updates"),
        # grad_norm exactly 0 for 5 steps while rewards vary within groups or the policy is uniform
        AlarmRule("stalled_update", "above", 0.5, action="pause", patience=5, name="stalled_update"),
        # a reward fails (raises, or returns no score) on over a tenth of a step's rows: a bug to fix, not noise
        AlarmRule("rewards/error_frac", "above", 0.1, action="pause", name="reward_errors"),
    )


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """Alarm rules and how much history per metric is kept (for drop rules and for the reports)."""

    rules: tuple = dataclasses.field(default_factory=default_rules)  # AlarmRule (or its dict, from JSON)
    history: int = 64  # observations kept per watched metric; must exceed every drop rule's window
    collapse_action: str = "pause"  # action of COLLAPSE_RULES (the collapses, a stalled update): "pause" or "warn"

    def __post_init__(self) -> None:
        rules = tuple(_alarm_rule(i, r) for i, r in enumerate(self.rules))
        _check_choice("MonitorConfig", "collapse_action", self.collapse_action, ALARM_ACTIONS)
        rules = tuple(dataclasses.replace(r, action=self.collapse_action) if r.name in COLLAPSE_RULES else r
                      for r in rules)
        keys = [r.key for r in rules]
        if len(set(keys)) != len(keys):
            _fail("MonitorConfig", "rules", f"duplicate rules (give them distinct names): {keys}")
        object.__setattr__(self, "rules", rules)
        need = max([r.window + 1 for r in rules if r.kind == "drop"], default=1)
        if not isinstance(self.history, int) or self.history < need:
            _fail("MonitorConfig", "history", f"must be an int >= {need} (largest drop window + 1), "
                                              f"got {self.history!r}")


def _alarm_rule(i: int, rule) -> AlarmRule:
    """monitor.rules[i] as an AlarmRule: an AlarmRule, or a dict of its fields (JSON, --set). A key that is not a
    field, or a required field left out, is an error naming the rule and the key."""
    if isinstance(rule, AlarmRule):
        return rule
    where = f"rules[{i}]"
    if not isinstance(rule, Mapping):
        _fail("MonitorConfig", where, f"must be an AlarmRule or a dict of its fields, got {type(rule).__name__} "
                                      f"{rule!r:.80}")
    fields = [f.name for f in dataclasses.fields(AlarmRule)]
    name = rule.get("name") or rule.get("metric") or "?"
    unknown = sorted(str(k) for k in rule if k not in fields)
    if unknown:
        _fail("MonitorConfig", where, f"rule {name!r}: unknown key(s) {unknown}; AlarmRule's fields: {fields}")
    missing = [k for k in ("metric", "kind") if k not in rule]
    if missing:
        _fail("MonitorConfig", where, f"rule {name!r}: missing key(s) {missing} (every rule names a metric and a "
                                      f"kind: {', '.join(ALARM_KINDS)})")
    try:
        return AlarmRule(**rule)
    except ValueError as e:
        raise ValueError(f"MonitorConfig.{where}: rule {name!r}: {e}") from None


def _pairs_field(cls, name: str) -> bool:
    """Whether the field `name` of config class `cls` is a mapping kept as (key, value) pairs (task.options):
    `--set` takes one key of it as `field.KEY=VALUE` and the whole of it as a JSON object or as pairs."""
    return dataclasses.is_dataclass(cls) and any(f.name == name and f.metadata.get("pairs")
                                                 for f in dataclasses.fields(cls))


def as_pairs(where: str, value) -> tuple:
    """A mapping given as an object {key: value} or as [key, value] pairs -> a tuple of (key, value) tuples in
    the order given, the form config.json has always stored (so older files load). Anything else, a key that
    is not a non-empty string, or a key given twice is a ValueError naming `where` and the three spellings."""
    spellings = (f"{where}: must be an object such as {{\"tokenizer_path\": \"...\"}} or a list of [key, value] "
                 "pairs (on the command line also field.KEY=VALUE)")
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)):
        bad = [p for p in value if not (isinstance(p, (tuple, list)) and len(p) == 2)]
        if bad:
            raise ValueError(f"{spellings}; {bad[0]!r} is not a [key, value] pair")
        items = [tuple(p) for p in value]
    else:
        raise ValueError(f"{spellings}, got {value!r:.80} ({type(value).__name__})")
    keys = [k for k, _ in items]
    bad_keys = [k for k in keys if not isinstance(k, str) or not k]
    if bad_keys:
        raise ValueError(f"{spellings}; key {bad_keys[0]!r} is not a non-empty string")
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"{where}: keys {twice} are given more than once")
    return tuple((k, _freeze(v)) for k, v in items)


def _set_pair(pairs, key: str, value) -> list:
    """`pairs` ([key, value] lists, as to_dict gives them) with `key` set to `value`: replaced in place when
    present (its position kept), appended otherwise."""
    out = [list(p) for p in pairs]
    for p in out:
        if p[0] == key:
            p[1] = value
            return out
    return out + [[key, value]]


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return {k: _freeze(x) for k, x in v.items()}
    return v


# --------------------------------------------------------------------------------------------------
# The run: one dataclass per concern, nested in TrainConfig. `override(cfg, ["loss.eps_high=0.28"])`
# is the CLI syntax every experiment shares (`--set loss.eps_high=0.28`).
# --------------------------------------------------------------------------------------------------




@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which model: a preset from models.config (random init), or a local Hugging Face folder."""

    preset: str = "tiny"  # models.PRESETS key; ignored when hf_path is set
    hf_path: str = ""  # local HF checkpoint folder (Llama / Qwen2 / Qwen2-VL); "" = preset
    d_model: int = 0  # overrides of the preset's shape; 0 = keep the preset's value
    n_layers: int = 0  # decoder blocks (0 = preset)
    n_heads: int = 0  # query heads (0 = preset)
    n_kv_heads: int = 0  # key/value heads, GQA (0 = preset)
    head_dim: int = 0  # width of one head (0 = preset)
    mlp_dim: int = 0  # SwiGLU hidden width (0 = preset)
    param_dtype: str = "float32"  # storage dtype of the policy weights
    dtype: str = "float32"  # matmul dtype; logits/softmax/logprobs always float32
    remat: str = "none"  # gradient checkpointing per decoder layer: none / full (recompute all) / dots (keep projections)
    logits_chunk: int = 0  # the update's logits computed this many completion tokens at a time (checkpointed): [rows, chunk, V] float32 at once; 0 = all
    scan_layers: bool = False  # training and logprob forwards scan one compiled layer over the stacked weights (compile time: docs/tpu.md)
    module: str = ""  # your own Flax linen decoder, package.module:Class, built as Class(model config) with the preset's shapes (docs/architecture.md, the model protocol); "" = the built-in decoder
    max_positions: int = 0  # positions the model may use, prompt + completion; 0 = the checkpoint's max_position_embeddings (model.hf_path), none for a preset

    def __post_init__(self):
        for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim"):
            if getattr(self, f) < 0:
                _fail("ModelSpec", f, f"must be >= 0 (0 = preset), got {getattr(self, f)!r}")
        _at_least(self, ("max_positions",), 0, " (0 = the checkpoint's)")
        _check_choice("ModelSpec", "remat", self.remat, REMAT_MODES)
        if self.module and ":" not in self.module:
            _fail("ModelSpec", "module", f"must be an import path package.module:Class, got {self.module!r}")
        if self.logits_chunk < 0:
            _fail("ModelSpec", "logits_chunk", f"must be >= 0 (0 = off), got {self.logits_chunk!r}")
        if self.module and (self.logits_chunk or self.scan_layers):
            _fail("ModelSpec", "logits_chunk" if self.logits_chunk else "scan_layers", "acts on the built-in decoder; "
                  "a model.module of your own runs its layers and head itself")
        if self.module and self.hf_path:
            _fail("ModelSpec", "module", "and hf_path cannot both be set: a Hugging Face checkpoint loads into the "
                  "built-in decoder")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The verifiable task and its data."""

    name: str = "arithmetic"  # grpo_jax.tasks.TASKS key (supplies tokenizer, rewards, solutions), or your own package.module:TaskClass
    options: tuple = dataclasses.field(default=(), metadata={"pairs": True})  # task options: --set task.options.digits=3, a JSON object {"digits": 3}, or [key, value] pairs (stored as pairs)
    train_path: str = ""  # JSONL of training rows; "" = generate `n_train` rows from the task
    eval_path: str = ""  # JSONL of held-out rows (first n_eval used); "" = the task's "heldout" split, or a file task's slice of train_path
    n_train: int = 20_000  # generated training rows
    n_eval: int = 500  # held-out rows, never trained on (without eval_path a file task holds out min(n_eval, 10% of train_path's prompts))
    pass_rate_lo: float = 0.0  # keep training rows with pass_rate in [lo, hi] (rows need "pass_rate",
    pass_rate_hi: float = 1.0  # written by `python -m grpo_jax.difficulty`); [0, 1] = no filter
    format: str = "auto"  # the files' row format (ROW_FORMATS: gsm8k, math, mbpp, ...); auto = from the columns
    chat: str = "auto"  # rows rendered with the tokenizer's chat template: auto (messages rows, or all rows
    #                     when system_prompt is set) | always | never (grpo_jax/tasks/chat.py)
    system_prompt: str = ""  # the system turn of every rendered chat (a row's own system turn wins)
    sanitize: str = "strip"  # prompt-injection cleaning of rows read from files (grpo_jax/rewards/sanitize.py):
    #                          strip | drop | flag (count only) | off; held-out rows are only counted, never changed

    def __post_init__(self):
        object.__setattr__(self, "options", as_pairs("TaskConfig.options", self.options))
        for name, allowed in (("format", ROW_FORMATS), ("chat", CHAT_MODES), ("sanitize", SANITIZE_ACTIONS)):
            if getattr(self, name) not in allowed:
                _fail("TaskConfig", name, f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.system_prompt, str):
            _fail("TaskConfig", "system_prompt", f"must be a string, got {type(self.system_prompt).__name__}")
        if self.system_prompt and self.chat == "never":
            _fail("TaskConfig", "system_prompt", "is set but task.chat=never renders no chat for it to open; use "
                                                 "task.chat=auto or always, or put the instruction in the prompts")
        if self.n_train < 1 or self.n_eval < 0:
            _fail("TaskConfig", "n_train", f"need n_train >= 1 and n_eval >= 0, got {self.n_train}, {self.n_eval}")
        if not 0.0 <= self.pass_rate_lo <= self.pass_rate_hi <= 1.0:
            _fail("TaskConfig", "pass_rate_lo", f"need 0 <= pass_rate_lo <= pass_rate_hi <= 1, got "
                                                f"{self.pass_rate_lo}, {self.pass_rate_hi}")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Rollout settings."""

    group_size: int = 8  # G completions per prompt
    max_new_tokens: int = 16  # T
    temperature: float = 1.0  # sampling temperature; trainer logprobs use the same temperature
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    old_logp_source: str = "sampler"  # "sampler": logprobs from the rollout; "recompute": a trainer forward
    token_entropy_floor: float = 0.0  # per-token temperature: positions whose entropy is under this floor...
    token_boost: float = 1.5  # ... are sampled at min(temperature * token_boost, token_max_temperature)
    token_max_temperature: float = 2.0  # (floor 0 = off; logprobs are those of the distribution used)
    key_offset: int = 0  # folded into each rollout key: other completions, same start, data and held-out rows (a null arm)
    max_prompt_tokens: int = 0  # longest prompt fed to the model; 0 = the model's positions - max_new_tokens (no limit without positions)
    long_prompts: str = "drop"  # a longer prompt (training and held-out rows): drop the row | truncate_left (keep its last tokens)

    def __post_init__(self):
        _at_least(self, ("key_offset", "max_prompt_tokens"), 0)
        _check_choice("SamplingConfig", "long_prompts", self.long_prompts, LONG_PROMPT_ACTIONS)
        if self.group_size < 2:
            _fail("SamplingConfig", "group_size", f"must be >= 2, got {self.group_size}: every advantage estimator "
                  "compares the completions of one prompt with each other, so with one per group every advantage "
                  "is 0 and nothing is learned")
        if self.max_new_tokens < 1:
            _fail("SamplingConfig", "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            _fail("SamplingConfig", "temperature", f"must be > 0 for training rollouts, got {self.temperature}")
        if self.top_k < 0:
            _fail("SamplingConfig", "top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            _fail("SamplingConfig", "top_p", f"must be in (0, 1] (1 = off), got {self.top_p}")
        _check_choice("SamplingConfig", "old_logp_source", self.old_logp_source, ("sampler", "recompute"))
        if self.old_logp_source == "sampler" and (self.top_k or self.top_p < 1):
            _fail("SamplingConfig", "old_logp_source",
                  "top-k/top-p change the sampled distribution; use 'recompute' so ratios compare like with like")


# The keys a rewards.specs entry may have: the fields of grpo_jax.rewards.RewardSpec, in order (its module
# refuses to import when they differ: it is too heavy to import here).
REWARD_SPEC_FIELDS = ("name", "weight", "kwargs", "version", "label", "when")


@dataclasses.dataclass(frozen=True)
class RewardsConfig:
    """Reward dimensions; empty specs = the task's defaults."""

    specs: tuple = ()  # tuple of {"name", "weight", "kwargs"} dicts (grpo_jax.rewards.RewardSpec fields); name: a built-in reward or your own package.module:function
    weights: RewardWeightsConfig = RewardWeightsConfig()  # curriculum + hot-reloaded weights file

    def __post_init__(self):
        shape = ('a list of objects such as [{"name": "math", "weight": 1.0, "kwargs": {}}] (keys: '
                 + ", ".join(REWARD_SPEC_FIELDS) + "; name is required)")
        if not isinstance(self.specs, (tuple, list)):
            _fail("RewardsConfig", "specs", f"must be {shape}, got {self.specs!r}")
        for i, spec in enumerate(self.specs):
            where = f"specs[{i}]"
            if not isinstance(spec, Mapping):
                _fail("RewardsConfig", where, f"must be an object with keys {', '.join(REWARD_SPEC_FIELDS)}, "
                                              f"got {spec!r}")
            unknown = sorted(set(spec) - set(REWARD_SPEC_FIELDS))
            if unknown:
                _fail("RewardsConfig", where, f"unknown keys {unknown}; accepted: {', '.join(REWARD_SPEC_FIELDS)}")
            if not isinstance(spec.get("name"), str) or not spec["name"]:
                _fail("RewardsConfig", where, f"needs a reward name under 'name', got {spec!r}")
            weight = spec.get("weight", 1.0)
            if isinstance(weight, bool) or not is_finite_number(weight) or isinstance(weight, str):
                _fail("RewardsConfig", where, f"'weight' must be a finite number, got {weight!r}")
            if not isinstance(spec.get("kwargs", {}), Mapping):
                _fail("RewardsConfig", where, f"'kwargs' must be an object of keyword arguments, "
                                              f"got {spec['kwargs']!r}")
        object.__setattr__(self, "specs", tuple(self.specs))


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO dynamic sampling: train only on groups whose rewards differ (zero-variance groups carry no
    gradient), drawing extra prompts until the batch is full or the round cap is hit."""

    enabled: bool = False  # on: drop zero-variance groups and refill from extra rollouts
    oversample: float = 2.0  # prompts drawn per round = ceil(oversample * prompts_per_step)
    max_rounds: int = 3  # rollout rounds per step, the first included (verl max_num_gen_batches)

    def __post_init__(self):
        if self.oversample < 1.0:
            _fail("DynamicSamplingConfig", "oversample", f"must be >= 1, got {self.oversample}")
        if self.max_rounds < 1:
            _fail("DynamicSamplingConfig", "max_rounds", f"must be >= 1, got {self.max_rounds}")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with warm-up + constant or cosine schedule and global-norm clipping."""

    lr: float = 1e-4  # peak learning rate (AdamW)
    schedule: str = "constant"  # "constant" | "cosine" (decays to lr * final_lr_frac at the last step)
    warmup_steps: int = 0  # linear warm-up from 0, in optimizer updates
    final_lr_frac: float = 0.1  # cosine: final lr = lr * final_lr_frac
    b1: float = 0.9  # Adam beta1
    b2: float = 0.999  # Adam beta2
    weight_decay: float = 0.0  # decoupled weight decay (AdamW)
    max_grad_norm: float = 1.0  # 0 = no clipping

    def __post_init__(self):
        if not self.lr > 0:
            _fail("OptimConfig", "lr", f"must be > 0, got {self.lr}")
        _check_choice("OptimConfig", "schedule", self.schedule, ("constant", "cosine"))
        if self.warmup_steps < 0 or self.max_grad_norm < 0:
            _fail("OptimConfig", "warmup_steps", "warmup_steps and max_grad_norm must be >= 0")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh (see grpo_jax.sharding)."""

    data: int = -1  # -1 = all devices left after fsdp * tensor
    fsdp: int = 1  # parameter-sharding axis (params and optimizer state split over it, batch too)
    tensor: int = 1  # tensor-parallel axis (heads, MLP, vocab)
    coordinator: str = ""  # "host:port" for jax.distributed (multi-process); "" = single process
    num_processes: int = 1  # processes in a multi-host run (one per host)
    process_id: int = -1  # -1: from the environment / cluster auto-detection
    # A rollout mesh of its own (decoding's layout; params resharded onto it every step); 0 = roll out on the
    # training mesh. Either mesh may then use fewer devices than there are (the first ones).
    rollout_data: int = 0  # rollout mesh data axis (0 = no rollout mesh, -1 = all devices left)
    rollout_fsdp: int = 1  # rollout mesh fsdp axis (params sharded for decoding)
    rollout_tensor: int = 1  # rollout mesh tensor axis

    def __post_init__(self):
        for f in ("fsdp", "tensor", "num_processes", "rollout_fsdp", "rollout_tensor"):
            if getattr(self, f) < 1:
                _fail("MeshConfig", f, f"must be >= 1, got {getattr(self, f)}")
        if self.data == 0 or self.data < -1:
            _fail("MeshConfig", "data", f"must be -1 (auto) or >= 1, got {self.data}")
        if self.rollout_data < -1:
            _fail("MeshConfig", "rollout_data", f"must be 0 (none), -1 (auto) or >= 1, got {self.rollout_data}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How the step's rollouts are scheduled against the update (docs/architecture.md, "The step's pipeline").

    overlap: the next step's rollout is dispatched (JAX's asynchronous dispatch) as soon as the update that
    makes its params is, so the device decodes it while the host builds the step's metrics, logs, writes
    samples, evaluates and checkpoints; nothing numeric changes (same params, keys, rows, temperature).
    off_policy_steps = 1: the rollout of step t+1 is decoded with the params of step t, before step t's
    update, so the host scores it while the device runs that update and decodes the next rollout; the batch
    of step t+1 is then one update stale (its sampler logprobs are the previous params', and the PPO ratio
    and the configured correction (loss.tis_cap / icepop / seq_mask / opsm_delta) see the difference). The
    step right after a checkpoint (and the first step of a run) is decoded with its own params, so a resume
    from any periodic checkpoint is bitwise the uninterrupted run. With dynamic sampling only a step's first
    round is decoded ahead; its later rounds are decoded with the step's own params when they are needed."""

    overlap: bool = True  # dispatch the next rollout before the step's host work (bitwise the same run)
    off_policy_steps: int = 0  # 0: on-policy; 1: rollouts decoded one update behind (AReaL / NeMo-RL style)

    def __post_init__(self):
        if isinstance(self.off_policy_steps, bool) or self.off_policy_steps not in (0, 1):
            _fail("RolloutConfig", "off_policy_steps", f"must be 0 (on-policy) or 1, got {self.off_policy_steps!r}")


@dataclasses.dataclass(frozen=True)
class ToolConfig:
    """A Python tool the policy may call mid-answer (`tool.enabled`): rollouts pause a row when it closes a call,
    run the call in a fresh sandbox and feed its result back as tokens the loss skips (grpo_jax/multiturn.py;
    the host side, grpo_jax/tools.py). A call is the code between `call_open` and `call_close`; its result is
    appended between `output_open` and `output_close` (for a Hugging Face chat model, set the four markers to its
    template's tool-call and tool-response text). The limits bound each call (wall, CPU, memory), what one call
    may add, and how many calls a row makes; `sampling.max_new_tokens` caps a row's tokens, the tool's included.
    The rewards read the policy's own tokens only, so a printed answer tag cannot answer for it."""

    enabled: bool = False  # rollouts (training and evaluation) answer calls; False: one turn, as without a tool
    call_open: str = "<python>"  # marker the model writes before its code
    call_close: str = "</python>"  # marker that ends the code and pauses the row for the tool
    output_open: str = "<output>"  # marker the host writes before a call's result
    output_close: str = "</output>"  # marker the host writes after it
    max_turns: int = 4  # calls run per row; a row that calls once more ends there
    max_output_chars: int = 1000  # characters of one call's output kept; the rest cut, with a note of how much
    max_chars: int = 8000  # characters of a row's conversation in `tools.run_turns` (rollouts cap tokens: sampling.max_new_tokens)
    wall_s: float = 5.0  # wall-clock seconds per call, then the call is killed
    cpu_s: float = 4.0  # CPU seconds per call's process
    memory_mb: int = 512  # address space per call's process
    workers: int = 2  # calls run at once (sandboxed processes)
    resume_every: int = 8  # decode steps a row that called may wait for the others before the host answers
    # right for code that prints the same every run (arithmetic); code reading the clock or random numbers would
    # give every row one draw
    share_identical: bool = False  # identical calls answered together run once and share their result

    def __post_init__(self):
        for name in ("enabled", "share_identical"):
            if not isinstance(getattr(self, name), bool):
                _fail("ToolConfig", name, f"must be true or false, got {getattr(self, name)!r}")
        markers = ("call_open", "call_close", "output_open", "output_close")
        for name in markers:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                _fail("ToolConfig", name, f"must be a non-empty marker string, got {value!r}")
        for i, a in enumerate(markers):
            for b in markers[i + 1:]:
                if getattr(self, a) == getattr(self, b):
                    _fail("ToolConfig", b, f"must differ from {a}, both are {getattr(self, a)!r}")
        for name in ("max_turns", "max_output_chars", "max_chars", "memory_mb", "workers", "resume_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                _fail("ToolConfig", name, f"must be an int >= 1, got {value!r}")
        for name in ("wall_s", "cpu_s"):
            value = getattr(self, name)
            if isinstance(value, (bool, str)) or not is_finite_number(value) or value <= 0:
                _fail("ToolConfig", name, f"must be a positive number of seconds, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 50  # save every N steps (and at the end); 0 = only at the end
    keep_last: int = 3  # newest checkpoints kept
    keep_best: int = 1  # also keep the best N by `best_metric`
    best_metric: str = "eval/accuracy"  # metric ranking the kept-best checkpoints (higher is better)
    export_hf: bool = False  # after the last step, write the policy as a transformers checkpoint to <out>/hf

    def __post_init__(self):
        _at_least(self, ("every",), 0, " (N = every N steps, 0 = only at the end)")
        _at_least(self, ("keep_last",), 1, " (a resume needs the newest)")
        _at_least(self, ("keep_best",), 0)
        if self.keep_best and not self.best_metric:
            _fail("CheckpointConfig", "best_metric", f"must name a metric when keep_best = {self.keep_best}")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    eval_every: int = 50  # held-out greedy evaluation every N steps (and at the end); 0 = only at the end
    samples_per_step: int = 2  # completions written to samples.jsonl per step
    tensorboard: bool = True  # TensorBoard event files under <out>/tb
    progress: bool = True  # live progress bar on stderr
    gap_every: int = 10  # gap/* every N steps (one extra teacher-forced pass); every step with recompute; 0: only then
    gap_bound: float = 2.0  # C of gap/token_out_frac and gap/seq_out_frac: ratios outside [1/C, C]
    eval_samples: int = 0  # k completions at T = 1 per held-out problem: eval/t1/pass@1..k, distinct correct; 0 = greedy only
    eval_samples_every: int = 0  # that sampled evaluation every N steps (at an evaluation step); 0 = at step 0 and the end only
    wandb_project: str = ""  # also send metrics, timings and samples to this W&B project (pip install -e '.[wandb]'); "" = off

    def __post_init__(self):
        _at_least(self, ("eval_every",), 0, " (N = every N steps, 0 = only at the end)")
        _at_least(self, ("eval_samples", "eval_samples_every"), 0)
        _at_least(self, ("gap_every",), 0, " (N = every N steps, 0 = only when the recompute pass runs)")
        if not self.gap_bound > 1.0:
            _fail("LoggingConfig", "gap_bound", f"must be > 1, got {self.gap_bound!r}")
        _at_least(self, ("samples_per_step",), 0)




@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA (models.lora; PEFT LoraConfig semantics): each target projection y = x W gains
    (alpha / rank) * (dropout(x) A) B, B = 0 at the start; the base weights are frozen and held outside the
    optimizer; the KL reference is the base (adapters off, as TRL with peft), or with ref_reset_every a held
    copy reset to the merged policy; rollouts, evaluation and export use the merged W + (alpha / rank) A B."""

    rank: int = 0  # r of every adapter; 0 = LoRA off (every weight is trained)
    alpha: float = 32.0  # scale = alpha / rank (PEFT lora_alpha); 32 as TRL's LoRA-without-regret GRPO recipe
    dropout: float = 0.0  # dropout on each adapter's input in the loss forward (PEFT lora_dropout, default 0)
    targets: tuple = LORA_TARGETS  # projections with an adapter, among LORA_TARGETS (all = PEFT "all-linear")

    def __post_init__(self):
        name = type(self).__name__
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            _fail(name, "rank", f"must be an int >= 0 (0 = off), got {self.rank!r}")
        if isinstance(self.alpha, bool) or not is_finite_number(self.alpha) or not self.alpha > 0:
            _fail(name, "alpha", f"must be a finite number > 0, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not is_finite_number(self.dropout) or not 0 <= self.dropout < 1:
            _fail(name, "dropout", f"must be in [0, 1), got {self.dropout!r}")
        targets = self.targets
        if isinstance(targets, str) or not isinstance(targets, (tuple, list)) or not targets:
            _fail(name, "targets", f"must be a non-empty list of {', '.join(LORA_TARGETS)}, got {targets!r}")
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown:
            _fail(name, "targets", f"unknown projections {unknown}; known: {', '.join(LORA_TARGETS)}")
        if len(set(targets)) != len(targets):
            _fail(name, "targets", f"a projection is named twice: {list(targets)}")
        object.__setattr__(self, "targets", tuple(targets))

    @property
    def scale(self) -> float:
        """alpha / rank, the factor of every adapter's output (0 when LoRA is off)."""
        return self.alpha / self.rank if self.rank else 0.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole GRPO run."""

    seed: int = 0  # every key is fold_in(key(seed), ...) of this
    steps: int = 100  # GRPO steps (one rollout each)
    prompts_per_step: int = 32  # B
    mu: int = 1  # inner epochs over each rollout
    minibatches: int = 1  # optimizer updates per epoch
    microbatches: int = 1  # gradient accumulation splits of each minibatch
    ref_reset_every: int = 0  # copy the policy into the reference every N steps (R1: 400); 0 = never
    model: ModelSpec = ModelSpec()
    task: TaskConfig = TaskConfig()
    sampling: SamplingConfig = SamplingConfig()
    rewards: RewardsConfig = RewardsConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    entropy: EntropyCoefConfig = EntropyCoefConfig()  # entropy bonus coefficient: constant/warmup/adaptive
    temperature: TemperatureConfig = TemperatureConfig()  # adaptive rollout temperature (base: sampling)
    monitor: MonitorConfig = MonitorConfig()  # alarms: warn or pause
    dynamic: DynamicSamplingConfig = DynamicSamplingConfig()
    rollout: RolloutConfig = RolloutConfig()  # overlap of rollouts with the update; one-step off-policy
    lora: LoraConfig = LoraConfig()  # LoRA adapters instead of training every weight (rank 0 = off)
    tool: ToolConfig = ToolConfig()  # a Python tool the policy may call mid-answer (enabled=false: none)

    def __post_init__(self):
        for f in ("seed", "steps", "prompts_per_step", "mu", "minibatches", "microbatches", "ref_reset_every"):
            value = getattr(self, f)  # also when built in Python, not through from_dict: steps=2.5 ran 3 steps
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                _fail("TrainConfig", f, f"must be an integer, got {value!r} ({type(value).__name__})")
            object.__setattr__(self, f, int(value))
        _at_least(self, ("steps", "prompts_per_step", "mu", "minibatches", "microbatches"), 1)
        _at_least(self, ("seed", "ref_reset_every"), 0)
        rows = self.prompts_per_step * self.sampling.group_size
        if rows % (self.minibatches * self.microbatches):
            _fail("TrainConfig", "minibatches",
                  f"prompts_per_step * group_size = {rows} must split into minibatches * microbatches = "
                  f"{self.minibatches * self.microbatches}")
        if self.loss.corrects_gap and self.sampling.old_logp_source != "recompute":
            _fail("TrainConfig", "sampling.old_logp_source",
                  "loss.tis_cap / loss.icepop / loss.seq_mask weigh pi_old / pi_sampler, so pi_old must be the "
                  "trainer's own logprobs: set sampling.old_logp_source=recompute (with 'sampler' the ratio is 1)")


def inert_settings(cfg: TrainConfig) -> list[str]:
    """Settings that act on (almost) nothing in `cfg`, one message each naming the field: the trainer logs
    them as `inert_setting` events and warns at the start of a run (they are legal, so not errors).

    - clip-higher (eps_high != eps_low, PPO-clip losses) and KL-Cov's penalty act only where the policy ratio
      leaves 1. With mu = 1 and minibatches = 1 every update is on-policy: the ratio is 1 up to the
      sampler-trainer float gap, so nothing is clipped, and KL-Cov's |log ratio| pushes each selected token by
      the sign of that float noise.
    - Clip-Cov / KL-Cov select max(floor(ratio * N), 1) of the N tokens of an update; N is at most
      prompts_per_step * group_size * max_new_tokens / minibatches, and below 2 / ratio that is one token.
    - One-step off-policy rollouts with a checkpoint every step: the step after each checkpoint is decoded
      with its own params, so none is off-policy."""
    notes, loss = [], cfg.loss
    on_policy = cfg.mu == 1 and cfg.minibatches == 1
    why = ("with mu = 1 and minibatches = 1 every update is on-policy (the ratio is 1 up to the sampler-trainer "
           "float gap); set mu or minibatches above 1 for it to act")
    if on_policy and loss.policy_loss in ("ppo", "clip_cov") and loss.eps_high != loss.eps_low:
        notes.append(f"loss.eps_high = {loss.eps_high} (clip-higher) clips nothing: {why}")
    if on_policy and loss.policy_loss == "kl_cov":
        notes.append(f"loss.policy_loss = kl_cov: its penalty |log ratio| has no meaningful gradient (zero, or the "
                     f"sign of float noise for each selected token): {why}")
    if cfg.rollout.off_policy_steps and cfg.checkpoint.every == 1:
        notes.append("rollout.off_policy_steps = 1 decodes nothing off-policy with checkpoint.every = 1: the step "
                     "after a checkpoint is decoded with its own params (so that a resume is bitwise), and every step "
                     "is one")
    tokens = cfg.prompts_per_step * cfg.sampling.group_size * cfg.sampling.max_new_tokens / cfg.minibatches
    for name, field in (("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")):
        ratio = getattr(loss, field)
        if loss.policy_loss == name and ratio * tokens < 2:
            notes.append(f"loss.{field} = {ratio} selects one token per update: an update has at most "
                         f"{tokens:.0f} tokens (prompts_per_step * group_size * max_new_tokens / minibatches), and "
                         f"max(floor({ratio} * N), 1) = 1 for N < {2 / ratio:.0f}")
    return notes


# Fields whose change makes resuming a checkpoint unsafe (shapes or the meaning of the optimizer state).
RESUME_CRITICAL = (
    "model.preset", "model.hf_path", "model.module", "model.d_model", "model.n_layers", "model.n_heads",
    "model.n_kv_heads", "model.head_dim", "model.mlp_dim", "model.param_dtype", "sampling.group_size",
    "advantage.estimator",
    "task.name", "task.options", "task.format", "task.chat", "task.system_prompt", "prompts_per_step",
    "lora.rank", "lora.alpha", "lora.targets", "model.max_positions", "sampling.max_prompt_tokens",
    "sampling.long_prompts",
)


def to_dict(cfg) -> dict:
    """A JSON-able dict of a (nested) config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=list))


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'x'?)' for the closest of `choices` to a mistyped `word`, or '' when none is close."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def from_dict(cls, d: dict, _where: str = ""):
    """Rebuild a (nested) config dataclass from `to_dict` output (JSON, --set). Unknown keys and values of the
    wrong type (a string or 2.5 for an int field, a word for a number) are errors naming the dotted key,
    the field and what it accepts. An integral float (3.0, 1e3) is accepted for an int field."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{_where or cls.__name__}: must be a JSON object of {cls.__name__} fields "
                         f"({', '.join(f.name for f in dataclasses.fields(cls))}), got {type(d).__name__} {d!r:.80}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        hint = "".join(did_you_mean(u, names) for u in sorted(unknown))
        raise ValueError(f"{_where + ': ' if _where else ''}{cls.__name__}: unknown fields {sorted(unknown)}{hint}; "
                         f"known: {sorted(names)}")
    kwargs = {}
    for k, v in d.items():
        t = hints[k]
        where = f"{_where}.{k}" if _where else k
        if dataclasses.is_dataclass(t) and not isinstance(v, t):
            v = from_dict(t, v, where)
        else:
            try:
                check = as_pairs if _pairs_field(cls, k) else functools.partial(_checked_value, t=t)
                v = check(f"{where} ({cls.__name__}.{k})", _freeze(v))
            except ValueError as e:
                comment = _field_comments(cls).get(k)
                raise ValueError(f"{e}; the field: {comment}" if comment else str(e)) from None
        kwargs[k] = v
    return cls(**kwargs)


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               tuple: "a list"}


def _checked_value(where: str, v, t):
    """v if it fits the field type t (int, float, bool, str, tuple, X | None), else ValueError naming `where`."""
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        options = typing.get_args(t)
        if v is None and type(None) in options:
            return v
        inner = [o for o in options if o is not type(None)]
        if len(inner) == 1:
            t = inner[0]
            if t not in _TYPE_WORDS:
                return v
            try:
                return _checked_value(where, v, t)
            except ValueError:
                raise ValueError(f"{where}: must be {_TYPE_WORDS[t]} or null, got {v!r} "
                                 f"({type(v).__name__})") from None
        return v
    if t not in _TYPE_WORDS:
        return v
    ok = {int: isinstance(v, int) and not isinstance(v, bool),
          float: isinstance(v, (int, float)) and not isinstance(v, bool),
          bool: isinstance(v, bool), str: isinstance(v, str), tuple: isinstance(v, (tuple, list))}[t]
    if not ok and t is int and isinstance(v, float) and v.is_integer():
        return int(v)
    if not ok:
        raise ValueError(f"{where}: must be {_TYPE_WORDS[t]}, got {v!r} ({type(v).__name__})")
    return tuple(v) if t is tuple else v


def _parse_value(text: str):
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError):
            pass
    return text


def override(cfg, assignments) -> typing.Any:
    """Apply "a.b.c=value" assignments (values parsed as JSON, then Python literals, else strings; a string
    field takes the text as written). A value of the wrong type or range is an error naming the assignment.

    A field kept as (key, value) pairs (task.options) also takes one key as `task.options.KEY=VALUE` (set or
    added; the others kept), and a JSON object for the whole field."""
    d = to_dict(cfg)
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key.path=value")
        path, text = item.split("=", 1)
        node, keys, cls = d, path.strip().split("."), type(cfg)
        for i, k in enumerate(keys[:-1]):
            if _pairs_field(cls, k):
                if i != len(keys) - 2 or not keys[-1]:
                    raise ValueError(f"override {path!r}: {'.'.join(keys[:i + 1])} takes one key after it, as "
                                     f"{'.'.join(keys[:i + 1])}.KEY=VALUE")
                node[k] = _set_pair(node[k], keys[-1], _parse_value(text))
                break
            if not isinstance(node.get(k), dict):
                sections = [name for name, v in node.items() if isinstance(v, dict)]
                raise ValueError(f"override {path!r}: {k!r} is not a config section{did_you_mean(k, sections)}")
            node, cls = node[k], typing.get_type_hints(cls).get(k)
        else:
            _assign_field(node, cls, path, keys[-1], text)
    return from_dict(type(cfg), d)


def _assign_field(node: dict, cls, path: str, key: str, text: str) -> None:
    """Set field `key` of the config section `node` (of class `cls`) to the value `text` parses to."""
    if key not in node:
        raise ValueError(f"override {path!r}: no field {key!r}{did_you_mean(key, node)}; known: {sorted(node)}")
    value = _parse_value(text)
    hint = typing.get_type_hints(cls).get(key) if dataclasses.is_dataclass(cls) else None
    if hint is str and not isinstance(value, str):
        value = text  # e.g. task.train_path=2024.jsonl stays the path it names
    node[key] = value


def _field_comments(cls) -> dict[str, str]:
    """`name: type = default  # comment` -> {name: comment}, read from the class source."""
    out = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+):[^#]*#\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def config_reference(cfg=None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, comment) for every field of TrainConfig, nested sections included."""
    cfg = TrainConfig() if cfg is None else cfg
    comments = _field_comments(type(cfg))
    rows = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            rows += config_reference(value, prefix + f.name + ".")
        else:
            shown = "(default rules)" if f.name == "rules" else json.dumps(value, default=str)
            rows.append((prefix + f.name, shown, comments.get(f.name, "")))
    return rows


if __name__ == "__main__":  # python -m grpo_jax.config  -> docs/configuration.md's config reference table
    print("| key | default | meaning |\n|---|---|---|")
    for key, default, comment in config_reference():
        print(f"| `{key}` | `{default}` | {comment.replace('|', '/')} |")


def flat_dict(d: dict, prefix: str = "") -> dict:
    """A nested dict (a config as `to_dict` gives it) with dotted keys: {"optim": {"lr": 1}} -> {"optim.lr": 1}."""
    out = {}
    for k, v in d.items():
        out.update(flat_dict(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
