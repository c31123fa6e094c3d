"""Entropy collapse, second study: does a control keep what the policy can solve, measured where guessing cannot win?

    python experiments/entropy_coverage.py --jobs 2      # the pre-registered arms and seeds 501-510
    python experiments/entropy_coverage.py --smoke       # seconds; what the tests run

A stopped study resumes with the same command (finished runs kept, a stopped run from its newest checkpoint).

Setting: the first entropy study's (`experiments/entropy_collapse.py`), where RL without a control collapses: Countdown
(`presets.countdown`), each seed its own supervised warm start shared by its arms, STEPS GRPO steps at lr LR with
MINIBATCHES optimizer updates per rollout, rewards correct + format. Evaluation on N_EVAL held-out problems: greedy every
EVAL_EVERY steps, EVAL_SAMPLES samples per problem at T = 1 at the start and the end.

Why a new primary metric: at T = 1 with 16 samples, a policy that ignores the target and draws a trace uniformly
(the guesser, `tasks.countdown.random_trace_pass_at_k`, exact) already scores ~0.8 pass@16 on these problems, about
what the warm start scores, so pass@16 mostly measures how random a policy still is. The primary metric is pass@K
(K = 4) at T = 1, where the warm start is far from 1 and the guesser well below it; the guesser's exact pass@K on
each seed's held-out problems is reported beside every arm. Secondary: greedy accuracy, pass@1 and pass@16 at T = 1,
Cover@0.5 (problems that at least half the samples solve, which a guesser almost never reaches), distinct correct
solutions per problem counted by the canonical answer (`eval/t1/distinct_solutions`, not strings), reasoning-token
entropy at the start and the end.

Arms (experiments/results/entropy_coverage/PREREGISTERED.md): `none`; `kl_ref` (KL to the warm start, beta 0.1: the
first study's result, tested again on new seeds and the new metric); `w_reinforce` (negative-sample reinforcement:
positive advantages scaled by 0.1, W-REINFORCE of Zhu et al. 2025, whose evidence is pass@k kept at large k); `null`
(`none` with only its rollout key changed: the noise floor).

Rules fixed in advance: a run is broken when its final greedy accuracy is below BROKEN_FRAC of its own start (the
policy forgot the task); the primary analysis keeps every run, the secondary drops the seeds where either arm of a
comparison broke. Each comparison with `none` is a paired t over seeds, Holm over the arms of its table, an
equivalence test at +-SESOI (`study.compare_seeds(sesoi=...)`), beside the `null` arm's noise floor.
"""

from __future__ import annotations


import numpy as np

from grpo_jax import presets
from grpo_jax.cli import for_people
from grpo_jax.config import TrainConfig, override
from grpo_jax.reporting import plot_curves, plot_pass_at_k, write_study
from grpo_jax.study import Arm, launch, preregistered_comparisons, publish, warm_start_note
from grpo_jax.tasks import get_task
from grpo_jax.tasks.countdown import random_trace_pass_at_k

LR = 4e-4
MINIBATCHES = 2
STEPS = 200
EVAL_EVERY = 50
N_EVAL = 500
EVAL_SAMPLES = 16
CHECKPOINT_EVERY = 50
K = 4  # the primary pass@K
BETA_KL = 0.1
W_REINFORCE = 0.1  # Zhu et al. 2025's lambda: positive samples' weight
REASONING_ENTROPY = "entropy_t1/reasoning/mean"
BROKEN_FRAC = 0.5
SESOI = 0.05  # 5 points of pass@4: the smallest effect the study cares about
PRIMARY = ("kl_ref", "w_reinforce")
SEEDS = (501, 502, 503, 504, 505, 506, 507, 508, 509, 510)  # fixed in PREREGISTERED.md before any of them ran
ARMS = {"none": Arm(), "null": Arm(("sampling.key_offset=1",)), "kl_ref": Arm((f"loss.beta={BETA_KL}",)),
        "w_reinforce": Arm((f"advantage.pos_scale={W_REINFORCE}",))}
ARCHIVE_KEYS = ("eval/", REASONING_ENTROPY)  # what summarize and the plots read: committed per run
METRICS = ("passk_final", "greedy_final", "pass1_final", "pass16_final", "cover_final", "solutions_final",
           "entropy_final")


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/entropy_coverage.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    cfg = presets.countdown_study(smoke, steps=STEPS, eval_every=EVAL_EVERY, n_eval=N_EVAL,
                                  eval_samples=EVAL_SAMPLES, checkpoint_every=CHECKPOINT_EVERY)
    return override(cfg, [f"optim.lr={LR}", f"minibatches={MINIBATCHES}"])


def summarize(rows: list[dict]) -> dict:
    """One run's figures at the start and the end (the greedy and the T = 1 evaluations) and its entropy."""
    evals = [r for r in rows if "eval/accuracy" in r]
    sampled = [r for r in evals if "eval/t1/pass@1" in r]
    train = [r for r in rows if REASONING_ENTROPY in r]
    out = {}
    for when, ev, t1 in (("start", evals[0], sampled[0] if sampled else {}),
                         ("final", evals[-1], sampled[-1] if sampled else {})):
        out[f"greedy_{when}"] = ev["eval/accuracy"]
        out[f"pass1_{when}"] = t1.get("eval/t1/pass@1")
        out[f"passk_{when}"] = t1.get(f"eval/t1/pass@{K}")
        out[f"pass16_{when}"] = t1.get(f"eval/t1/pass@{EVAL_SAMPLES}")
        out[f"cover_{when}"] = t1.get("eval/t1/cover@0.5")
        out[f"solutions_{when}"] = t1.get("eval/t1/distinct_solutions")
        out[f"strings_{when}"] = t1.get("eval/t1/distinct_correct")
    h = [r[REASONING_ENTROPY] for r in train]
    out["entropy_first"] = float(np.mean(h[:5])) if h else float("nan")
    out["entropy_final"] = float(np.mean(h[-5:])) if h else float("nan")
    out["broken"] = bool(out["greedy_final"] < BROKEN_FRAC * out["greedy_start"])
    return out


def guesser(cfg: TrainConfig, seeds) -> dict:
    """{seed: {"pass@K", "pass@16"}}: the guesser's exact pass@k, mean over the seed's held-out problems."""
    task = get_task(cfg.task.name, **dict(cfg.task.options))
    out = {}
    for s in seeds:
        rows = task.generate("heldout", cfg.task.n_eval, seed=s)
        out[s] = {f"pass@{k}": float(np.mean([random_trace_pass_at_k(r["numbers"], r["target"], k) for r in rows]))
                  for k in (K, EVAL_SAMPLES)}
    return out


@for_people
def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS, default_out="runs/entropy_coverage",
                 summarize=summarize, warm=presets.COUNTDOWN_SFT, smoke_warm=presets.COUNTDOWN_SFT_SMOKE,
                 warm_seed_default=-1, default_seeds=SEEDS)
    cfg, out, arms, study = run.cfg, run.out, run.arms, run.study
    comparisons = preregistered_comparisons(study, baseline="none", metrics=METRICS, primary=PRIMARY, sesoi=SESOI)
    secondary = study["secondary_without_broken"]
    study["guesser"] = guesser(cfg, study["seeds"])
    study["settings"] = {"lr": LR, "minibatches": MINIBATCHES, "steps": cfg.steps, "k": K, "sesoi": SESOI,
                         "broken_frac": BROKEN_FRAC, "beta_kl": BETA_KL, "w_reinforce": W_REINFORCE,
                         "primary": list(PRIMARY), "n_eval": cfg.task.n_eval, "eval_samples": cfg.logging.eval_samples}
    g = study["guesser"]
    guess = {k: float(np.mean([v[k] for v in g.values()])) for k in (f"pass@{K}", f"pass@{EVAL_SAMPLES}")}
    plots = [plot_curves(out, arms, REASONING_ENTROPY, "reasoning-token entropy at T = 1 (nats)", "entropy_reasoning",
                         log=True),
             plot_curves(out, arms, "eval/accuracy", "held-out greedy accuracy", "accuracy"),
             plot_pass_at_k(out, arms, study["seeds"])]
    notes = (f"Countdown, {warm_start_note(run.warm_seed)}; {cfg.steps} GRPO steps at lr {LR}, {MINIBATCHES} updates "
             f"per rollout; {cfg.logging.eval_samples} samples at T = 1 on {cfg.task.n_eval} held-out problems per seed. "
             f"The guesser (a uniformly drawn trace, exact) scores pass@{K} {guess[f'pass@{K}']:.3f} and "
             f"pass@{EVAL_SAMPLES} {guess[f'pass@{EVAL_SAMPLES}']:.3f} on these problems (mean over seeds).\n\n"
             f"Primary: passk_final (pass@{K} at T = 1 at the end), each primary arm against `none`: "
             + ", ".join(f"{a} {d}" for a, d in study["verdict"].items())
             + f". Broken runs (final greedy < {BROKEN_FRAC} x start): "
             + (", ".join(f"{a} {s}" for a, s in study["broken"].items() if s) or "none")
             + f"; without the seeds they touch: "
             + ", ".join(f"{a} {e['decision']}" for a, e in secondary["arms"].items()) + ".")
    columns = ["passk_start", "passk_final", "pass1_final", "pass16_final", "cover_final", "solutions_final",
               "strings_final", "greedy_start", "greedy_final", "entropy_first", "entropy_final"]
    write_study(out, study, title="Entropy collapse, second study: coverage that guessing cannot win", columns=columns,
                plots=plots, notes=notes, seed_comparisons=comparisons,
                seed_columns=["passk_final", "greedy_final", "cover_final", "solutions_final", "broken"])
    publish(out, arms, study["seeds"], metric_keys=ARCHIVE_KEYS)
    return study


if __name__ == "__main__":
    main()
