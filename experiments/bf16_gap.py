"""The sampler-trainer gap in bfloat16: the default experiment with bf16 params and matmuls for 200 GRPO steps,
the gap logged every step, without and with the token-level correction.

    python experiments/bf16_gap.py                       # 3 arms x 3 seeds -> runs/bf16_gap/results.md
    python experiments/bf16_gap.py --arms plain,tis --seeds 0
    python experiments/bf16_gap.py --smoke               # seconds; what the tests run

Arms (one warm start, trained in bf16, shared by every arm and seed):
- `plain`: the default objective, pi_old = the sampler's own logprobs (no correction possible: the gap is
  measured by an extra teacher-forced pass every step, `logging.gap_every=1`);
- `recompute`: pi_old = the trainer's teacher-forced logprobs (`sampling.old_logp_source=recompute`), no
  correction: the rollout's tokens are weighed as if the trainer had sampled them;
- `tis`: as `recompute`, with token-level truncated importance sampling, weight min(pi_old / pi_sampler, 2)
  (`loss.tis_cap=2`).

Reported per arm and seed: accuracy_start / accuracy_final, mean and median token entropy first / final,
and the gap over the run: gap_abs_logp (mean |log pi_trainer - log pi_sampler| per token), gap_kl (k3),
gap_ratio_max (largest token ratio seen), gap_token_out_frac (tokens outside [1/2, 2]), is_weight (tis).
"""

from __future__ import annotations

import os

import numpy as np

from grpo_jax import presets
from grpo_jax.cli import for_people
from grpo_jax.config import TrainConfig, override
from grpo_jax.reporting import plot_curves, write_study
from grpo_jax.study import RECOMPUTE, Arm, last_mean, launch, warm_start_note

STEPS = 200
EVAL_EVERY = 50
TIS_CAP = 2.0
ARMS = {
    "plain": Arm(),
    "recompute": Arm((RECOMPUTE,)),
    "tis": Arm((RECOMPUTE, f"loss.tis_cap={TIS_CAP}")),
}


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/bf16_gap.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    return override(presets.study(smoke, steps=STEPS, eval_every=EVAL_EVERY),
                    ["model.param_dtype=bfloat16", "model.dtype=bfloat16", "logging.gap_every=1"])


def _over_run(rows: list[dict], key: str, reduce=np.mean) -> float:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return float(reduce(values)) if values else float("nan")


def summarize(rows: list[dict]) -> dict:
    train = [r for r in rows if "entropy/mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    return {"accuracy_start": evals[0]["eval/accuracy"], "accuracy_final": evals[-1]["eval/accuracy"],
            "entropy_first": train[0]["entropy/mean"], "entropy_final": last_mean(rows, "entropy/mean", 10),
            "entropy_p50_first": train[0]["entropy/p50"], "entropy_p50_final": last_mean(rows, "entropy/p50", 10),
            "gap_abs_logp": _over_run(rows, "gap/abs_logp"), "gap_kl": _over_run(rows, "gap/kl"),
            "gap_ratio_max": _over_run(rows, "gap/ratio_max", np.max),
            "gap_token_out_frac": _over_run(rows, "gap/token_out_frac"),
            "is_weight": _over_run(rows, "is_weight")}


@for_people
def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS,
                 default_out="runs/bf16_gap", summarize=summarize,
                 warm=presets.SFT, smoke_warm=presets.SFT_SMOKE)
    args, cfg, out, arms, warm_seed, study = run.args, run.cfg, run.out, run.arms, run.warm_seed, run.study
    study["settings"] = {"steps": cfg.steps, "param_dtype": cfg.model.param_dtype, "dtype": cfg.model.dtype,
                         "tis_cap": TIS_CAP}
    plots = [plot_curves(out, arms, "gap/abs_logp", "mean |log pi_trainer - log pi_sampler|", "gap_abs_logp",
                         log=True),
             plot_curves(out, arms, "gap/kl", "KL(sampler || trainer), k3 per token", "gap_kl", log=True),
             plot_curves(out, arms, "eval/accuracy", "held-out accuracy", "accuracy"),
             plot_curves(out, arms, "entropy/mean", "mean token entropy (nats)", "entropy", log=True)]
    notes = (f"The default experiment (3-digit addition) with bfloat16 params and matmuls; "
             f"{warm_start_note(warm_seed)}; then {cfg.steps} GRPO steps with the gap measured every step (a "
             "teacher-forced pass over the rollout's tokens with the params that sampled them).")
    columns = ["accuracy_start", "accuracy_final", "entropy_first", "entropy_final", "entropy_p50_final",
               "gap_abs_logp", "gap_kl", "gap_ratio_max", "gap_token_out_frac", "is_weight"]
    write_study(out, study, title="The sampler-trainer gap in bfloat16", columns=columns, plots=plots, notes=notes,
                seed_columns=["accuracy_start", "accuracy_final", "gap_abs_logp", "gap_kl", "gap_ratio_max"])
    print(open(os.path.join(out, "results.md")).read())
    return study


if __name__ == "__main__":
    main()
