"""Statistics for study claims: pass@k, a paired (seeds x problems) bootstrap CI, a paired t-interval and t-test
over seeds, the paired equivalence test (TOST), Holm's adjustment for a family, McNemar's test, a calibrated noise
floor and the verdict rule that compares a difference with it.

NumPy and the standard library (SciPy for the t quantile), float64 throughout. A claim is a paired 95% CI of mean(b) - mean(a) on
pre-registered seeds, read beside a noise floor measured by re-running the baseline with only its sampling
seed changed: a margin inside the noise is not a win (`verdict`).

    from grpo_jax import stats
    ci = stats.paired_bootstrap_ci(acc_a, acc_b)            # arrays [S seeds, P problems] of 0/1 correctness
    floor = stats.noise_floor(acc_a, acc_a_reseeded)
    stats.verdict(ci, floor), stats.format_ci(ci)           # "win" / "loss" / "inside noise", "+4.2 [1.1, 7.3]"
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

# Bootstrap replicates are drawn in blocks whose index array holds at most this many entries (memory bound).
_BLOCK_ENTRIES = 1 << 22
VERDICTS = ("win", "loss", "inside noise")


def _as_counts(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iub" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
        raise ValueError(f"{name} must hold integer counts, got {arr!r}")
    return arr.astype(np.int64)


def pass_at_k(n: Any, c: Any, k: int) -> np.ndarray | float:
    """Unbiased pass@k per problem from n samples of which c are correct (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1):

        pass@k = 1 - C(n - c, k) / C(n, k)  =  1 - prod_{i = n-c+1}^{n} (1 - k / i),

    the product being the numerically stable form of their Figure 3 code, and pass@k = 1 when n - c < k (every
    k-subset then holds a success). It equals the fraction of the C(n, k) k-subsets of the n samples that hold
    at least one success. `n` and `c` are integer scalars or arrays (broadcast together; n may differ per
    problem); returns float64 of their broadcast shape (a float for scalars). k > n is an error.
    """
    n_arr, c_arr = np.broadcast_arrays(_as_counts(n, "n"), _as_counts(c, "c"))
    if int(k) != k or k < 1:
        raise ValueError(f"pass_at_k needs an integer k >= 1, got k={k!r}")
    if np.any(c_arr < 0) or np.any(c_arr > n_arr):
        raise ValueError(f"pass_at_k needs 0 <= c <= n per problem, got n={n!r}, c={c!r}")
    if np.any(k > n_arr):
        raise ValueError(f"pass_at_k needs k <= n (k samples drawn from n per problem): k={k} exceeds "
                         f"n={int(n_arr.min())} on {int(np.sum(k > n_arr))} problem(s)")
    i = np.arange(1, int(n_arr.max(initial=1)) + 1, dtype=np.float64)
    in_range = (i >= (n_arr - c_arr + 1)[..., None]) & (i <= n_arr[..., None])
    all_fail = np.where(in_range, 1.0 - k / i, 1.0).prod(axis=-1)
    out = np.where(n_arr - c_arr < k, 1.0, 1.0 - all_fail)
    return float(out) if out.ndim == 0 else out


def pass_at_k_curve(n: Any, c: Any, ks: Iterable[int]) -> dict[int, float]:
    """{k: mean over problems of `pass_at_k(n, c, k)`} (Chen et al. 2021 average the per-problem estimator)."""
    return {int(k): float(np.mean(pass_at_k(n, c, int(k)))) for k in ks}


def cover_at(n: Any, c: Any, tau: float) -> float:
    """Cover@tau: the share of problems whose sampled success rate c / n is at least tau (n samples, c correct,
    arrays [P]); tau = 1/n is pass@n's "any correct", larger tau asks for a reliable solve."""
    n_arr, c_arr = _as_counts(n, "n"), _as_counts(c, "c")
    if not 0.0 < tau <= 1.0 or n_arr.shape != c_arr.shape or np.any(n_arr < 1) or np.any(c_arr > n_arr):
        raise ValueError(f"cover_at needs 0 < tau <= 1 and counts 0 <= c <= n, n >= 1 (got tau={tau})")
    return float(np.mean(c_arr / n_arr >= tau)) if n_arr.size else float("nan")


def _replicates(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """`n_boot` bootstrap means of d[S, P]: per replicate S seeds and P problems drawn with replacement, the
    problem indices shared by every drawn seed (and by both arms, since d = b - a already pairs them)."""
    n_seeds, n_problems = d.shape
    block = max(1, _BLOCK_ENTRIES // (n_seeds * n_problems))
    out = np.empty(n_boot, np.float64)
    for start in range(0, n_boot, block):
        m = min(block, n_boot - start)
        problems = rng.integers(0, n_problems, size=(m, n_problems))
        seeds = rng.integers(0, n_seeds, size=(m, n_seeds))
        per_seed = d[:, problems].mean(axis=-1)  # [S, m]: each seed's mean over the drawn problems
        out[start:start + m] = per_seed[seeds, np.arange(m)[:, None]].mean(axis=-1)
    return out


def paired_bootstrap_ci(a: Any, b: Any, *, n_boot: int = 10_000, level: float = 0.95,
                        seed: int = 0) -> dict[str, Any]:
    """Paired two-level bootstrap CI of mean(b) - mean(a) for two arms on any per-problem metric.

    `a`, `b`: arrays [S, P] (seed s of arm a and seed s of arm b share the seed; problem p is the same held-out
    problem in both) or [S] (one number per seed). With d = b - a, each replicate draws S seed indices and P
    problem indices with replacement and takes the mean of d over them: the problem indices are the same for
    both arms (the pairing) and for every drawn seed, since every seed is evaluated on the same P problems
    (a crossed design; this is Owen's 2007 "pigeonhole bootstrap", Ann. Appl. Stat. 1(2), mildly conservative).
    The interval is the percentile interval [q_{(1-level)/2}, q_{(1+level)/2}] of the replicates (Efron &
    Tibshirani 1993, ch. 13). Deterministic for a `seed` (`numpy.random.default_rng(seed)`).

    With S = 1 only problems are resampled: the interval then measures evaluation noise (which problems were
    held out), not trajectory noise (which seed trained the run). With small S (2-5) the seed level resamples
    a handful of values and the interval is too narrow (coverage well under `level`); read it beside
    `noise_floor`. Returns {"diff", "low", "high", "level", "n_boot", "seeds": S, "problems": P (None for
    [S] inputs)}.
    """
    a_arr, b_arr = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a_arr.shape != b_arr.shape or a_arr.ndim not in (1, 2) or a_arr.size == 0:
        raise ValueError(f"a and b must be non-empty arrays of one shape [S, P] or [S]; got {a_arr.shape} "
                         f"and {b_arr.shape}")
    if not (np.all(np.isfinite(a_arr)) and np.all(np.isfinite(b_arr))):
        raise ValueError("a and b must be finite")
    if not 0.0 < level < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < level < 1 and n_boot >= 1, got level={level}, n_boot={n_boot}")
    d = (b_arr - a_arr).reshape(a_arr.shape[0], -1)
    reps = _replicates(d, int(n_boot), np.random.default_rng(seed))
    low, high = np.quantile(reps, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return {"diff": float(d.mean()), "low": float(low), "high": float(high), "level": float(level),
            "n_boot": int(n_boot), "seeds": int(d.shape[0]), "problems": int(d.shape[1]) if a_arr.ndim == 2 else None}


def _paired_d(a: Any, b: Any) -> np.ndarray:
    """d_s = mean_p b[s, p] - mean_p a[s, p] (or b[s] - a[s]) with the seed as the unit: what every paired test
    over seeds reads. a and b: finite arrays of one shape [S, P] or [S], S >= 2."""
    a_arr, b_arr = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a_arr.shape != b_arr.shape or a_arr.ndim not in (1, 2) or a_arr.shape[0] < 2:
        raise ValueError(f"a and b must be arrays of one shape [S, P] or [S] with S >= 2; got {a_arr.shape} "
                         f"and {b_arr.shape}")
    if not (np.all(np.isfinite(a_arr)) and np.all(np.isfinite(b_arr))):
        raise ValueError("a and b must be finite")
    return (b_arr - a_arr).reshape(a_arr.shape[0], -1).mean(axis=1)


def paired_t_ci(a: Any, b: Any, *, level: float = 0.95) -> dict[str, Any]:
    """Paired t-interval of mean(b) - mean(a) with the seed as the unit: d_s = mean_p b[s, p] - mean_p a[s, p]
    (or b[s] - a[s] for [S] inputs), diff = mean(d), interval diff +- t_{(1+level)/2, S-1} * sd(d, ddof 1) /
    sqrt(S). The textbook interval for a few seeds (it assumes the d_s roughly normal): at S = 8 it keeps its
    level where the bootstrap's seed level, resampling 8 values, is too narrow. Needs S >= 2. Returns
    {"diff", "low", "high", "level", "seeds", "sd", "per_seed": [d_s]}."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"0 < level < 1 is needed (got level={level})")
    from scipy.stats import t as student_t  # imported here: the rest of the module needs no SciPy

    d = _paired_d(a, b)
    n, diff, sd = d.size, float(d.mean()), float(d.std(ddof=1))
    half = float(student_t.ppf((1.0 + level) / 2.0, n - 1)) * sd / math.sqrt(n)
    return {"diff": diff, "low": diff - half, "high": diff + half, "level": float(level), "seeds": int(n),
            "sd": sd, "per_seed": [float(x) for x in d]}


def paired_t_test(a: Any, b: Any) -> dict[str, Any]:
    """Two-sided paired t-test of mean(b) - mean(a) = 0 with the seed as the unit (the test `paired_t_ci`
    inverts): t = mean(d) / (sd(d) / sqrt(S)), S - 1 degrees of freedom. Returns {"diff", "t", "p_value",
    "seeds"}; p = 1 when every d_s is 0, and 0 when they are all one non-zero value."""
    from scipy.stats import t as student_t

    d = _paired_d(a, b)
    n, diff, sd = d.size, float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return {"diff": diff, "t": 0.0 if diff == 0.0 else math.copysign(math.inf, diff),
                "p_value": 1.0 if diff == 0.0 else 0.0, "seeds": int(n)}
    t = diff / (sd / math.sqrt(n))
    return {"diff": diff, "t": float(t), "p_value": float(2.0 * student_t.sf(abs(t), n - 1)), "seeds": int(n)}


def paired_tost(a: Any, b: Any, *, margin: float, alpha: float = 0.05) -> dict[str, Any]:
    """Equivalence of b and a within +-margin (Schuirmann's two one-sided tests, paired over seeds): H0 is
    |mean(b) - mean(a)| >= margin; p = max(p_low, p_high) of the one-sided t-tests of diff > -margin and diff <
    margin, S - 1 degrees of freedom. `equivalent` when p < alpha, which is the (1 - 2 alpha) t-interval lying
    inside (-margin, margin), returned as low / high. A null that is `equivalent` says the effect is smaller than
    the margin; one that is not says too few seeds to tell."""
    from scipy.stats import t as student_t

    if not margin > 0 or not 0.0 < alpha < 0.5:
        raise ValueError(f"paired_tost needs margin > 0 and 0 < alpha < 0.5, got margin={margin}, alpha={alpha}")
    d = _paired_d(a, b)
    n, diff, se = d.size, float(d.mean()), float(d.std(ddof=1)) / math.sqrt(d.size)
    if se == 0.0:
        p_low, p_high = (0.0 if diff > -margin else 1.0), (0.0 if diff < margin else 1.0)
    else:
        p_low = float(student_t.sf((diff + margin) / se, n - 1))  # H0: diff <= -margin
        p_high = float(student_t.cdf((diff - margin) / se, n - 1))  # H0: diff >= margin
    half = float(student_t.ppf(1.0 - alpha, n - 1)) * se
    p = max(p_low, p_high)
    return {"diff": diff, "margin": float(margin), "alpha": float(alpha), "p_value": p, "equivalent": p < alpha,
            "low": diff - half, "high": diff + half, "seeds": int(n)}


def holm(p_values: Iterable[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979) of a family's p-values, in their order: sorted ascending,
    adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)). A hypothesis is rejected at family-wise level alpha when
    its adjusted p is below alpha; never less powerful than Bonferroni (m p)."""
    p = np.asarray(list(p_values), np.float64)
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise ValueError(f"holm needs p-values in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return [float(x) for x in out]


def mcnemar(a_correct: Any, b_correct: Any) -> dict[str, Any]:
    """McNemar's test for two runs scored on the same P problems (bool arrays [P]).

    b01 = #(a wrong, b right), b10 = #(a right, b wrong). Under H0 (no difference) the discordant pairs split
    as X ~ Bin(b01 + b10, 1/2); the exact two-sided p-value is min(1, 2 P(X <= min(b01, b10))) (McNemar 1947;
    Fagerland, Lydersen & Laake 2013, BMC Med. Res. Methodol. 13:91), p = 1 with no discordant pairs. The
    continuity-corrected statistic is chi2 = (|b01 - b10| - 1)^2 / (b01 + b10) (Edwards 1948), 1 df; 0 when
    there are no discordant pairs. Returns {"b01", "b10", "p_value", "chi2", "problems"}.
    """
    a_arr, b_arr = np.asarray(a_correct), np.asarray(b_correct)
    if a_arr.shape != b_arr.shape or a_arr.ndim != 1 or a_arr.dtype.kind != "b" or b_arr.dtype.kind != "b":
        raise ValueError(f"mcnemar needs two bool arrays [P] of one shape, got {a_arr.dtype}{a_arr.shape} "
                         f"and {b_arr.dtype}{b_arr.shape}")
    b01, b10 = int(np.sum(~a_arr & b_arr)), int(np.sum(a_arr & ~b_arr))
    n = b01 + b10
    tail = sum(math.comb(n, i) for i in range(min(b01, b10) + 1))
    p_value = min(1.0, 2 * tail / 2 ** n)  # exact integers, one rounding
    chi2 = (abs(b01 - b10) - 1) ** 2 / n if n else 0.0
    return {"b01": b01, "b10": b10, "p_value": float(p_value), "chi2": float(chi2), "problems": int(a_arr.size)}


def noise_floor(baseline: Any, null: Any, **bootstrap_kw: Any) -> dict[str, Any]:
    """The calibrated noise floor: `null` is the baseline re-run with only its sampling seed changed (paired
    with `baseline` as in `paired_bootstrap_ci`), so any difference between them is noise. Returns the paired
    bootstrap CI of null - baseline plus floor = max(|low|, |high|): the margin a claimed difference must
    exceed (`verdict`)."""
    ci = paired_bootstrap_ci(baseline, null, **bootstrap_kw)
    return {**ci, "floor": max(abs(ci["low"]), abs(ci["high"]))}


def verdict(diff_ci: dict[str, Any], floor: dict[str, Any] | float) -> str:
    """"win" when the CI excludes 0 from above (low > 0) and diff > floor; "loss" when it excludes 0 from below
    (high < 0) and diff < -floor; "inside noise" otherwise (including a CI that touches 0). `floor` is a
    `noise_floor` result or its "floor" value. A margin inside the noise is not a win."""
    f = float(floor["floor"] if isinstance(floor, dict) else floor)
    diff, low, high = diff_ci["diff"], diff_ci["low"], diff_ci["high"]
    if low > 0.0 and diff > f:
        return "win"
    if high < 0.0 and diff < -f:
        return "loss"
    return "inside noise"


def format_ci(ci: dict[str, Any], scale: float = 100.0, digits: int = 1) -> str:
    """"+4.2 [1.1, 7.3]": diff with its sign, then [low, high], each times `scale` (100: points of accuracy)."""
    diff, low, high = (round(ci[key] * scale, digits) + 0.0 for key in ("diff", "low", "high"))  # + 0.0: no -0.0
    return f"{diff:+.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
