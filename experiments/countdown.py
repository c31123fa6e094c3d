"""Countdown: a from-scratch model learns to combine 3 numbers into a target, a task with several solution
paths, supervised on solver traces drawn at random among each problem's solutions, then improved by GRPO
with correctness + format rewards. 2 CPU cores, no network.

    python experiments/countdown.py                           # writes runs/countdown/report.md
    python experiments/countdown.py --seed 1 --out runs/countdown-s1
    python experiments/countdown.py --smoke                   # seconds; what the tests run

Reported on 2,000 held-out problems the training never sees: greedy accuracy, and with 16 samples per
problem at T = 1 the unbiased pass@1 .. pass@16 and the number of distinct correct solutions, at the start
(after the warm start) and the end; the policy's own T = 1 entropy of reasoning, answer and other tokens;
each reward's satisfaction and their joint success. Settings: `grpo_jax.presets.countdown`.
"""

from __future__ import annotations

from grpo_jax import presets
from grpo_jax.config import TrainConfig
from grpo_jax.evaluation import sampled_k
from grpo_jax.experiment import Clock, Spec, run, summed_over

def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/countdown.py [--smoke] [--seed S] [--out DIR] [--set KEY=VALUE ...]"""
    return presets.countdown(smoke)


def figures(evals: list[dict], train: list[dict]) -> dict:
    """What this task adds to the report: the sampled evaluation at the start and the end (pass@1 and
    pass@k at T = 1, distinct correct solutions per problem, joint success) and the policy's own entropy of
    reasoning tokens over the run."""
    sampled = [r for r in evals if "eval/t1/pass@1" in r]
    k = sampled_k(sampled[-1] if sampled else {})  # logging.eval_samples
    out = {"eval_samples": k}
    for when, row in (("sft", sampled[0] if sampled else {}), ("final", sampled[-1] if sampled else {})):
        out.update({f"pass1_t1_{when}": row.get("eval/t1/pass@1"), f"pass{k}_t1_{when}": row.get(f"eval/t1/pass@{k}"),
                    f"distinct_correct_{when}": row.get("eval/t1/distinct_correct"),
                    f"satisfied_all_{when}": row.get("eval/satisfied_all")})
    reasoning = [r["entropy_t1/reasoning/mean"] for r in train if "entropy_t1/reasoning/mean" in r]
    out.update(reasoning_entropy_first=reasoning[0] if reasoning else None,
               reasoning_entropy_final=reasoning[-1] if reasoning else None)
    # tokens inside <think> per rollout: the step's mean length x the reasoning share of its completion tokens
    think = [r["length/mean"] * r["entropy_t1/reasoning/num_tokens"] / r["entropy_t1/num_tokens"] for r in train
             if r.get("entropy_t1/num_tokens")]
    out.update(reasoning_tokens_first=think[0] if think else None, reasoning_tokens_final=think[-1] if think else None)
    return out


def problem_figures(rows: list[dict]) -> dict:
    """The held-out set's own figures: its size and the solver's distinct solutions per problem."""
    counts = [r["n_solutions"] for r in rows if "n_solutions" in r]
    return {"heldout_problems": len(rows), "solutions_per_problem": sum(counts) / len(counts) if counts else None}


def targets(s: dict) -> list[tuple[str, bool]]:
    """The task's properties at the start and GRPO's gain (see docs/measurements.md for the measurements)."""
    k, p1, pk = s["eval_samples"], s.get("pass1_t1_sft") or 0.0, s.get(f"pass{s['eval_samples']}_t1_sft") or 0.0
    solutions, think = s.get("solutions_per_problem") or 0.0, s.get("reasoning_tokens_first") or 0.0
    return [
        (f"distinct solutions per held-out problem = {solutions:.2f} >= 3", solutions >= 3),
        (f"reasoning tokens per rollout at the start = {think:.1f} >= 15", think >= 15),
        (f"warm start pass@1 at T = 1 = {p1:.3f} in [0.15, 0.40]", 0.15 <= p1 <= 0.40),
        (f"warm start pass@{k} = {pk:.3f} >= 1.5 x pass@1 = {1.5 * p1:.3f}", pk >= 1.5 * p1 and p1 > 0),
        (f"accuracy_final - accuracy_sft = {s['accuracy_final'] - s['accuracy_sft']:+.3f} >= 0.10",
         s["accuracy_final"] - s["accuracy_sft"] >= 0.10 - 1e-9),
        (f"wall_seconds = {s['wall_seconds']:.0f}{summed_over(s)} <= 1200", s["wall_seconds"] <= 1200),
    ]


SPEC = Spec(title="GRPO on Countdown (several solution paths)", default_out="runs/countdown",
            sft=presets.countdown_sft, targets=targets, figures=figures, problem_figures=problem_figures)


def main(argv=None) -> dict:
    return run(argv, doc=__doc__, get_config=get_config, spec=SPEC, clock=Clock.process())


if __name__ == "__main__":
    main()
