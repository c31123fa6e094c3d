"""Reward-collapse study on Countdown, faithful to GDPO (Liu et al. 2026, arXiv 2601.05242): several binary rewards
at equal weight, rollouts at the default temperature, GRPO's sum-then-normalise against per-dimension
normalisation and a conditioned reward, judged on held-out joint success.

    python experiments/reward_collapse.py --jobs 2       # the pre-registered runs -> runs/reward_collapse/results.md
    python experiments/reward_collapse.py --arms per_dim,low_easy --seeds 201,202,203   # exploratory arms
    python experiments/reward_collapse.py --smoke        # seconds; what the tests run

A stopped study (a working period ends, kill -9) resumes with the same command: finished runs are kept, a
stopped run continues from its newest checkpoint (every CHECKPOINT_EVERY steps).

Setting: Countdown (3 numbers in 1..50, target <= 100, >= 2 solutions per problem), each seed its own supervised
warm start (to 30% validation accuracy) shared by that seed's arms, then STEPS GRPO steps at T = 1 with four
binary rewards at weight 1 (DIMS): `countdown` (the answer reaches the target using each number once),
`countdown_numbers` (the answer uses exactly the given numbers, whatever its value: the easy dimension),
`countdown_steps` with first=1 (the thinking starts with a valid step: an exact operation on two given numbers;
about 4% of rollouts at the start, the rare one) and `length_budget` (the completion is at most BUDGET tokens: 76%
of held-out problems have a solution that fits and 30% have some that fit and some that do not, so it rewards
choosing a shorter solution path; a policy can also meet it by writing shorter, wrong steps). Joint success (all
four satisfied) is a correct answer within the budget whose thinking starts with a valid step.

Arms (the pre-registered ones run by default): `grpo` (sum, then group z-score), `gdpo` (each dimension z-scored
in its group, summed, batch-normalised), `per_dim` (per-dimension advantages), `conditioned` (grpo with
`countdown_numbers`, `countdown_steps` and `length_budget` counting only when `countdown` is satisfied: GDPO's
conditioned reward) and `null` (grpo with only its rollout key changed: the noise floor). Run by name only
(exploratory): `low_easy` (grpo with the easy dimension's weight lowered to LOW_EASY_WEIGHT) and `hot_reload` (the
same weight lowered by rewriting the weights file at step RELOAD_AT, as a researcher would mid-run).

Reported per arm and seed (results.json, results.md, plots/): greedy joint success, accuracy and each
dimension's satisfaction at the start and the end; pass@1 and pass@EVAL_SAMPLES and joint success at T = 1 at
the start and the end; over the run, the collapse ratio (distinct reward vectors per distinct advantage) and per
dimension the within-group corr(r_k, A) and the share of groups where the dimension varies. Comparisons with
`grpo` are paired t-intervals over seeds, beside the noise floor of `null` (`study.compare_seeds`); VERDICT
names the pre-registered criterion, judged in results.md.
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
from grpo_jax.study import Arm, compare_seeds, last_mean, launch, warm_start_note

STEPS = 100
EVAL_EVERY = 50
N_EVAL = 1000
EVAL_SAMPLES = 4
CHECKPOINT_EVERY = 50
BUDGET = 31  # tokens, end of sequence included (the sampler's count)
SMOKE_BUDGET = 20  # smoke scale: random completions of 1..40 tokens, so the dimension varies within groups
LOW_EASY_WEIGHT = 0.25
RELOAD_AT = 50
DIMS = ("countdown", "countdown_numbers", "countdown_steps", "length_budget")
EASY = "countdown_numbers"
PRIMARY = ("gdpo", "per_dim", "conditioned")  # the fixes compared with grpo; `null` gives the noise floor
# The confirmatory seeds, fixed in PREREGISTERED.md before any of them ran (exploration used seeds 2-5)
SEEDS = (201, 202, 203, 204, 205, 206, 207, 208)


def rewards(budget: int = BUDGET, *, conditioned: bool = False, easy_weight: float = 1.0) -> str:
    """The study's reward specs as JSON: DIMS at weight 1 (EASY at `easy_weight`); with `conditioned`, every
    dimension but `countdown` counts only when `countdown` is satisfied."""
    specs = [{"name": d, "weight": easy_weight if d == EASY else 1.0} for d in DIMS]
    for s in specs:
        if s["name"] == "length_budget":
            s["kwargs"] = {"budget": budget}
        if s["name"] == "countdown_steps":
            s["kwargs"] = {"first": 1}
        if conditioned and s["name"] != "countdown":
            s["when"] = "countdown"
    return json.dumps(specs)


def arms(budget: int) -> tuple[dict, dict]:
    """(the arms run by default: the pre-registered ones, the arms run by name only), at `budget`."""
    default = {
        "grpo": Arm(),
        "gdpo": Arm(("advantage.estimator=gdpo",)),
        "per_dim": Arm(("advantage.estimator=per_dim",)),
        "conditioned": Arm((f"rewards.specs={rewards(budget, conditioned=True)}",)),
        "null": Arm(("sampling.key_offset=1",)),
    }
    extra = {
        "low_easy": Arm((f"rewards.specs={rewards(budget, easy_weight=LOW_EASY_WEIGHT)}",)),
        "hot_reload": Arm(reload_at=RELOAD_AT, reload_weights=((EASY, LOW_EASY_WEIGHT),)),
    }
    return default, extra


ARMS, EXTRA_ARMS = arms(BUDGET)
SMOKE_ARMS, SMOKE_EXTRA_ARMS = arms(SMOKE_BUDGET)
SMOKE_EXTRA_ARMS["hot_reload"] = Arm(reload_at=1, reload_weights=((EASY, LOW_EASY_WEIGHT),))


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/reward_collapse.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    cfg = presets.countdown_study(smoke, steps=STEPS, eval_every=EVAL_EVERY, n_eval=N_EVAL,
                                  eval_samples=EVAL_SAMPLES, checkpoint_every=CHECKPOINT_EVERY)
    return override(cfg, [f"rewards.specs={rewards(SMOKE_BUDGET if smoke else BUDGET)}"])


def summarize(rows: list[dict]) -> dict:
    """One run's figures: greedy and T = 1 evaluations at the start and the end, and the collapse measures
    averaged over every training step."""
    evals = [r for r in rows if "eval/satisfied_all" in r]
    sampled = [r for r in evals if "eval/t1/pass@1" in r]
    train = [r for r in rows if "collapse/ratio" in r]
    k = sampled_k(sampled[-1] if sampled else {})  # logging.eval_samples
    out = {}
    for when, ev, t1 in (("start", evals[0], sampled[0] if sampled else {}),
                         ("final", evals[-1], sampled[-1] if sampled else {})):
        out[f"joint_{when}"] = ev["eval/satisfied_all"]
        out[f"accuracy_{when}"] = ev["eval/accuracy"]
        for d in DIMS:
            out[f"{d}_{when}"] = ev.get(f"eval/satisfied/{d}")
        out[f"joint_t1_{when}"] = t1.get("eval/t1/satisfied_all")
        out[f"pass1_t1_{when}"] = t1.get("eval/t1/pass@1")
        out[f"passk_t1_{when}"] = t1.get(f"eval/t1/pass@{k}")
    out["eval_samples"] = k
    out["collapse_ratio"] = last_mean(train, "collapse/ratio", None)
    out["collapse_ratio_max"] = max((r["collapse/ratio"] for r in train), default=float("nan"))
    for d in DIMS:
        out[f"corr_within_{d}"] = last_mean(train, f"reward/{d}/adv_corr_within", None)
        out[f"varies_{d}"] = 1.0 - last_mean(train, f"reward/{d}/zero_var_frac_per_dim", None)
    out["length_final"] = last_mean(train, "length/mean", 10)
    return out


DROWNED_CORR = 0.2  # a dimension is drowned under grpo when its within-group corr(r_k, A) is below this ...
VARIES = 0.05  # ... while it varies within at least this share of groups (both: run means, mean over seeds)


def verdict(results: dict, comparison: dict) -> dict:
    """The pre-registered criterion (experiments/results/reward_collapse/PREREGISTERED.md), from the figures:
    - collapse: grpo's run-mean collapse_ratio > 1 on every seed;
    - drowned: the dimensions whose grpo corr_within (mean over seeds) is below DROWNED_CORR while they vary
      in at least VARIES of groups (mean over seeds); at least one is needed;
    - fixes: the PRIMARY arms whose paired 95% t-interval of joint_final - grpo's excludes 0 from above and
      whose mean difference exceeds the noise floor (`stats.verdict` == "win"); at least one is needed.
    `survives_bonferroni` lists the winning arms whose Bonferroni interval also excludes 0."""
    grpo = results.get("grpo", [])
    out = {"collapse_ratio": {r["seed"]: r["collapse_ratio"] for r in grpo}}
    out["collapse"] = bool(grpo) and all(r["collapse_ratio"] > 1.0 for r in grpo)
    drowned = {}
    for d in DIMS:
        corr = float(np.mean([r[f"corr_within_{d}"] for r in grpo])) if grpo else float("nan")
        varies = float(np.mean([r[f"varies_{d}"] for r in grpo])) if grpo else float("nan")
        if corr < DROWNED_CORR and varies >= VARIES:
            drowned[d] = {"corr_within": corr, "varies": varies}
    out["drowned"] = drowned
    arms = comparison.get("arms", {})
    out["fixes"] = [a for a in PRIMARY if arms.get(a, {}).get("verdict") == "win"]
    out["survives_bonferroni"] = [a for a in out["fixes"] if arms[a]["adjusted"]["low"] > 0]
    out["holds"] = out["collapse"] and bool(drowned) and bool(out["fixes"])
    return out


@for_people
def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS, smoke_arms=SMOKE_ARMS,
                 default_out="runs/reward_collapse", summarize=summarize, warm=presets.COUNTDOWN_SFT,
                 smoke_warm=presets.COUNTDOWN_SFT_SMOKE, extra_arms=EXTRA_ARMS, smoke_extra_arms=SMOKE_EXTRA_ARMS,
                 warm_seed_default=-1, default_seeds=SEEDS)
    cfg, out, arms_run, study = run.cfg, run.out, run.arms, run.study
    comparisons = [compare_seeds(study["results"], baseline="grpo", metric=m, null="null",
                                 arms=[a for a in arms_run if a not in ("grpo", "null")], family=len(PRIMARY))
                   for m in ("joint_final", "accuracy_final", "countdown_steps_final", "length_budget_final",
                             "passk_t1_final")]
    study["verdict"] = verdict(study["results"], comparisons[0])
    study["settings"] = {"steps": cfg.steps, "budget": BUDGET, "dims": list(DIMS), "low_easy_weight": LOW_EASY_WEIGHT,
                         "n_eval": cfg.task.n_eval, "eval_samples": cfg.logging.eval_samples, "primary": list(PRIMARY)}
    plots = [plot_curves(out, arms_run, "eval/satisfied_all", "held-out joint success (greedy)", "joint"),
             plot_curves(out, arms_run, "eval/accuracy", "held-out accuracy (greedy)", "accuracy"),
             plot_curves(out, arms_run, "collapse/ratio", "collapse ratio (rollouts)", "collapse_ratio"),
             plot_pass_at_k(out, arms_run, study["seeds"])]
    for d in DIMS:
        plots.append(plot_curves(out, arms_run, f"eval/satisfied/{d}", f"held-out {d} satisfied", f"satisfied_{d}"))
        plots.append(plot_curves(out, arms_run, f"reward/{d}/adv_corr_within", f"within-group corr({d}, A)",
                                 f"corr_{d}"))
    v = study["verdict"]
    notes = (f"Countdown, {warm_start_note(run.warm_seed)}; {cfg.steps} GRPO steps at T = 1; rewards {', '.join(DIMS)} "
             f"(budget {BUDGET} tokens), weight 1 each. Greedy figures on {cfg.task.n_eval} held-out problems; "
             f"T = 1 figures with {cfg.logging.eval_samples} samples per problem. A gated dimension's satisfaction "
             "in `conditioned` reads 'satisfied and correct'; joint success means the same in every arm.\n\n"
             f"Pre-registered criterion: grpo collapse ratio > 1 on every seed: {v['collapse']}; a drowned dimension "
             f"(grpo corr within < {DROWNED_CORR}, varies in >= {VARIES:.0%} of groups): {sorted(v['drowned']) or 'none'}; "
             f"a primary fix ({', '.join(PRIMARY)}) wins on joint success: {v['fixes'] or 'none'} "
             f"(surviving Bonferroni: {v['survives_bonferroni'] or 'none'}). Holds: {v['holds']}.")
    columns = ["joint_start", "joint_final", "accuracy_final", "countdown_steps_final", "length_budget_final",
               "passk_t1_final", "collapse_ratio"] + [f"corr_within_{d}" for d in DIMS]
    write_study(out, study, title="Reward collapse on Countdown: sum-then-normalise against its fixes", columns=columns,
                plots=plots, notes=notes, seed_comparisons=comparisons,
                seed_columns=["joint_start", "joint_final", "accuracy_final", "countdown_steps_final",
                              "length_budget_final", "collapse_ratio"] + [f"varies_{d}" for d in DIMS])
    print(open(os.path.join(out, "results.md")).read())
    return study


if __name__ == "__main__":
    main()
