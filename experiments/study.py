"""Shared runner for multi-arm, multi-seed studies (the estimator ablation, the entropy-collapse study).

Per seed, one supervised warm start is shared by every arm (same starting policy, so arms differ only in
what the arm changes); each arm is then a GRPO run in `<out>/<arm>/seed<k>/` with its own report files.
The study writes `<out>/results.json`, `<out>/results.md` and comparison plots under `<out>/plots/`.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # before pyplot: files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from grpo_jax.config import TrainConfig, override  # noqa: E402
from grpo_jax.fileio import atomic_write_text  # noqa: E402
from grpo_jax.runlog import read_jsonl  # noqa: E402
from grpo_jax.sft import warm_start  # noqa: E402
from grpo_jax.train import Trainer  # noqa: E402


def study_settings(args, cfg: TrainConfig, default_out: str):
    """(out dir, seeds, warm-start settings) shared by the studies: 3 seeds and a fixed 300-step warm start
    (the same for every arm), or one seed and a few steps with --smoke."""
    out = args.out if args.out != "runs/grpo" else default_out
    seeds = [cfg.seed] if args.smoke else [cfg.seed, cfg.seed + 1, cfg.seed + 2]
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
    sft = dict(target_accuracy=1.1, max_steps=4 if args.smoke else 300, batch_size=16 if args.smoke else 128,
               lr=1e-3, eval_every=4 if args.smoke else 300, n_valid=8 if args.smoke else 100)
    return out, seeds, sft


def run_study(base: TrainConfig, arms: dict[str, list[str]], *, seeds, out: str, sft: dict, quiet: bool,
              summarize, summarize_only: bool = False) -> dict:
    """Train every (arm, seed); `summarize(rows) -> dict` turns one run's metrics into its figures.

    summarize_only: train nothing; collect the figures of every (arm, seed) run already under `out` that
    finished all its steps (seeds trained in separate processes with --seeds land in the same tree)."""
    results = {arm: [] for arm in arms}
    start = time.perf_counter()
    if summarize_only:
        for seed in seeds:
            for arm in arms:
                path = os.path.join(out, arm, f"seed{seed}", "metrics.jsonl")
                rows = read_jsonl(path) if os.path.exists(path) else []
                if not rows or max(r.get("step", -1) for r in rows) < base.steps:
                    print(f"summarize-only: {arm} seed {seed} missing or unfinished ({path}); left out")
                    continue
                results[arm].append({**summarize(rows), "seed": seed})
        return {"results": {a: r for a, r in results.items() if r}, "seeds": list(seeds), "wall_seconds": 0.0}
    sft = dict(sft)
    n_valid = sft.pop("n_valid", 100)
    for seed in seeds:
        seed_cfg = override(base, [f"seed={seed}"])
        warm = Trainer(override(seed_cfg, ["logging.tensorboard=false"]), os.path.join(out, "warm_start", f"seed{seed}"),
                       quiet=True)
        valid = warm.task.generate("valid", n_valid, seed)
        params, sft_summary = warm_start(warm.actor, warm.state.params, warm.stream.rows, valid,
                                         solution=warm.task.solution, seed=seed, log=(lambda *_: None), **sft)
        warm.logger.close()
        for arm, overrides in arms.items():
            run_dir = os.path.join(out, arm, f"seed{seed}")
            trainer = Trainer(override(seed_cfg, overrides), run_dir, quiet=quiet)
            trainer.set_params(params)
            trainer.run()
            figures = summarize(read_jsonl(os.path.join(run_dir, "metrics.jsonl")))
            figures.update(seed=seed, sft_steps=sft_summary["sft_steps"])
            results[arm].append(figures)
            if not quiet:
                print(f"{arm} seed {seed}: {figures}")
    return {"results": results, "seeds": list(seeds), "wall_seconds": time.perf_counter() - start}


def last_mean(rows: list[dict], key: str, n: int = 20) -> float:
    """Mean of a metric over the last n steps that report it (nan if none)."""
    values = [r[key] for r in rows if key in r and isinstance(r[key], (int, float))][-n:]
    return float(np.mean(values)) if values else float("nan")


def table(results: dict, columns: list[str]) -> str:
    """Markdown table: one row per arm, mean +- std over seeds of each column."""
    lines = ["| arm | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for arm, runs in results.items():
        cells = []
        for c in columns:
            v = np.array([r[c] for r in runs], float)
            cells.append(f"{np.nanmean(v):.3f} +- {np.nanstd(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(out: str, arms, key: str, ylabel: str, name: str) -> str:
    """One line per arm (mean over seeds) of a metric against the step."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in arms:
        curves = []
        arm_dir = os.path.join(out, arm)
        for seed_dir in sorted(os.listdir(arm_dir)) if os.path.isdir(arm_dir) else []:
            path = os.path.join(arm_dir, seed_dir, "metrics.jsonl")
            if os.path.exists(path):
                curves.append([(r["step"], r[key]) for r in read_jsonl(path) if key in r])
        n = min((len(c) for c in curves), default=0)
        if n:
            steps = [s for s, _ in curves[0][:n]]
            ax.plot(steps, np.mean([[v for _, v in c[:n]] for c in curves], axis=0), label=arm)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    path = os.path.join(out, "plots", f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_study(out: str, study: dict, *, title: str, columns: list[str], plots: list[str], notes: str) -> None:
    md = [f"# {title}", "", notes, "", table(study["results"], columns), ""]
    md += [f"![{os.path.basename(p)}](plots/{os.path.basename(p)})" for p in plots]
    atomic_write_text(os.path.join(out, "results.md"), "\n".join(md) + "\n")
    atomic_write_text(os.path.join(out, "results.json"), json.dumps(study, indent=2, sort_keys=True, default=float))
