"""The reward-ties study's gate: is GDPO's mechanism there on the warm start, before anything is pre-registered?

    python experiments/reward_ties_gate.py          # ~10 min on 2 cores -> experiments/results/reward_ties/gate/
    python experiments/reward_ties_gate.py --smoke  # seconds; what the tests run
    python experiments/reward_ties_gate.py --target-accuracy 0.15 --out experiments/results/reward_ties/gate_weak \
        --runs runs/reward_ties_gate_weak             # the second round: a weaker warm start, the same rule
    python experiments/reward_ties_gate.py --round 3 --out experiments/results/reward_ties/gate_mul  # third round

Setting (the reward-ties study's): Countdown with 3 numbers in 1..50 and at least two solutions per problem, a
supervised warm start to 30% greedy validation accuracy, and two binary rewards at weight 1: `countdown` (the answer
is correct) and a style reward that any attempt can meet but a correct answer only on some problems, so that under
the sum a correct completion without the style ties with a wrong one with it. GDPO z-scores each reward in its group
first, so it breaks that tie for the correct completion when correctness is further from half its group than the
style is, and for the wrong one when it is the other way round; which happens on this warm start is what the gate
measures. The candidate styles (STYLES), in the order they joined the gate:
- `length_budget` at BUDGETS tokens (EOS included): brevity. A wrong completion can always be short; a correct one
  in the task's format fits a tight budget only where the problem's numbers write short. Measured first, alone:
  no budget passed (GATE.md keeps that table).
- `countdown_ops` with ops OPS: the answer, over exactly the given numbers, uses only those operators. Any attempt
  can; a correct answer only where the problem has a solution in them. Added after the brevity budgets failed.
- `countdown_ops` with uses `*` (any operators, at least one multiplication): the answer multiplies. Any attempt
  can; a correct answer only where the problem has a solution with a product, and both earlier rounds measured
  that the warm start's correct answers almost all use only + and -, while many of its attempts multiply: the
  shape the first two rounds' conclusion asked for (a style near half of all attempts that correct answers mostly
  lack). Added after the second round failed.

Measured on the warm start of GATE_SEED (an exploration seed, not one of the study's), SAMPLES completions at T = 1 for
each of PROBLEMS training problems (split into groups of GROUP, as GRPO sees them), for each candidate style:
- the rate of each reward, and the share of problems with a correct completion that has the style;
- `grpo_jax.orderings.pair_orderings`: the within-group pairs GRPO ties and GDPO orders, GDPO's reversals, and
  for pairs of one correct and one wrong completion, which one each estimator puts first;
- `grpo_jax.orderings.simulate`: a tabular policy per problem started at its observed outcome rates, trained STEPS
  steps by grpo, gdpo, per_dim and the conditioned reward (brevity counts only when correct), SIM_SEEDS simulation
  seeds; the lr calibrated so that GRPO on correctness alone gains CALIBRATION_GAIN in STEPS steps (the T = 1
  pass@1 gain the earlier reward study's `grpo` arm measured over its 100 steps, a comparable warm start and lr), and
  reported at half and twice that lr. The prediction is the mean probability of a correct outcome at the end.

The rule, fixed in this file before the first measurement ran, the same for every candidate: a style passes when
  G1 correctness at T = 1 is between 0.10 and 0.40;
  G2 GRPO ties at least 10% of the pairs of one correct and one wrong completion;
  G3 of those ties GDPO puts the correct one first at least twice as often as the wrong one;
  G4 the simulation predicts gdpo - grpo >= SESOI (2 points) at the calibrated lr, mean over simulation seeds.
The study goes on with the passing style of the largest G4 prediction; with none, the gate says so and the study
stops there (a finished result of its own).

The second round (`--target-accuracy 0.15`, after every candidate failed at the 30% warm start): the supervised
warm start stops at the first validation check at or above 15% greedy accuracy, so that correctness at T = 1 is
rarer. The third round adds the multiplication candidate and measures all candidates on the preset's 30% warm start
first (`gate_mul/`); only if none passes there, on the 15% warm start as well; the study takes the first warm start
where a candidate passes. GDPO breaks a correct-without-style / wrong-with-style tie for the correct completion when
correctness is further from half its group than the style is: a rarer correctness makes that hold for styles near one half
(brevity at the looser budgets). The candidates and the rule are the same. Written: gate.json (every figure, the rule's verdict, provenance) and
GATE.md.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

from grpo_jax import experience, orderings, presets
from grpo_jax.assemble import assemble
from grpo_jax.cli import for_people
from grpo_jax.config import override
from grpo_jax.fileio import atomic_write_text
from grpo_jax.provenance import result_provenance
from grpo_jax.rewards import REWARDS
from grpo_jax.study import kept_warm_start

GATE_SEED = 41
PROBLEMS = 256
SAMPLES = 64
GROUP = 16
BUDGETS = (29, 30, 31, 32)
OPS = ("+*", "+-", "-*")
STYLES = {**{f"length_budget<={b}": ("length_budget", {"budget": b}) for b in BUDGETS},
          **{f"countdown_ops={ops}": ("countdown_ops", {"ops": ops}) for ops in OPS},
          "countdown_ops uses *": ("countdown_ops", {"ops": "+-*/", "uses": "*"})}
STEPS = 100
SIM_SEEDS = (0, 1, 2, 3, 4)
CALIBRATION_GAIN = 0.224  # experiments/results/reward_collapse: grpo's pass1_t1 0.200 -> 0.424, mean of 8 seeds
SESOI = 0.02
ESTIMATORS = ("grpo", "gdpo", "per_dim", "conditioned")
HISTORY = ("The `length_budget` rows were first measured alone, at commit ada41a6 (same warm start, same samples), "
           "and failed the rule; the `countdown_ops` candidates were added after.")
HISTORY_WEAK = ("The second round: every candidate had failed on the 30% warm start (`../gate/`), so the same "
                "candidates and rule were measured on a weaker warm start of the same seed, the supervised warm start "
                "stopping at its first validation check at or above 15%.")
HISTORY_MUL = ("The third round: both earlier rounds failed (`../gate/`, `../gate_weak/`); the `countdown_ops uses *` "
               "candidate (the answer multiplies) was added and every candidate measured again under the same rule, "
               "on the 30% warm start (`../gate_mul/`) and then on the 15% one (`../gate_mul_weak/`); the earlier "
               "candidates' rows repeat the earlier rounds' measurements to the last digit (both warm starts were retrained).")
HISTORIES = {1: HISTORY, 2: HISTORY_WEAK, 3: HISTORY_MUL}  # --round: the history GATE.md states


def conditioned(classes_CxK: np.ndarray) -> np.ndarray:
    """The conditioned reward: the style (column 1) counts only when correct (column 0)."""
    return np.stack([classes_CxK[:, 0], classes_CxK[:, 0] * classes_CxK[:, 1]], axis=1)


def sample(cfg, runs: str, n_problems: int, n_samples: int, smoke: bool, target_accuracy: float | None = None):
    """(correct [P, N], {style name: satisfied [P, N]}, lengths [P, N], warm-start summary) of n_samples completions at
    T = 1 per training problem, from the warm start of cfg.seed (trained, or read back from `runs`/warm_start) to
    `target_accuracy` (the preset's when None)."""
    sft = presets.countdown_sft(smoke) | ({"target_accuracy": target_accuracy} if target_accuracy else {})
    n_valid = sft.pop("n_valid")
    params, summary = kept_warm_start(cfg, os.path.join(runs, "warm_start"), n_valid, sft)
    parts = assemble(override(cfg, [f"sampling.group_size={n_samples}"]))
    rows = parts.rows[:n_problems]
    exp = experience.experience(parts.actor, params, rows, jax.random.key(cfg.seed + 1), temperature=1.0)
    correct = exp.rewards[..., parts.actor.dims.index("countdown")]
    lengths = np.asarray(exp.rollout.lengths)
    samples = [dict(row, response_length=int(n)) for row, ln in zip(rows, lengths) for n in ln]
    styles = {name: np.array([REWARDS[fn](text, s, **kw).score for text, s in zip(exp.texts, samples)],
                             np.float64).reshape(lengths.shape) for name, (fn, kw) in STYLES.items()}
    return np.asarray(correct, np.float64), styles, lengths, summary


def measure(correct_PxN: np.ndarray, style_PxN: np.ndarray, name: str, *, group: int, steps: int,
            sim_seeds, gain: float) -> dict:
    """Every figure of one candidate style (module docstring)."""
    rewards = np.stack([correct_PxN, style_PxN], axis=-1)  # [P, N, 2]
    groups = rewards.reshape(-1, group, 2)  # consecutive samples of a problem form its groups
    out = {"style": name, "rate_correct": float(rewards[..., 0].mean()), "rate_style": float(rewards[..., 1].mean()),
           "rate_correct_style": float((rewards[..., 0] * rewards[..., 1]).mean()),
           "problems_with_correct_style": float((rewards[..., 0] * rewards[..., 1]).max(axis=1).mean()),
           "problems_with_correct": float(rewards[..., 0].max(axis=1).mean())}
    out["pairs"] = orderings.pair_orderings(groups, [1.0, 1.0], correct=0)
    classes, probs = orderings.outcome_classes(rewards)
    out["sim_start_correct"] = orderings.rate(probs, classes, 0)
    try:
        lr = orderings.calibrate_lr(probs, classes, correct=0, gain=gain, steps=steps, group=group, seed=sim_seeds[0])
    except ValueError as e:  # e.g. a warm start with almost no correct completion: nothing to predict from
        return {**out, "sim_lr": None, "sim_error": str(e), "sim": {}, "predicted_gdpo_minus_grpo": float("nan")}
    out["sim_lr"] = lr
    sim = {}
    for scale in (0.5, 1.0, 2.0):
        for est in ESTIMATORS:
            finals = []
            for s in sim_seeds:
                p = orderings.simulate(probs, classes, [1.0, 1.0], estimator="grpo" if est == "conditioned" else est,
                                       lr=lr * scale, steps=steps, group=group, seed=s,
                                       reward_of=conditioned if est == "conditioned" else None)
                finals.append((orderings.rate(p, classes, 0), orderings.rate(p, classes, 1)))
            f = np.array(finals)
            sim[f"{scale:g}x/{est}"] = {"correct": float(f[:, 0].mean()), "correct_sd": float(f[:, 0].std()),
                                        "short": float(f[:, 1].mean())}
    out["sim"] = sim
    out["predicted_gdpo_minus_grpo"] = sim["1x/gdpo"]["correct"] - sim["1x/grpo"]["correct"]
    return out


def rule(m: dict) -> dict:
    """The gate's four criteria for one candidate's figures (module docstring)."""
    p = m["pairs"]
    checks = {"G1": 0.10 <= m["rate_correct"] <= 0.40, "G2": p["mixed_grpo_ties"] >= 0.10,
              "G3": p["tie_gdpo_prefers_correct"] >= 2 * p["tie_gdpo_prefers_wrong"],
              "G4": m["predicted_gdpo_minus_grpo"] >= SESOI}
    return {**checks, "passes": all(checks.values())}


def gate_markdown(result: dict) -> str:
    rows = ["| style | correct | style | correct & style | problems w/ correct & style | mixed pairs GRPO ties | "
            "of those GDPO: correct first / wrong first | GDPO reverses | sim correct at the end: grpo / gdpo / "
            "per_dim / conditioned (start) | predicted gdpo - grpo | G1 G2 G3 G4 |", "|" + "---|" * 11]
    for m in result["styles"]:
        p, s, v = m["pairs"], m["sim"], m["rule"]
        sims = " / ".join(f"{s[f'1x/{e}']['correct']:.3f}" for e in ESTIMATORS) if s else m["sim_error"]
        rows.append(f"| `{m['style']}` | {m['rate_correct']:.3f} | {m['rate_style']:.3f} | "
                    f"{m['rate_correct_style']:.3f} | {m['problems_with_correct_style']:.3f} | "
                    f"{p['mixed_grpo_ties']:.3f} | "
                    f"{p['tie_gdpo_prefers_correct']:.3f} / {p['tie_gdpo_prefers_wrong']:.3f} | {p['reversed']:.4f} | "
                    f"{sims} ({m['sim_start_correct']:.3f}) | {m['predicted_gdpo_minus_grpo']:+.3f} | "
                    f"{' '.join('y' if v[g] else 'n' for g in ('G1', 'G2', 'G3', 'G4'))} |")
    chosen = result["chosen_style"]
    verdict = (f"The gate passes: the study goes on with `{chosen}`." if chosen is not None else
               "The gate fails: no candidate style meets all four criteria, so the study stops here.")
    return "\n".join(["# Reward ties: the gate, measured on the warm start before pre-registration", "",
                      f"`{result['provenance']['command']}` at commit {result['provenance']['git']['commit']}.", "",
                      f"Warm start of seed {result['seed']} ({result['warm_start']}); {result['problems']} training "
                      f"problems x {result['samples']} samples at T = 1, groups of {result['group']}; simulation: "
                      f"{result['steps']} "
                      f"steps, lr calibrated to a {CALIBRATION_GAIN:.3f} gain of GRPO on correctness alone, mean of "
                      f"{len(result['sim_seeds'])} simulation seeds (half and twice that lr in gate.json).", "",
                      *rows, "", verdict, "", result["history"], ""])


@for_people
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="experiments/results/reward_ties/gate", help="gate.json and GATE.md")
    ap.add_argument("--runs", default="runs/reward_ties_gate", help="the warm start, kept for a rerun")
    ap.add_argument("--smoke", action="store_true", help="a tiny warm start and sample: seconds")
    ap.add_argument("--target-accuracy", type=float, default=None,
                    help="the warm start's greedy validation target (default: the preset's 0.30)")
    ap.add_argument("--round", type=int, choices=(1, 2, 3), default=None,
                    help="the round whose history GATE.md states (default 2 with --target-accuracy, else 1)")
    args = ap.parse_args(argv)
    problems, samples, steps = (8, 32, 5) if args.smoke else (PROBLEMS, SAMPLES, STEPS)
    cfg = override(presets.countdown_study(args.smoke, steps=STEPS, eval_every=STEPS, n_eval=8, eval_samples=0),
                   [f"seed={GATE_SEED}"])
    correct, styles, lengths, warm = sample(cfg, args.runs, problems, samples, args.smoke, args.target_accuracy)
    sim_seeds = SIM_SEEDS[:2] if args.smoke else SIM_SEEDS
    measured = []
    for name, style in styles.items():
        m = measure(correct, style, name, group=GROUP, steps=steps, sim_seeds=sim_seeds, gain=CALIBRATION_GAIN)
        m["rule"] = rule(m)
        measured.append(m)
    passing = [m for m in measured if m["rule"]["passes"]]
    chosen = max(passing, key=lambda m: m["predicted_gdpo_minus_grpo"])["style"] if passing else None
    result = {"seed": GATE_SEED, "problems": problems, "samples": samples, "group": GROUP, "steps": steps,
              "sim_seeds": list(sim_seeds), "calibration_gain": CALIBRATION_GAIN, "sesoi": SESOI,
              "warm_start": f"{warm['sft_steps']} supervised steps, validation accuracy "
                            f"{warm['sft_valid_accuracy']:.3f}",
              "target_accuracy": args.target_accuracy or presets.countdown_sft(args.smoke)["target_accuracy"],
              "length_mean": float(lengths.mean()), "styles": measured, "chosen_style": chosen,
              "spec": dict(zip(("name", "kwargs"), STYLES[chosen])) if chosen else None,
              "history": HISTORIES[args.round or (2 if args.target_accuracy else 1)],
              "provenance": result_provenance()}
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, "gate.json"), json.dumps(result, indent=1, sort_keys=True))
    atomic_write_text(os.path.join(args.out, "GATE.md"), gate_markdown(result))
    print(gate_markdown(result))
    return result


if __name__ == "__main__":
    main()
