"""Entropy-collapse study: RL from a warm start with healthy entropy, pushed to collapse by its causes, with
no control against eleven controls and the documented pause-and-rollback, on 3-digit addition.

    python experiments/entropy_collapse.py --jobs 2            # 13 arms x 3 seeds -> runs/entropy_collapse/results.md
                                                               # (two one-core processes: about 112 min on 2 cores)
    python experiments/entropy_collapse.py --arms none,adaptive_temperature --seeds 3,4
    python experiments/entropy_collapse.py --smoke             # seconds; what the tests run

Setting: the default experiment's model and warm start (supervised to 30% validation accuracy; mean token
entropy about 0.2-0.3 nats at the start of RL; one warm start, seed --warm-seed (default --seed), shared by
every seed and arm, so that seeds vary the RL alone; --warm-seed -1 gives each seed its own), then GRPO with
the causes of collapse the arms fight: a learning rate too high (LR, 5x the default) and a dense 0/1 correctness reward.
Arms: `none`; `entropy_bonus_warmup`; `adaptive_coef`; `adaptive_temperature`; `per_token_temperature`;
`clip_higher`; `clip_cov`; `kl_cov`; `lower_lr` (LR_LOW, a tenth of LR); `higher_kl` (beta BETA); `top_entropy`
(the policy loss on the top TOP_ENTROPY fraction of tokens by entropy, Wang et al. 2025); `top_entropy_kl` (the
same, with a KL penalty of beta BETA_TOP_ENTROPY to the warm start); and
`pause_rollback`: the median-entropy alarm pauses the run, and the rollback command of its report (which
switches adaptive temperature on) resumes it with LR_LOW added (`--set optim.lr=...`: adaptive temperature alone
let seed 1 fall to 0.069x after its rollback; the lower lr is the control that held the median on every seed).
Not run by default (`--arms kl_passk`): KL beta BETA_PASSK with the pass@k advantage, k PASS_K (Chen et al.
2025), which holds the median but trails `none`'s accuracy on seeds 0 and 2 (docs/measurements.md §10-§11).

Reported per arm and seed: accuracy_start, accuracy_final (the mean of the evaluations of the last
FINAL_WINDOW steps: one evaluation moved by up to 11 points between steps 250 and 300), accuracy_last,
entropy_first / entropy_final (mean token entropy), entropy_p50_first / entropy_p50_final (median), the fit
of training correctness against mean entropy R = -a exp(H) + b (Cui et al. 2025), and whether the run paused /
where it rolled back to. Greedy accuracy scores the policy's mode only; the pass@k of the finished runs
(samples at temperature 1, from their final checkpoints) is `experiments/pass_at_k.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from grpo_jax import presets
from grpo_jax.config import MonitorConfig, TrainConfig, override, to_dict
from grpo_jax.study import Arm, compare_arms, last_mean, launch, plot_curves, warm_start_note, write_study

# The history of each choice below (what was tried, on which seeds) is in docs/measurements.md §6-§11.
LR = 5e-4  # 5x the default experiment's lr: with the dense 0/1 reward, what pushes `none` to collapse
LR_LOW = 5e-5  # lower_lr, and the lr after the rollback: at 1e-4 the median entropy still fell to 0.22-0.25x (§8)
BETA = 0.5  # higher_kl: the beta search's pick on seed 0 (§6)
STEPS = 500  # at 300 steps `none` had not finished collapsing: seed 1 ended at 0.111x, still falling (§7)
EVAL_EVERY = 25
FINAL_WINDOW = 100  # accuracy_final: the mean of the evaluations in the last FINAL_WINDOW steps (425-500)
TOP_ENTROPY = 0.2  # loss.top_entropy_quantile of the top_entropy arm (Wang et al. 2025 train on the top 20%)
# top_entropy_kl: the top 20% alone ended at 0.275-0.37x; KL 0.5 alone held the median but cost 3-4 points (§11)
BETA_TOP_ENTROPY = 0.1
# kl_passk, chosen on seed 1: pass@k alone let the median fall; beta 0.2-0.5 held it but cost accuracy (§6, §8, §9)
BETA_PASSK, PASS_K = 0.1, 4
REWARDS = json.dumps([{"name": "math", "weight": 1.0}])  # dense 0/1 correctness, nothing else


def _median_pause_rules() -> str:
    """The default rules with the median-entropy alarm pausing (the mean hides this collapse)."""
    rules = [dataclasses.replace(r, action="pause") if r.name == "entropy_median_collapse" else r
             for r in MonitorConfig().rules]
    return json.dumps(to_dict(MonitorConfig(rules=tuple(rules)))["rules"])


ARMS = {
    "none": Arm(),
    "entropy_bonus_warmup": Arm(("entropy.mode=warmup", "entropy.coef=0.02", "entropy.warmup_start=0",
                                 "entropy.warmup_steps=50")),
    "adaptive_coef": Arm(("entropy.mode=adaptive", "entropy.coef=0.01", "entropy.target_entropy=0.2",
                          "entropy.max_coef=0.2", "entropy.adapt_rate=0.1")),
    "adaptive_temperature": Arm(("temperature.mode=adaptive", "temperature.entropy_floor=0.15",
                                 "temperature.max_temp=1.5")),
    # floor at the near-zero threshold: only the collapsed tokens are heated (a floor of 0.05 with boost 2
    # heated half the tokens at the start and cost accuracy in exploration: docs/measurements.md §4)
    "per_token_temperature": Arm(("sampling.token_entropy_floor=0.01", "sampling.token_boost=1.5",
                                  "sampling.token_max_temperature=1.5")),
    "clip_higher": Arm(("loss.eps_high=0.28",)),
    "clip_cov": Arm(("loss.policy_loss=clip_cov",)),
    "kl_cov": Arm(("loss.policy_loss=kl_cov",)),
    "lower_lr": Arm((f"optim.lr={LR_LOW}",)),
    "higher_kl": Arm((f"loss.beta={BETA}",)),
    "top_entropy": Arm((f"loss.top_entropy_quantile={TOP_ENTROPY}",)),
    "top_entropy_kl": Arm((f"loss.top_entropy_quantile={TOP_ENTROPY}", f"loss.beta={BETA_TOP_ENTROPY}")),
    "pause_rollback": Arm((f"monitor.rules={_median_pause_rules()}", "checkpoint.every=25",
                           "checkpoint.keep_last=20"), on_pause=("monitor.collapse_action=warn",
                                                                 "monitor.rules=[]", f"optim.lr={LR_LOW}")),
}
EXTRA_ARMS = {  # run by name only (--arms kl_passk)
    "kl_passk": Arm((f"loss.beta={BETA_PASSK}", "advantage.estimator=passk", f"advantage.pass_k={PASS_K}")),
}


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/entropy_collapse.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    return override(presets.collapse_study(smoke, steps=STEPS, eval_every=EVAL_EVERY, smoke_steps=3),
                    [f"optim.lr={LR}", f"rewards.specs={REWARDS}"])


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
    evals = [r for r in rows if "eval/accuracy" in r]
    fit = fit_entropy_law([r["entropy/mean"] for r in train], [r["reward/math/mean"] for r in train])
    last = max(r["step"] for r in rows)
    final = [r["eval/accuracy"] for r in evals[1:] if r["step"] > last - FINAL_WINDOW]
    final = final or [evals[-1]["eval/accuracy"]]
    out = {"accuracy_start": evals[0]["eval/accuracy"], "accuracy_final": float(np.mean(final)),
           "accuracy_last": evals[-1]["eval/accuracy"], "accuracy_final_evals": len(final),
           "accuracy_best": max(r["eval/accuracy"] for r in evals),
           "entropy_first": train[0]["entropy/mean"], "entropy_final": last_mean(rows, "entropy/mean", 10),
           "entropy_p50_first": train[0]["entropy/p50"], "entropy_p50_final": last_mean(rows, "entropy/p50", 10),
           **fit}
    out["entropy_ratio"] = out["entropy_final"] / out["entropy_first"]
    out["entropy_p50_ratio"] = out["entropy_p50_final"] / out["entropy_p50_first"]
    return out


CONTROLS_NEEDED = 2  # controls that must hold entropy and accuracy on every seed
HELD = 0.3  # a control holds entropy when it ends at >= HELD x its start
COLLAPSED = 0.1  # `none` has collapsed when it ends under COLLAPSED x its start


def verdict(results: dict, measure: str = "entropy_p50") -> dict:
    """The study's acceptance, judged from its figures on `measure` (entropy_p50: median; entropy: mean).

    - collapse: `none` ends under COLLAPSED x its first value on every seed;
    - controls: the arms (not `none`, not `pause_rollback`) that end at >= HELD x their start on every seed
      with accuracy_final no lower than `none`'s on that seed; the study needs CONTROLS_NEEDED of them;
    - pause_rollback: every seed paused, rolled back, and ended with the measure back at >= COLLAPSED x its
      start (the alarm's own threshold no longer holds).
    Seeds missing from `none` make the per-seed comparisons fail rather than pass."""
    ratio = lambda r: r[f"{measure}_final"] / r[f"{measure}_first"]  # noqa: E731
    none = {r["seed"]: r for r in results.get("none", [])}
    out = {"measure": measure, "none_ratio": {s: ratio(r) for s, r in none.items()}}
    out["collapse"] = bool(none) and all(v < COLLAPSED for v in out["none_ratio"].values())
    holding = {}
    for arm, runs in results.items():
        if arm in ("none", "pause_rollback") or not runs:
            continue
        ok = [r["seed"] in none and ratio(r) >= HELD and r["accuracy_final"] >= none[r["seed"]]["accuracy_final"]
              for r in runs]
        if all(ok) and {r["seed"] for r in runs} >= set(none):
            holding[arm] = [round(ratio(r), 3) for r in runs]
    out["controls"] = holding
    pauses = results.get("pause_rollback", [])
    out["pause_rollback"] = bool(pauses) and all(
        r.get("paused_at") is not None and r.get("rolled_back_to") is not None and ratio(r) >= COLLAPSED
        for r in pauses)
    out["holds"] = out["collapse"] and len(holding) >= CONTROLS_NEEDED and out["pause_rollback"]
    return out


def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS,
                 default_out="runs/entropy_collapse", summarize=summarize,
                 warm=presets.SFT, smoke_warm=presets.SFT_SMOKE,
                 extra_arms=EXTRA_ARMS)
    args, cfg, out, arms, warm_seed, study = run.args, run.cfg, run.out, run.arms, run.warm_seed, run.study
    study["verdict"] = verdict(study["results"])
    study["settings"] = {"lr": LR, "lr_lower_lr": LR_LOW, "lr_after_rollback": LR_LOW, "beta_higher_kl": BETA,
                         "top_entropy_quantile": TOP_ENTROPY,
                         "beta_top_entropy_kl": BETA_TOP_ENTROPY,
                         "beta_kl_passk": BETA_PASSK, "pass_k_kl_passk": PASS_K,
                         "steps": cfg.steps, "rewards": REWARDS, "eval_every": EVAL_EVERY, "final_window": FINAL_WINDOW}
    plots = [plot_curves(out, arms, "entropy/mean", "mean token entropy (nats)", "entropy", log=True),
             plot_curves(out, arms, "entropy/p50", "median token entropy (nats)", "entropy_median", log=True),
             plot_curves(out, arms, "eval/accuracy", "held-out accuracy", "accuracy"),
             plot_curves(out, arms, "reward/math/adv_corr", "corr(correctness, A)", "adv_corr_math")]
    notes = (f"3-digit addition; {warm_start_note(warm_seed)}; then {cfg.steps} "
             f"GRPO steps at lr {LR} with a 0/1 correctness reward. accuracy_final is the mean of the held-out "
             f"evaluations (500 problems, greedy, every {EVAL_EVERY} steps) in the last {FINAL_WINDOW} steps; "
             "accuracy_last is the single last one. Fit: training correctness against mean token "
             "entropy over the run, R = -a exp(H) + b.")
    columns = ["accuracy_start", "accuracy_final", "accuracy_last", "entropy_first", "entropy_final",
               "entropy_p50_first", "entropy_p50_final", "fit_a", "fit_b", "fit_r2"]
    v = study["verdict"]
    notes += (f"\n\nAcceptance on the median entropy: `none` under {COLLAPSED}x on every seed: {v['collapse']} "
              f"({', '.join(f'seed {s}: {x:.3f}x' for s, x in v['none_ratio'].items())}); controls at >= {HELD}x on "
              f"every seed with accuracy no lower than `none`: {sorted(v['controls']) or 'none'} (needed "
              f"{CONTROLS_NEEDED}); pause_rollback paused, rolled back and recovered on every seed: "
              f"{v['pause_rollback']}. Holds: {v['holds']}.")
    write_study(out, study, title="Entropy collapse and its controls", columns=columns, plots=plots, notes=notes,
                seed_columns=["accuracy_start", "accuracy_final", "accuracy_last", "entropy_ratio",
                              "entropy_p50_ratio", "paused_at", "rolled_back_to"],
                comparison=compare_arms(out, arms, study["seeds"], baseline="none"))
    print(open(os.path.join(out, "results.md")).read())
    return study


if __name__ == "__main__":
    main()
