"""Entropy-collapse study: the translation task at a low sampling temperature, with no entropy control
against six controls, and the entropy-performance law R = -a exp(H) + b (Cui et al. 2025) fitted per arm.

    python experiments/entropy_collapse.py              # 7 arms x 3 seeds -> runs/entropy_collapse/results.md
    python experiments/entropy_collapse.py --smoke      # seconds; what the tests run

Arms: none; entropy bonus with a warm-up coefficient; adaptive coefficient (target entropy); clip-higher
(eps_high 0.28); Clip-Cov; KL-Cov; adaptive temperature. Reported per arm (mean +- std over seeds): final
held-out chrF quality, entropy at the start and end, and the fit (a, b, R^2) of training reward against
policy entropy over the run.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from ablate_advantages import get_config as ablation_config  # noqa: E402
from study import last_mean, plot_curves, run_study, study_settings, write_study  # noqa: E402

from grpo_jax.config import TrainConfig, override  # noqa: E402

ARMS = {
    "none": [],
    "entropy_bonus_warmup": ["entropy.mode=warmup", "entropy.coef=0.01", "entropy.warmup_start=20",
                             "entropy.warmup_steps=50"],
    "adaptive_coef": ["entropy.mode=adaptive", "entropy.coef=0.005", "entropy.target_entropy=0.3",
                      "entropy.max_coef=0.05"],
    "clip_higher": ["loss.eps_high=0.28"],
    "clip_cov": ["loss.policy_loss=clip_cov"],
    "kl_cov": ["loss.policy_loss=kl_cov"],
    "adaptive_temperature": ["temperature.mode=adaptive", "temperature.entropy_floor=0.3",
                             "temperature.max_temp=1.0", "temperature.window=5"],
}


def get_config(smoke: bool = False) -> TrainConfig:
    cfg = override(ablation_config(smoke), ["rewards.specs=[]", "sampling.temperature=0.6"])
    return cfg


def fit_entropy_law(h: np.ndarray, r: np.ndarray) -> dict:
    """Least squares R = -a exp(H) + b; returns a, b and R^2 (nan when H does not vary)."""
    x = np.exp(np.asarray(h, float))
    r = np.asarray(r, float)
    if len(x) < 3 or np.ptp(x) < 1e-9:
        return {"fit_a": float("nan"), "fit_b": float("nan"), "fit_r2": float("nan")}
    slope, b = np.polyfit(x, r, 1)
    resid = r - (slope * x + b)
    r2 = 1.0 - resid.var() / max(r.var(), 1e-12)
    return {"fit_a": float(-slope), "fit_b": float(b), "fit_r2": float(r2)}


def summarize(rows: list[dict]) -> dict:
    train = [r for r in rows if "entropy/mean" in r]
    evals = [r for r in rows if "eval/score" in r]
    fit = fit_entropy_law([r["entropy/mean"] for r in train], [r["reward/translation/mean"] for r in train])
    return {"quality_final": evals[-1]["eval/score"], "entropy_first": train[0]["entropy/mean"],
            "entropy_final": last_mean(rows, "entropy/mean", 10), **fit}


def main(argv=None) -> dict:
    from grpo_jax.cli import parse_args

    args, cfg = parse_args(argv, description=__doc__, get_config=get_config)
    out, seeds, sft = study_settings(args, cfg, "runs/entropy_collapse")
    arms = {k: v for k, v in ARMS.items() if not args.smoke or k in ("none", "adaptive_temperature")}
    study = run_study(cfg, arms, seeds=seeds, out=out, sft=sft, quiet=args.quiet, summarize=summarize,
                      summarize_only=args.summarize_only)
    plots = [plot_curves(out, arms, "entropy/mean", "mean token entropy (nats)", "entropy"),
             plot_curves(out, arms, "eval/score", "held-out chrF quality", "quality")]
    notes = ("Translation task sampled at temperature 0.6; one warm start per seed shared by all arms. Fit: "
             "training chrF reward against mean token entropy over the run, R = -a exp(H) + b.")
    write_study(out, study, title="Entropy collapse and its controls", columns=[
        "quality_final", "entropy_first", "entropy_final", "fit_a", "fit_b", "fit_r2"], plots=plots, notes=notes)
    print(open(os.path.join(out, "results.md")).read())
    return study


if __name__ == "__main__":
    main()
