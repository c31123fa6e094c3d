"""Reward collapse, second study: a correct answer ties with a wrong one under the sum; does GDPO's per-dimension
normalisation, which breaks those ties for the correct one, end with a higher held-out accuracy?

    python experiments/reward_ties.py --jobs 2      # the pre-registered arms and seeds -> runs/reward_ties
    python experiments/reward_ties.py --smoke       # seconds; what the tests run

A stopped study resumes with the same command (finished runs kept, a stopped run from its newest checkpoint).

Setting (the one `experiments/reward_ties_gate.py` measured before anything was pre-registered: its second round,
`experiments/results/reward_ties/gate_weak/`, where this style met the gate's criteria G1-G3 and not G4):
Countdown (`presets.countdown`: 3 numbers in 1..50, target <= 100, at least two solutions per problem), each seed
its own supervised warm start stopped at its first validation check at or above WARM_ACCURACY greedy accuracy,
shared by its arms, then STEPS GRPO steps at T = 1, PROMPTS prompts x GROUP samples, with two binary rewards at
weight 1: `countdown` (the answer is correct) and STYLE, `length_budget` at BUDGET tokens (the completion is short:
about half of all attempts are, correct or not). Under the sum a correct answer that is too long ties with a wrong
one that is short; GDPO z-scores each reward in its group, so when correctness is further from half its group than
brevity is, it puts the correct one first (the gate measured 64% of those ties broken for the correct completion,
28% for the wrong one). The gate's tabular simulation predicted gdpo - grpo of +0.9 points, under its 2-point
criterion: this study tests that prediction in real training, where both rewards move shared weights.

Arms: `grpo` (sum, then group z-score), `gdpo` (each reward z-scored in its group, summed, batch-normalised),
`per_dim` (per-reward advantages: two unit-variance z-scores with no batch step, so up to twice GRPO's step at one
lr), `conditioned` (grpo with brevity paying only on a correct answer) and `null` (grpo with only its rollout key
changed: the noise floor). Each fix is compared with `grpo`.

Evaluation: greedy on N_EVAL held-out problems per seed (the seed's own draw, the same for every arm of the seed) at
the start and the end. Primary: `accuracy_final`. Secondary: brevity's satisfaction and joint success (correct and
short) at the end; over the training steps, the collapse ratio and each reward's within-group corr(r_k, A).

Rules (PREREGISTERED.md): the paired t-test over seeds, Holm over the arms of each table, TOST at +-SESOI, the null
arm's noise floor (`study.compare_seeds(sesoi=...)`); a run is broken when its final greedy accuracy is below
BROKEN_FRAC of its own start: the primary analysis keeps every run, the secondary drops the seeds where any arm broke.
"""

from __future__ import annotations

import json

from grpo_jax import presets
from grpo_jax.cli import for_people
from grpo_jax.config import TrainConfig, override
from grpo_jax.reporting import plot_curves, write_study
from grpo_jax.study import Arm, last_mean, launch, preregistered_comparisons, publish, warm_start_note

STEPS = 100
EVAL_EVERY = 100  # greedy at the start and the end only
N_EVAL = 2000
CHECKPOINT_EVERY = 50
PROMPTS, GROUP = 16, 16  # 256 rollouts a step, groups of 16 (the gate's)
BUDGET = 31  # tokens, end of sequence included (the sampler's count)
SMOKE_BUDGET = 20  # smoke scale: random completions of 1..40 tokens, so brevity varies within groups
WARM_ACCURACY = 0.15  # the gate's second-round warm start
DIMS = ("countdown", "length_budget")
SESOI = 0.02  # 2 points of held-out accuracy: the gate's smallest effect of interest
BROKEN_FRAC = 0.5
PRIMARY = ("gdpo", "per_dim", "conditioned")
SEEDS = tuple(range(1301, 1313))  # fixed in PREREGISTERED.md before any of them ran
ARCHIVE_KEYS = ("eval/", "collapse/ratio", "length/mean", "grad_norm",
                *(f"reward/{d}/{k}" for d in DIMS for k in ("adv_corr_within", "zero_var_frac_per_dim", "mean")))
METRICS = ("accuracy_final", "style_final", "joint_final")


DEVIATIONS = ("Deviation from the pre-registration: the runs trained with its commit's code (ee74274); this report was "
              "written by --summarize-only at a later commit (results.json), which adds descriptive columns that were "
              "not pre-registered (correct_train_last, length_train_last: training means over the last 10 steps; "
              "no_signal_steps: steps with grad_norm 0) and archives the metrics they read; every pre-registered "
              "figure is computed as at ee74274.")


def rewards(budget: int = BUDGET, *, conditioned: bool = False) -> str:
    """The study's reward specs as JSON: correctness and brevity at `budget` tokens, weight 1 each; with
    `conditioned`, brevity pays only when the answer is correct."""
    style = {"name": "length_budget", "kwargs": {"budget": budget}, "weight": 1.0,
             **({"when": "countdown"} if conditioned else {})}
    return json.dumps([{"name": "countdown", "weight": 1.0}, style])


def arms(budget: int) -> dict:
    """The pre-registered arms, brevity at `budget` tokens (the study's, or the smoke scale's)."""
    return {"grpo": Arm(), "gdpo": Arm(("advantage.estimator=gdpo",)),
            "per_dim": Arm(("advantage.estimator=per_dim",)),
            "conditioned": Arm((f"rewards.specs={rewards(budget, conditioned=True)}",)),
            "null": Arm(("sampling.key_offset=1",))}


ARMS, SMOKE_ARMS = arms(BUDGET), arms(SMOKE_BUDGET)
WARM, SMOKE_WARM = ({**w, "target_accuracy": WARM_ACCURACY}
                    for w in (presets.COUNTDOWN_SFT, presets.COUNTDOWN_SFT_SMOKE))


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/reward_ties.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    cfg = presets.countdown_study(smoke, steps=STEPS, eval_every=EVAL_EVERY, n_eval=N_EVAL, eval_samples=0,
                                  checkpoint_every=CHECKPOINT_EVERY)
    if smoke:
        return override(cfg, [f"rewards.specs={rewards(SMOKE_BUDGET)}"])
    return override(cfg, [f"rewards.specs={rewards()}", f"prompts_per_step={PROMPTS}", f"sampling.group_size={GROUP}"])


def summarize(rows: list[dict]) -> dict:
    """One run's figures: the greedy evaluations at the start and the end, the collapse measures over its steps."""
    evals = [r for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if "collapse/ratio" in r]
    out = {}
    for when, ev in (("start", evals[0]), ("final", evals[-1])):
        out[f"accuracy_{when}"] = ev["eval/accuracy"]
        out[f"style_{when}"] = ev.get("eval/satisfied/length_budget")
        out[f"joint_{when}"] = ev.get("eval/satisfied_all")
    out["collapse_ratio"] = last_mean(train, "collapse/ratio", None)
    for d in DIMS:
        out[f"corr_within_{d}"] = last_mean(train, f"reward/{d}/adv_corr_within", None)
        out[f"varies_{d}"] = 1.0 - last_mean(train, f"reward/{d}/zero_var_frac_per_dim", None)
    out["broken"] = bool(out["accuracy_final"] < BROKEN_FRAC * out["accuracy_start"])
    # descriptive, added after the runs (not pre-registered): how a run lost correctness in training
    out["correct_train_last"] = last_mean(train, "reward/countdown/mean", 10)
    out["length_train_last"] = last_mean(train, "length/mean", 10)
    out["no_signal_steps"] = sum(1 for r in train if r.get("grad_norm", 1.0) == 0.0)
    return out


@for_people
def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS, smoke_arms=SMOKE_ARMS,
                 default_out="runs/reward_ties", summarize=summarize, warm=WARM, smoke_warm=SMOKE_WARM,
                 warm_seed_default=-1, default_seeds=SEEDS)
    cfg, out, arms, study = run.cfg, run.out, run.arms, run.study
    comparisons = preregistered_comparisons(study, baseline="grpo", metrics=METRICS, primary=PRIMARY, sesoi=SESOI)
    secondary = study["secondary_without_broken"]
    study["settings"] = {"steps": cfg.steps, "budget": BUDGET, "warm_accuracy": WARM_ACCURACY, "sesoi": SESOI,
                         "broken_frac": BROKEN_FRAC, "primary": list(PRIMARY), "n_eval": cfg.task.n_eval}
    plots = [plot_curves(out, arms, "eval/accuracy", "held-out greedy accuracy", "accuracy"),
             plot_curves(out, arms, "collapse/ratio", "collapse ratio (rollouts)", "collapse_ratio")]
    plots += [plot_curves(out, arms, f"reward/{d}/adv_corr_within", f"within-group corr({d}, A)", f"corr_{d}")
              for d in DIMS]
    plots += [plot_curves(out, arms, "reward/countdown/mean", "correct completions in training (T = 1)",
                          "correct_train"),
              plot_curves(out, arms, "length/mean", "completion length in training (tokens)", "length_train")]
    notes = (f"Countdown, {warm_start_note(run.warm_seed, WARM_ACCURACY)}; {cfg.steps} GRPO steps at T = 1; rewards "
             f"`countdown` and `length_budget` at {SMOKE_BUDGET if run.args.smoke else BUDGET} tokens, weight 1 each, "
             f"{cfg.prompts_per_step} prompts x {cfg.sampling.group_size} samples a step. Greedy figures on "
             f"{cfg.task.n_eval} held-out problems per seed; brevity (`style`) in `conditioned` pays only on a correct "
             "answer in training, and is scored the same way there in evaluation.\n\n"
             "Primary: accuracy_final, each fix against `grpo`: "
             + ", ".join(f"{a} {d}" for a, d in study["verdict"].items())
             + f". Broken runs (final greedy < {BROKEN_FRAC} x start): "
             + (", ".join(f"{a} {s}" for a, s in study["broken"].items() if s) or "none")
             + "; without the seeds they touch: "
             + (", ".join(f"{a} {e['decision']}" for a, e in secondary["arms"].items()) or "nothing to compare") + "."
             + ("" if run.args.smoke else "\n\n" + DEVIATIONS))
    columns = ["accuracy_start", "accuracy_final", "style_start", "style_final", "joint_final", "collapse_ratio",
               *(f"corr_within_{d}" for d in DIMS)]
    write_study(out, study, title="Reward collapse, second study: ties that GDPO breaks", columns=columns,
                plots=plots, notes=notes, seed_comparisons=comparisons,
                seed_columns=["accuracy_start", "accuracy_final", "style_final", "joint_final", "broken",
                              "correct_train_last", "length_train_last", "no_signal_steps"])
    publish(out, arms, study["seeds"], metric_keys=ARCHIVE_KEYS)
    return study


if __name__ == "__main__":
    main()
