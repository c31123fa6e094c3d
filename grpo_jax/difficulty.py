"""Offline difficulty: estimate each prompt's pass rate under the current model, write it next to the data.

    python -m grpo_jax.difficulty --data train.jsonl --run runs/arithmetic --k 8
        -> train.passrate.jsonl (every row plus "pass_rate"), and a strata summary on stdout

Then train on the informative band only: `--set task.train_path=train.passrate.jsonl --set
task.pass_rate_lo=0.1 --set task.pass_rate_hi=0.9`. Prompts the model always or never solves give GRPO
zero-variance groups (no gradient); filtering them before the run spends the rollouts where learning happens
(verl PR #6155's pass-rate band). A pass is the task's primary reward (its first dimension) reaching 1.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

from grpo_jax import build, experience, export, update
from grpo_jax import data as data_lib
from grpo_jax import tasks as tasks_lib
from grpo_jax.cli import add_debug_flag, for_people
from grpo_jax.config import TrainConfig, from_dict, override


def estimate_pass_rates(actor: experience.Actor, params, rows, *, k: int, temperature: float, seed: int = 0,
                        batch_size: int = 64) -> np.ndarray:
    """[len(rows)] fraction of k samples (at `temperature`) whose primary reward (first dimension) is 1."""
    rates = []
    key = jax.random.key(seed)
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        ro = experience.rollout(actor, params, chunk, jax.random.fold_in(key, start), group_size=k,
                                temperature=temperature)
        r = experience.score(actor, chunk, ro).rewards
        rates.append(np.mean(r[..., 0] >= 1.0 - 1e-6, axis=1))
    return np.concatenate(rates) if rates else np.zeros(0)


def load_policy(cfg: TrainConfig, vocab_size: int, run_dir: str | None, step: int | None = None):
    """(model config, policy params, checkpoint step) of `run_dir`'s checkpoint (newest good one unless
    `step`), or without a run the freshly initialised model a run of `cfg` would start from (step None)."""
    if run_dir:
        _, model_cfg, params, _, used = export.restore_policy(run_dir, step)
        return model_cfg, params, used
    init_key = jax.random.fold_in(jax.random.key(cfg.seed), update.INIT_KEY_FOLD)
    model_cfg, params = build.build_model(cfg, vocab_size, init_key)
    return model_cfg, params, None


def default_output(path: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.passrate{ext or '.jsonl'}"


@for_people
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="JSONL of training rows (prompt + reference fields)")
    ap.add_argument("--run", default=None, help="run directory whose config.json and newest checkpoint to use")
    ap.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest good)")
    ap.add_argument("--out", default=None, help="output JSONL (default: <data>.passrate.jsonl beside the data)")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    add_debug_flag(ap)
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error(f"--k must be >= 1, got {args.k}")
    cfg = TrainConfig()
    if args.run:
        with open(os.path.join(args.run, "config.json")) as f:
            cfg = from_dict(TrainConfig, json.load(f))
    cfg = override(cfg, args.overrides + ["logging.progress=false", "logging.tensorboard=false"])
    task = tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options))
    tokenizer = task.tokenizer()
    # the rows as training reads them (format adapted, cleaned, chat-rendered); written back as they were
    pairs, report = data_lib.prepare_file(args.data, "--data", task, cfg.task, tokenizer, action=cfg.task.sanitize)
    task = tasks_lib.bind_format(task, report["format"])
    ready = [row for _, row in pairs if row is not None]
    model_cfg, params, step = load_policy(cfg, tokenizer.vocab_size, args.run, args.step)
    actor = experience.Actor(model_cfg, tokenizer, build.reward_specs(cfg, task), cfg.sampling)
    rates = iter(estimate_pass_rates(actor, params, ready, k=args.k, temperature=cfg.sampling.temperature,
                                     seed=args.seed))
    out = args.out or default_output(args.data)
    # a row the cleaning drops gets no pass rate (training drops it again before the band filter)
    written = [raw if row is None else dict(raw, pass_rate=float(next(rates))) for raw, row in pairs]
    data_lib.write_jsonl(out, written)
    rows = [r for r in written if "pass_rate" in r]
    summary = {"rows": len(rows), "k": args.k, "checkpoint_step": step, "out": out,
               "strata": data_lib.strata_summary(rows, "pass_rate")}
    print(summary)
    return summary


if __name__ == "__main__":
    main()
