"""Entropy-collapse study on Countdown: RL pushed to collapse by its literature's causes (a high learning rate and
two optimizer updates per rollout), with no control against the controls that claim to prevent it, and the
pause-and-rollback recovery taken apart.

    python experiments/entropy_collapse.py --jobs 2            # the pre-registered arms and seeds 301-308
    python experiments/entropy_collapse.py --jobs 2 --arms pause_rollback,fixed_recovery,lr_at_alarm --seeds 301,302,303
    python experiments/entropy_collapse.py --arms none,clip_cov --seeds 3
    python experiments/entropy_collapse.py --smoke             # seconds; what the tests run

A stopped study (a working period ends, kill -9) resumes with the same command: finished runs are kept, a stopped
run continues from its newest checkpoint.

Setting: Countdown (`presets.countdown`), each seed its own supervised warm start shared by its arms, then STEPS
GRPO steps at lr LR with MINIBATCHES optimizer updates per rollout (so the probability ratio leaves 1 and the
clipping controls act), the task's rewards (correct + format). Evaluation on N_EVAL held-out problems: greedy
every EVAL_EVERY steps, EVAL_SAMPLES samples per problem at T = 1 at the start and the end.

Arms run by default (experiments/results/entropy_collapse/PREREGISTERED.md): `none`, `null` (`none` with only its
rollout key changed: the noise floor) and the PRIMARY controls `kl_ref` and `entropy_bonus_warmup`; every other
arm runs by name (exploratory). The controls
`entropy_bonus_warmup`, `adaptive_coef`, `adaptive_temperature`, `clip_higher`, `clip_cov`, `kl_cov`,
`top_entropy` (policy loss on the top 20% tokens by entropy), `kl_ref` (KL to the warm start); `lower_lr` (the
cause removed, a tenth of LR). Pause and rollback, ablated (the alarm watches reasoning-token entropy at T = 1,
ALARM_FRAC of its first value for ALARM_PATIENCE steps): `pause_rollback` (pause, roll back to the checkpoint
before the trouble, recovery = RECOVERY_CONTROL (`kl_ref`'s KL) plus the lr halved), `pause_continue` (pause, go on from the paused
step with the same recovery: no rollback), `fixed_recovery` (the recovery from step FIXED_AT, no alarm),
`lr_at_alarm` (pause, go on with the lr cut alone: no control, no rollback). The objective arms of
`grpo_jax.study.OBJECTIVE_ARMS` run here by name too, among them the staleness arms `off_policy` (one-step
off-policy rollouts) and `off_policy_tis` (the same with truncated importance sampling).

Reported per arm and seed: pass@1 and pass@EVAL_SAMPLES at T = 1 and greedy accuracy at the start and the end,
distinct correct solutions per problem, reasoning-token entropy at T = 1 at the first and last steps (and its
ratio), the fit R = -a exp(H) + b of training correctness against reasoning entropy (Cui et al. 2025), and where
an alarm paused and rolled back. Comparisons with `none` are paired t-intervals over seeds beside the `null`
arm's noise floor (`study.compare_seeds`).
"""

from __future__ import annotations

import json
import os

import numpy as np

from grpo_jax import presets
from grpo_jax.cli import for_people
from grpo_jax.config import TrainConfig, override
from grpo_jax.evaluation import sampled_k
from grpo_jax.reporting import plot_curves, plot_pass_at_k, write_study
from grpo_jax.study import Arm, compare_seeds, launch, warm_start_note

LR = 4e-4
LR_LOW = 4e-5  # lower_lr: the cause removed
MINIBATCHES = 2  # optimizer updates per rollout
STEPS = 200
EVAL_EVERY = 50
N_EVAL = 500
EVAL_SAMPLES = 16
CHECKPOINT_EVERY = 25  # the rollback needs a checkpoint from before the trouble
TOP_ENTROPY = 0.2
COV_RATIO = 0.002
BETA_KL = 0.1
REASONING_ENTROPY = "entropy_t1/reasoning/mean"
ALARM_FRAC, ALARM_PATIENCE = 0.5, 5
FIXED_AT = 50  # fixed_recovery's step: near where the alarm would fire on the exploration seed (`none`, step 43)
ADAPTIVE_TEMPERATURE = ("temperature.mode=adaptive", "temperature.entropy_floor=0.15", "temperature.max_temp=1.5")
KL_REF = (f"loss.beta={BETA_KL}",)
RECOVERY_CONTROL = KL_REF  # the control a recovery switches on: a primary control
RECOVERY_LR = LR / 2
QUIET_ALARMS = ("monitor.collapse_action=warn", "monitor.rules=[]")  # after a recovery: no second pause
DIMS = ("countdown", "format")


def alarm_rules(smoke: bool = False) -> str:
    """The pausing alarm of the pause arms: reasoning-token entropy at T = 1 under ALARM_FRAC of its first value
    for ALARM_PATIENCE steps (the default rules are replaced: their collapse alarms would pause `none` too).
    smoke: an alarm that fires at step 1 (any completion is longer than 0 tokens), to run the pause paths."""
    if smoke:
        return json.dumps([{"metric": "length/mean", "kind": "above", "threshold": 0.0, "action": "pause",
                            "name": "reasoning_entropy_collapse"}])
    return json.dumps([{"metric": REASONING_ENTROPY, "kind": "below_first_frac", "threshold": ALARM_FRAC,
                        "action": "pause", "patience": ALARM_PATIENCE, "name": "reasoning_entropy_collapse"}])


LR_CUT = (f"optim.lr={RECOVERY_LR}",)


def arms(smoke: bool = False) -> dict:
    """The study's arms (smoke: the pause arms' alarm fires at step 1, the fixed recovery starts at step 1)."""
    alarm = (f"monitor.rules={alarm_rules(smoke)}",)
    return {
        "none": Arm(),
        "null": Arm(("sampling.key_offset=1",)),
        "entropy_bonus_warmup": Arm(("entropy.mode=warmup", "entropy.coef=0.01", "entropy.warmup_steps=50")),
        "adaptive_coef": Arm(("entropy.mode=adaptive", "entropy.coef=0.005", "entropy.target_entropy=0.3",
                              "entropy.max_coef=0.05", "entropy.adapt_rate=0.05")),
        "adaptive_temperature": Arm(ADAPTIVE_TEMPERATURE),
        "clip_higher": Arm(("loss.eps_high=0.28",)),
        # the papers' ratios select one token of the ~5,000 per update here: both at 0.002 (about 10 tokens)
        "clip_cov": Arm(("loss.policy_loss=clip_cov", f"loss.clip_cov_ratio={COV_RATIO}")),
        "kl_cov": Arm(("loss.policy_loss=kl_cov", f"loss.kl_cov_ratio={COV_RATIO}")),
        "top_entropy": Arm((f"loss.top_entropy_quantile={TOP_ENTROPY}",)),
        "kl_ref": Arm(KL_REF),
        "lower_lr": Arm((f"optim.lr={LR_LOW}",)),
        "pause_rollback": Arm(alarm, on_pause=(*QUIET_ALARMS, *RECOVERY_CONTROL, *LR_CUT)),
        "pause_continue": Arm(alarm, on_pause=(*QUIET_ALARMS, *RECOVERY_CONTROL, *LR_CUT), pause_resume=True),
        "fixed_recovery": Arm(switch_at=1 if smoke else FIXED_AT, switch=(*RECOVERY_CONTROL, *LR_CUT)),
        "lr_at_alarm": Arm(alarm, on_pause=(*QUIET_ALARMS, *LR_CUT), pause_resume=True),
    }


CONTROLS = ("entropy_bonus_warmup", "adaptive_coef", "adaptive_temperature", "clip_higher", "clip_cov", "kl_cov",
            "top_entropy", "kl_ref")
PRIMARY = ("kl_ref", "entropy_bonus_warmup")  # the pre-registered controls (experiments/results/entropy_collapse/PREREGISTERED.md)
PAUSE_ARMS = ("pause_rollback", "pause_continue", "fixed_recovery", "lr_at_alarm")
SEEDS = (301, 302, 303, 304, 305, 306, 307, 308)  # confirmatory, fixed in PREREGISTERED.md before they ran


def split(all_arms: dict) -> tuple[dict, dict]:
    """(the arms run by default: `none`, `null` and the primary controls; the rest, run by name: exploratory)."""
    main = ("none", "null", *PRIMARY)
    return {a: all_arms[a] for a in main}, {a: v for a, v in all_arms.items() if a not in main}


(ARMS, EXTRA_ARMS), (SMOKE_ARMS, SMOKE_EXTRA_ARMS) = split(arms()), split(arms(smoke=True))


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/entropy_collapse.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    cfg = presets.countdown_study(smoke, steps=STEPS, eval_every=EVAL_EVERY, n_eval=N_EVAL,
                                  eval_samples=EVAL_SAMPLES, checkpoint_every=CHECKPOINT_EVERY)
    return override(cfg, [f"optim.lr={LR}", f"minibatches={MINIBATCHES}", "checkpoint.keep_last=20"])


def fit_entropy_law(h, r) -> dict:
    """Least squares R = -a exp(H) + b; returns a, b and R^2 (nan when H does not vary)."""
    x = np.exp(np.asarray(h, float))
    r = np.asarray(r, float)
    if len(x) < 3 or np.ptp(x) < 1e-9:
        return {"fit_a": float("nan"), "fit_b": float("nan"), "fit_r2": float("nan")}
    slope, b = np.polyfit(x, r, 1)
    resid = r - (slope * x + b)
    return {"fit_a": float(-slope), "fit_b": float(b), "fit_r2": float(1.0 - resid.var() / max(r.var(), 1e-12))}


def summarize(rows: list[dict]) -> dict:
    """One run's figures: the T = 1 and greedy evaluations at the start and the end, reasoning-token entropy at
    the first and last steps (means over 5 steps), and the entropy law fitted over the run."""
    evals = [r for r in rows if "eval/accuracy" in r]
    sampled = [r for r in evals if "eval/t1/pass@1" in r]
    train = [r for r in rows if REASONING_ENTROPY in r and "reward/countdown/mean" in r]
    k = sampled_k(sampled[-1] if sampled else {})  # logging.eval_samples
    out = {"eval_samples": k}
    for when, ev, t1 in (("start", evals[0], sampled[0] if sampled else {}),
                         ("final", evals[-1], sampled[-1] if sampled else {})):
        out[f"greedy_{when}"] = ev["eval/accuracy"]
        out[f"pass1_t1_{when}"] = t1.get("eval/t1/pass@1")
        out[f"passk_t1_{when}"] = t1.get(f"eval/t1/pass@{k}")
        out[f"distinct_correct_{when}"] = t1.get("eval/t1/distinct_correct")
    h = [r[REASONING_ENTROPY] for r in train]
    out["entropy_first"] = float(np.mean(h[:5])) if h else float("nan")
    out["entropy_final"] = float(np.mean(h[-5:])) if h else float("nan")
    out["entropy_ratio"] = out["entropy_final"] / out["entropy_first"] if h else float("nan")
    out.update(fit_entropy_law(h, [r["reward/countdown/mean"] for r in train]))
    return out


COLLAPSED = 0.2  # `none`'s reasoning entropy ends under this fraction of its start on every seed
CONTROLS_NEEDED = 2


def verdict(results: dict, passk: dict, greedy: dict, controls=PRIMARY) -> dict:
    """The acceptance from the figures and the comparisons with `none` (`compare_seeds` on passk_t1_final and
    greedy_final): collapse (`none` ends under COLLAPSED x its reasoning entropy on every seed and its pass@k
    below its warm start's); the `controls` (the pre-registered ones) that win on pass@k (`verdict` == "win")
    with a greedy difference no lower than minus the null arm's spread (the greedy noise floor); at least
    CONTROLS_NEEDED are needed. Other controls that pass the same rule are listed as `exploratory` (fewer seeds,
    no claim); `lower_lr` and the pause arms never count."""
    none = results.get("none", [])
    out = {"none_ratio": {r["seed"]: r["entropy_ratio"] for r in none}}
    out["collapse"] = bool(none) and all(r["entropy_ratio"] < COLLAPSED and r["passk_t1_final"] < r["passk_t1_start"]
                                         for r in none)
    floor = (greedy.get("noise_floor") or {}).get("floor")

    def held(arm: str) -> bool:
        p, g = passk.get("arms", {}).get(arm), greedy.get("arms", {}).get(arm)
        return bool(p and g and floor is not None and p["verdict"] == "win" and g["diff"]["diff"] >= -floor)

    out["controls"] = [a for a in controls if held(a)]
    out["exploratory"] = [a for a in CONTROLS if a not in controls and held(a)]
    out["holds"] = out["collapse"] and len(out["controls"]) >= CONTROLS_NEEDED
    return out


@for_people
def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS, smoke_arms=SMOKE_ARMS,
                 default_out="runs/entropy_collapse", summarize=summarize, warm=presets.COUNTDOWN_SFT,
                 smoke_warm=presets.COUNTDOWN_SFT_SMOKE, extra_arms=EXTRA_ARMS, smoke_extra_arms=SMOKE_EXTRA_ARMS,
                 warm_seed_default=-1, default_seeds=SEEDS)
    cfg, out, arms, study = run.cfg, run.out, run.arms, run.study
    others = [a for a in arms if a not in ("none", "null")]
    family = len(PRIMARY)  # the pre-registered comparisons
    passk, greedy, *rest = [compare_seeds(study["results"], baseline="none", metric=m, null="null", arms=others,
                                          family=family)
                            for m in ("passk_t1_final", "greedy_final", "pass1_t1_final", "entropy_final",
                                      "distinct_correct_final")]
    study["verdict"] = verdict(study["results"], passk, greedy)
    study["settings"] = {"lr": LR, "lr_low": LR_LOW, "minibatches": MINIBATCHES, "steps": cfg.steps,
                         "alarm": {"metric": REASONING_ENTROPY, "frac": ALARM_FRAC, "patience": ALARM_PATIENCE},
                         "recovery": [*RECOVERY_CONTROL, *LR_CUT], "fixed_at": FIXED_AT}
    plots = [plot_curves(out, arms, REASONING_ENTROPY, "reasoning-token entropy at T = 1 (nats)", "entropy_reasoning",
                         log=True),
             plot_curves(out, arms, "entropy_t1/answer/mean", "answer-token entropy at T = 1 (nats)", "entropy_answer",
                         log=True),
             plot_curves(out, arms, "eval/accuracy", "held-out greedy accuracy", "accuracy"),
             plot_pass_at_k(out, arms, study["seeds"])]
    v = study["verdict"]
    notes = (f"Countdown, {warm_start_note(run.warm_seed)}; {cfg.steps} GRPO steps at lr {LR}, {MINIBATCHES} updates "
             f"per rollout. pass@k at T = 1 with {cfg.logging.eval_samples} samples on {cfg.task.n_eval} held-out "
             f"problems.\n\nAcceptance: `none` collapses (reasoning entropy < {COLLAPSED}x and pass@k below its start "
             f"on every seed): {v['collapse']}; controls winning on pass@k with greedy within the noise: "
             f"{v['controls'] or 'none'} (needed {CONTROLS_NEEDED}). Holds: {v['holds']}.")
    columns = ["passk_t1_start", "passk_t1_final", "pass1_t1_final", "greedy_start", "greedy_final",
               "distinct_correct_final", "entropy_first", "entropy_final", "entropy_ratio", "fit_a", "fit_b", "fit_r2"]
    write_study(out, study, title="Entropy collapse on Countdown and its controls", columns=columns, plots=plots,
                notes=notes, seed_comparisons=[passk, greedy, *rest],
                seed_columns=["passk_t1_final", "greedy_final", "entropy_ratio", "paused_at", "rolled_back_to"])
    print(open(os.path.join(out, "results.md")).read())
    return study


if __name__ == "__main__":
    main()
