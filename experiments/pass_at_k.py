"""Held-out pass@k of a study's finished runs, read from their final checkpoints: what greedy accuracy hides.

    python experiments/pass_at_k.py runs/entropy_collapse --arms none,lower_lr --seeds 0,1,2 --k 8 --start

Greedy accuracy (the studies' endpoint) scores one answer per problem, the policy's mode. A collapsed policy
may keep its mode and lose the rest of its distribution, which shows in sampling: for each held-out problem
of the run (its `task.n_eval` rows, as its evaluations used) this draws k completions at temperature 1 and
reports pass@1 (the mean of the k), pass@k (at least one of the k right) and the distinct completions per
problem. It also re-scores the checkpoint greedily and reports the run's own last logged evaluation beside
it: the two are equal when the checkpoint is the run's final policy (a check of this script).

--start scores the study's warm start too (recomputed with its task's warm-start settings, seed --warm-seed), on
each seed's held-out rows. XLA:CPU's float results depend on how many threads it
splits a matrix product over, and the warm start's hundreds of steps carry such differences into which
step it stops at: run this under the same `taskset -c N` (one core) as the study was, or its greedy figure
will differ from the logged step-0 evaluation (a warning says so). Nothing under the run folders is written: each run's
config.json is read, its model assembled in memory, and the newest checkpoint restored read-only.
Writes <study>/pass_at_k.json (with --update: keeping the arms of an earlier one that this call does not
score) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import jax
import numpy as np

from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import evaluation, experience, presets
from grpo_jax.assemble import RunParts, assemble
from grpo_jax.cli import load_config
from grpo_jax.config import TrainConfig, from_dict, override
from grpo_jax.fileio import atomic_write_text
from grpo_jax.runlog import read_jsonl
from grpo_jax.study import kept_warm_start

SAMPLE_KEY = 1234  # the sampling key of every pass@k evaluation (the same draws for every arm)


def sample_scores(actor, params, rows, *, k: int, prompts_per_batch: int = 32) -> dict:
    """k completions at temperature 1 per row: pass@1 (mean of the k), pass@k (any right) and the mean number
    of distinct completion texts per row. A row is right when its primary reward is 1, as in the greedy
    evaluation (`evaluation.evaluate`)."""
    right, distinct = [], []
    for start in range(0, len(rows), prompts_per_batch):
        chunk = rows[start:start + prompts_per_batch]
        key = jax.random.fold_in(jax.random.key(SAMPLE_KEY), start)
        ro = experience.rollout(actor, params, chunk, key, group_size=k, temperature=1.0)
        scored = experience.score(actor, chunk, ro)
        r, texts = scored.rewards, scored.texts
        right.append(r[:, :, 0] >= 1.0 - 1e-6)
        distinct += [len(set(texts[i * k:(i + 1) * k])) for i in range(len(chunk))]
    ok = np.concatenate(right)
    return {"pass1_t1": float(ok.mean()), f"pass{k}_t1": float(ok.any(axis=1).mean()),
            "distinct_completions": float(np.mean(distinct))}


def restore_policy(run_dir: str) -> tuple[RunParts, object, int]:
    """(the parts of a run of the config the run's newest checkpoint was written under (a recovery switched on
    mid-run, e.g. a KL reference, changes the state that config.json describes), that checkpoint's policy
    params, its step). The run folder is only read."""
    with ckpt_lib.Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        meta = ckpt.read_meta()
        parts = assemble(from_dict(TrainConfig, meta["config"]))
        state, _, step = ckpt.restore(parts.state_target(), step=meta["step"])
    return parts, parts.policy_params(state), step


def _figures(parts: RunParts, params, run_dir: str, *, k: int, step: int, pick) -> dict:
    """sample_scores and the greedy accuracy of `params` on the run's held-out rows, beside the run's own
    logged evaluation that `pick` (min or max by step) chooses: the first for the warm start, the last for a
    checkpoint."""
    figures = sample_scores(parts.actor, params, parts.eval_rows, k=k)
    figures["greedy"] = evaluation.evaluate(parts.actor, params, parts.eval_rows)["eval/accuracy"]
    logged = pick((r for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if "eval/accuracy" in r),
                  key=lambda r: r["step"])
    return {**figures, "step": step, "greedy_logged": logged["eval/accuracy"], "greedy_logged_step": logged["step"]}


def score_run(run_dir: str, *, k: int) -> dict:
    """pass@k figures of the newest checkpoint of one finished run, plus its greedy accuracy and the run's
    own last logged evaluation (they must agree)."""
    parts, params, step = restore_policy(run_dir)
    return _figures(parts, params, run_dir, k=k, step=step, pick=max)


def warm_params(run_dir: str, *, warm_seed: int, smoke: bool):
    """The study's warm start (recomputed with the config of the run in `run_dir`, seed `warm_seed` and the
    warm-start settings of its task: Countdown's, else the arithmetic ones)."""
    cfg = load_config(os.path.join(run_dir, "config.json"))
    sft = presets.countdown_sft(smoke) if cfg.task.name == "countdown" else presets.sft(smoke)
    n_valid = sft.pop("n_valid")
    with tempfile.TemporaryDirectory() as scratch:
        params, _ = kept_warm_start(override(cfg, [f"seed={warm_seed}"]), scratch, n_valid, sft)
    return params


def score_start(run_dir: str, params, *, k: int) -> dict:
    """The same figures for the warm start `params`, on the held-out rows of the run in `run_dir` (its seed);
    greedy_logged is that run's step-0 evaluation (the warm start's greedy accuracy as the run measured it)."""
    parts = assemble(load_config(os.path.join(run_dir, "config.json")))
    return _figures(parts, params, run_dir, k=k, step=0, pick=min)


def table(results: dict, k: int) -> str:
    lines = [f"| arm | seed | greedy (logged) | pass@1, T=1 | pass@{k}, T=1 | distinct of {k} |",
             "|---|---|---|---|---|---|"]
    for arm, runs in results.items():
        for r in runs:
            lines.append(f"| {arm} | {r['seed']} | {100 * r['greedy']:.1f} ({100 * r['greedy_logged']:.1f}) | "
                         f"{100 * r['pass1_t1']:.1f} | {100 * r[f'pass{k}_t1']:.1f} | "
                         f"{r['distinct_completions']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="a study's output folder (<study>/<arm>/seed<s>/ with checkpoints)")
    ap.add_argument("--arms", required=True, metavar="A1,A2,...")
    ap.add_argument("--seeds", default="0,1,2", metavar="S1,S2,...")
    ap.add_argument("--k", type=int, default=8, help="completions per problem (default 8)")
    ap.add_argument("--start", action="store_true", help="also score the warm start (as arm 'start')")
    ap.add_argument("--warm-seed", type=int, default=0, help="the warm start's seed (the studies' default: 0)")
    ap.add_argument("--smoke", action="store_true", help="the runs are a --smoke study's (its warm start)")
    ap.add_argument("--update", action="store_true",
                    help="keep the other arms of an existing <study>/pass_at_k.json (same k) and replace these")
    args = ap.parse_args(argv)
    if args.k < 1:
        raise SystemExit(f"--k must be >= 1, got {args.k}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    missing = [os.path.join(args.study, a, f"seed{s}") for a in arms for s in seeds
               if not os.path.isdir(os.path.join(args.study, a, f"seed{s}", "checkpoints"))]
    if missing:
        raise SystemExit(f"pass_at_k: no checkpoints in {', '.join(missing)}")
    path = os.path.join(args.study, "pass_at_k.json")
    results = {}
    if args.update and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("k") != args.k:
            raise SystemExit(f"pass_at_k --update: {path} has k = {old.get('k')}, not --k {args.k}")
        results = old["results"]
    if args.start:
        params = warm_params(os.path.join(args.study, arms[0], f"seed{seeds[0]}"), warm_seed=args.warm_seed,
                             smoke=args.smoke)
        results["start"] = [{"seed": s, **score_start(os.path.join(args.study, arms[0], f"seed{s}"), params,
                                                      k=args.k)} for s in seeds]
    for arm in arms:
        results[arm] = [{"seed": s, **score_run(os.path.join(args.study, arm, f"seed{s}"), k=args.k)} for s in seeds]
    report = {"results": results, "k": args.k, "temperature": 1.0, "sample_key": SAMPLE_KEY,
              "warm_seed": args.warm_seed if "start" in results else None}
    atomic_write_text(path, json.dumps(report, indent=1))
    print(table(results, args.k))
    for arm, runs in results.items():
        for r in runs:
            if r["greedy"] != r["greedy_logged"]:
                print(f"WARNING: {arm} seed {r['seed']}: greedy {r['greedy']} here, {r['greedy_logged']} logged at "
                      f"step {r['greedy_logged_step']}: not the policy the run evaluated (for the warm start: run "
                      "under the study's taskset)", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
