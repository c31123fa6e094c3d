"""Float tolerances derived from the computation they check, for tests that compare two float32 computations of
the same values (never a bare fixed atol: what rounding can move scales with the values and the work done)."""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2^-23: the spacing of float32 numbers just above 1
EPS64 = float(np.finfo(np.float64).eps)  # 2^-52: the same for float64 (NumPy statistics, the float64 peers)


def forward_tol(logits, cfg) -> float:
    """How far two float32 computations of one decoder's forward may differ by rounding alone, in its logits
    (ours against transformers', merged weights against an attached adapter, a cached decode against a full
    forward): each computes the same sums in another order (another kernel, fusion or blocking).

    A float32 sum of K products is exact to within ~K * eps of its terms' magnitude (the worst case; independent
    roundings give ~sqrt(K) * eps). A layer's widest sums have K = max(hidden, MLP width, attention width) terms,
    and each of the n_layers layers adds its error to the residual stream the logits are read from. Relative to
    the logits' largest magnitude: tol = n_layers * K * eps * max|logits|; for the tiny test models (2 layers,
    K = 128) 256 eps ~ 3e-5 of the largest logit, 10-20 times the differences seen (4e-6 to 1.2e-5 on logits of
    magnitude ~5), and far below what a wrong weight layout, scale or position moves them by (~0.1 to 10)."""
    width = max(cfg.d_model, cfg.mlp_dim, cfg.n_heads * cfg.head_dim)
    return cfg.n_layers * width * EPS32 * float(np.abs(np.asarray(logits)).max())


def rounding_tol(values, ulps: float = 64, eps: float = EPS32) -> float:
    """How far two programs that compute the same values with the same operations in another order (another
    fusion, a recomputation instead of a saved value) may differ by rounding alone: a few float32 roundings of
    the largest magnitude the values are made of. `ulps` units in the last place of the largest magnitude in
    `values` (an array or a tree of them) bounds that with room (64: ~10 times the 4-6 ulps seen).

    A caller that counts the roundings of its computation passes that count as `ulps` (each correctly rounded
    operation is off by at most half a unit in the last place, eps * |x| >= one unit); `eps=EPS64` for values
    computed in float64. The same bound serves a float32 result against its exact (closed-form or float64)
    value: there only the float32 side rounds."""
    import jax  # here: the module stays importable where only numpy is needed

    return ulps * eps * max(float(np.abs(np.asarray(x)).max(initial=0.0)) for x in jax.tree.leaves(values))


def sum_tol(terms, ops: int = 0, eps: float = EPS32) -> float:
    """How far a float sum of `terms` (any order: a reduction split over devices or microbatches, another
    blocking) may be from the exact sum of the exact terms: (n - 1 + ops) * u * sum |terms|, u = eps / 2 the
    unit roundoff. (n - 1) u sum |terms| is recursive summation's worst case (Higham, "Accuracy and Stability
    of Numerical Algorithms", 2nd ed., eq. 4.4; pairwise and blocked orders do better); `ops` counts the
    correctly rounded operations that made each term (u |term| each). Two float computations of the same sum
    differ by at most twice this."""
    t = np.abs(np.asarray(terms, np.float64)).ravel()
    return (max(t.size - 1, 0) + ops) * eps / 2 * float(t.sum())


def central_difference_tol(f, args, step: float, value_err) -> float:
    """The atol for jax.test_util.check_grads(f, args, order=1, modes=("rev",), eps=step, rtol=0) of a float32 f
    whose gradient is right: how far check_vjp's cotangent projection c . (f(x + step v) - f(x - step v)) / (2 step)
    may be from c . J v by truncation and rounding alone. v and c are check_vjp's own draws (a fresh
    np.random.RandomState(0): the tangent for each arg in order, then the cotangent), reproduced here, so the
    terms are those of the check that runs:

      truncation    step^2 / 6 |h'''| with h(s) = c . f(x + s v), h''' taken by jax at 5 points of [-step, step]
                    (x2: between the points it may be larger);
      f's rounding  sum_k |c_k| (e_k(x + step v) + e_k(x - step v)) / (2 step), e = value_err(*point) the bound
                    on each output's float32 rounding error at that point (the caller's derivation);
      x +- step v   rounded to float32 (eps/2 |x + step v| a element, after eps/2 |step v|), moving f by
                    sum |c J| eps/2 (|x| + 2 step |v|) on each side: / (2 step);
      c . J v       the float32 gradient (16 roundings of eps/2 a element) and check_vjp's float32 dot products
                    of n terms: sum_tol(c J v, ops=16) on each side.
    """
    import jax
    import jax.numpy as jnp

    rng = np.random.RandomState(0)
    xs = [np.asarray(a, np.float32) for a in args]
    vs = [np.asarray(rng.randn(*x.shape), np.float32) for x in xs]
    c = np.asarray(rng.randn(*np.shape(f(*args))), np.float32)

    def h(s):
        return jnp.vdot(c, f(*[jnp.asarray(x) + s * jnp.asarray(v) for x, v in zip(xs, vs)]))

    h3 = jax.jit(jax.grad(jax.grad(jax.grad(h))))
    truncation = 2 * step**2 / 6 * max(abs(float(h3(jnp.float32(s)))) for s in np.linspace(-step, step, 5))
    points = [[x + np.float32(sign * step) * v for x, v in zip(xs, vs)] for sign in (1, -1)]
    rounding = sum(float(np.sum(np.abs(c) * np.asarray(value_err(*p), np.float64))) for p in points) / (2 * step)
    jacs = jax.jacrev(f, argnums=tuple(range(len(xs))))(*[jnp.asarray(x) for x in xs])
    cj = [np.abs(np.tensordot(c, np.asarray(j, np.float64), axes=c.ndim)) for j in jacs]  # |c . J| per input
    moved = sum(float(np.sum(j * (np.abs(x) + 2 * step * np.abs(v)))) for j, x, v in zip(cj, xs, vs))
    inputs = EPS32 / 2 * moved / step
    products = 2 * sum_tol(np.concatenate([(j * np.abs(v)).ravel() for j, v in zip(cj, vs)]), ops=16)
    return truncation + rounding + inputs + products


def gap_tols(trainer, sampler, mask, logp_err: float = 0.0) -> dict:
    """For each gap/* metric of diagnostics.sampler_trainer_gap, how far its float32 value may be from the
    float64 definition on the same logprobs, per valid token x = log rho = trainer - sampler (u = eps / 2):

      x             fl(trainer - sampler) = x (1 + d), |d| <= u; plus `logp_err` where the trainer's logprobs
                    of the two sides come from two float32 programs (a bound on their difference);
      abs_logp      the mean of |x|: those errors, sum_tol of the n values, / n (u of the mean);
      kl            k3 = expm1(x) - x moves by |k3'| = |e^x - 1| times x's error; expm1 (u |expm1 x|, the
                    cancellation against x) and the subtraction or the series (2 u |k3|); summed and / n;
      ratio_*       rho = exp(x) moves by rho (x's error + u); the p99's interpolation adds the rounding of its
                    position q (n - 1) (u (n - 1) times the spread of rho) and 3 u max rho (two products, a sum);
      *_out_frac    a count / n <= 1 (one division: u; the counts themselves agree, no log rho lying within
                    these errors of log bound, or the test's exact count checks would see it)."""
    t, s_, m = (np.asarray(a, np.float64) for a in (trainer, sampler, mask))
    m = m.astype(bool)
    x = (t - s_)[m]
    u = EPS32 / 2
    n = max(x.size, 1)
    dx = u * np.abs(x) + logp_err
    rho = np.exp(x)
    k3 = np.expm1(x) - x
    k3_err = np.abs(np.expm1(x)) * dx + u * np.abs(np.expm1(x)) + 2 * u * np.abs(k3)
    rho_err = rho * (dx + u)
    abs_mean, k3_mean = np.abs(x).mean() if x.size else 0.0, k3.mean() if x.size else 0.0
    seq = np.where(m, t - s_, 0.0).sum(-1)[m.any(-1)]
    return {
        "gap/abs_logp": (dx.sum() + sum_tol(x)) / n + u * abs_mean,
        "gap/kl": (k3_err.sum() + sum_tol(k3)) / n + u * abs(k3_mean),
        "gap/ratio_max": float(rho_err.max(initial=0.0)),
        "gap/ratio_min": float(rho_err.max(initial=0.0)),
        "gap/ratio_p99": float(rho_err.max(initial=0.0)) + u * (n - 1) * float(np.ptp(rho) if x.size else 0.0)
        + 3 * u * float(rho.max(initial=0.0)),
        "gap/token_out_frac": u,
        "gap/seq_out_frac": u if seq.size else 0.0,
    }


def group_stats(x, x_err):
    """(n, deviations d, per-entry error r = x_err + eps/2 |d| of d without the mean's share, the mean's error dm,
    which entries are present) over the last axis, NaN entries left out (not counted, d 0). The mean's float32
    error: its sum's (n - 1) eps/2 sum|x| / n (Higham), the division's eps/2 |mean| and the inputs' errors,
    <= max x_err."""
    u = EPS32 / 2
    x = np.asarray(x, np.float64)
    present = ~np.isnan(x)
    n = np.sum(present, axis=-1, keepdims=True)
    x0 = np.where(present, x, 0.0)
    mean = x0.sum(-1, keepdims=True) / np.maximum(n, 1)
    d = np.where(present, x0 - mean, 0.0)
    e = np.where(present, np.broadcast_to(np.asarray(x_err, np.float64), x.shape), 0.0)
    dm = ((n - 1) * u * np.abs(x0).sum(-1, keepdims=True) / np.maximum(n, 1) + u * np.abs(mean)
          + e.max(-1, keepdims=True, initial=0.0))
    return n, d, e + u * np.abs(d), dm, present


def center_err(x, x_err=0.0):
    """A bound, per entry, on the float32 error of x - mean(x) over the last axis (NaN entries left out: bound
    0), for exact values x each already off by at most x_err (scalar or broadcastable): the entry's own error,
    the mean's (its sum and division and the inputs', see group_stats) and the subtraction's eps/2 |d|."""
    _, _, r, dm, present = group_stats(x, x_err)
    return np.where(present, r + dm, 0.0)


def zscore_err(x, eps: float, x_err=0.0, ddof: int = 1):
    """A bound, per entry, on the float32 error of the z-score z = d / (std + eps), d = x - mean(x) over the last
    axis (NaN entries left out: bound 0), for exact x each off by at most x_err, to first order in eps32:

      d_i       off by r_i + dm: its own error and the subtraction's (r_i) and the mean's (dm, common to the
                group: since sum_j d_j = 0 it leaves the std unchanged to first order);
      std       off by max_j r_j sqrt(n / (n - ddof)) (its gradient in the d's has that norm bound) and by its own
                roundings: squares, the sum's n - 1 adds, the division, sqrt and the + eps: ((n + 1) / 2 + 2) eps/2
                relative;
      z_i       (r_i + dm) / (std + eps) + |z_i| (the std's relative error) + eps/2 |z_i| (the quotient).

    A group with fewer than 2 entries or no spread is exactly 0 (advantages._moments): bound 0."""
    u = EPS32 / 2
    n, d, r, dm, present = group_stats(x, x_err)
    std = np.sqrt((d**2).sum(-1, keepdims=True) / np.maximum(n - ddof, 1))
    z = d / (std + eps) if eps > 0 else np.divide(d, std, out=np.zeros_like(d), where=std > 0)
    std_err = r.max(-1, keepdims=True, initial=0.0) * np.sqrt(n / np.maximum(n - ddof, 1)) + ((n + 1) / 2 + 2) * u * std
    with np.errstate(invalid="ignore", divide="ignore"):
        err = (r + dm) / (std + eps) + np.abs(z) * std_err / (std + eps) + u * np.abs(z)
    x0 = np.where(present, np.asarray(x, np.float64), np.inf)
    constant = np.max(np.where(present, x0, -np.inf), -1, keepdims=True) == np.min(x0, -1, keepdims=True)
    return np.where(present & (n >= 2) & ~constant, err, 0.0)


def _finite_abs_max(logits) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    return np.where(np.isfinite(z), z, 0.0)  # top-k / top-p filtered entries (-inf) carry no magnitude


def logprob_tol(logits, cfg) -> float:
    """How far two float32 computations of a decoder's token log-probabilities, log_softmax(logits)[token], may
    differ (the sampler's cached decode against teacher forcing, a sharded forward against one device's, merged
    weights against attached adapters): the logits by forward_tol, which moves a log-softmax by at most twice
    that (the token's logit and the log-sum-exp); and on each side the log-softmax's own roundings: the sum of V
    exponentials (V + 1 roundings of eps/2, relative, so as much absolute after the log), the subtractions of the
    max and the log (eps/2 of |z| <= max|z| and of log V each). `logits` as sampled (divided by the temperature;
    filtered entries -inf)."""
    z = _finite_abs_max(logits)
    v = z.shape[-1]
    return 2 * forward_tol(z, cfg) + EPS32 * (v + 1 + 2 * float(np.abs(z).max()) + np.log(v))


def entropy_tol(logits, cfg) -> float:
    """How far two float32 computations of the entropy H = -sum_i p_i log p_i of softmax(logits) may differ: the
    logits by at most forward_tol, which moves H by at most S = sum_i p_i |log p_i + H| (dH / dz_i =
    -p_i (log p_i + H)) times it; and on each side the sum of V terms p log p (V + 1 roundings of eps/2 of
    sum |p log p| = H) on log-probabilities off by logprob_tol's own share, (V + 1 + 2 max|z| + log V) eps/2 each
    (weighted by sum p = 1). The worst position."""
    z = np.asarray(logits, np.float64)
    zz = np.where(np.isfinite(z), z, -np.inf)
    v = z.shape[-1]
    p = np.exp(zz - zz.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.where(p > 0, np.log(p), 0.0)
    h = -(p * logp).sum(-1)
    spread = (p * np.abs(logp + h[..., None])).sum(-1)
    own = v + 1 + 2 * float(np.abs(_finite_abs_max(z)).max()) + np.log(v) + (v + 1) * h
    return float((spread * forward_tol(_finite_abs_max(z), cfg) + EPS32 * own).max())


def pearson_tol(x, y, x_err=0.0, y_err=0.0) -> float:
    """How far a float32 Pearson correlation of x and y (1-d, exact values; each entry already off by at most
    x_err / y_err, scalars or arrays) may be from the exact one. corr = <x_c, y_c> / (|x_c| |y_c|) of the centred
    vectors has gradient norm <= 1 / |x_c| in x_c (and in y_c), so entry errors e move it by <= |e| / |x_c| <=
    sqrt(n) max e / |x_c|; the centring adds center_err; the three sums of n products (n roundings of eps/2 of
    sum |x_i y_i| <= |x_c| |y_c| each), the product, sqrt and division add (2n + 4) eps/2. A side with no spread
    gives exactly 0 (bound 0)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x_err, y_err = np.broadcast_to(x_err, x.shape).ravel(), np.broadcast_to(y_err, y.shape).ravel()
    x, y = x.ravel(), y.ravel()
    n = x.size
    xc, yc = x - x.mean(), y - y.mean()
    nx, ny = np.linalg.norm(xc), np.linalg.norm(yc)
    if nx == 0 or ny == 0:
        return 0.0
    ex = float(np.max(x_err + center_err(x[None])[0]))
    ey = float(np.max(y_err + center_err(y[None])[0]))
    return np.sqrt(n) * (ex / nx + ey / ny) + (2 * n + 4) * EPS32 / 2


def group_var_mean_tol(x, x_err=0.0) -> float:
    """How far a float32 mean over groups (the rows of x [B, G], NaN entries left out) of each group's population
    variance may be from the exact one: each deviation is off by center_err, which moves a group's mean square
    by <= 2 mean|d| max center_err; the squares, the group sum and division add (G + 1) eps/2 of the variance;
    the mean over B groups adds (B + 1) eps/2 of the largest."""
    x = np.asarray(x, np.float64)
    u = EPS32 / 2
    present = ~np.isnan(x)
    n = present.sum(-1)
    d = np.where(present, x - np.nanmean(x, -1, keepdims=True), 0.0)
    var = (d**2).sum(-1) / np.maximum(n, 1)
    err = center_err(x, x_err).max(-1)
    per_group = 2 * np.abs(d).sum(-1) / np.maximum(n, 1) * err + (n + 1) * u * var
    return float(per_group.max() + (x.shape[0] + 1) * u * var.max())
