"""Step time and device-idle fraction of the step's three schedules, from the Trainer's own loop:

    python experiments/bench/bench_pipeline.py                                # random init, 2 rounds
    python experiments/bench/bench_pipeline.py --policy runs/arithmetic --policy-step 800   # a trained policy

Schedules: `sequential` (rollout.overlap=false: decode, score, update, then the host's metrics, logs and
checkpoints, one after the other), `overlapped` (the default: the next rollout is dispatched as soon as the
update is, so the device decodes it while the host logs; the same numbers), `off-policy` (
rollout.off_policy_steps=1 with a TIS correction: the next rollout is decoded with the params before the
update, so the host scores it while the device runs the update and decodes the one after).

Workloads, all on the default experiment's model and shapes (width 128, 2 layers, 32 prompts x G = 8, 14 new
tokens; a checkpoint every 10 steps and samples logged as the default experiment does):
- `arithmetic`: the default experiment's step itself (DAPO dynamic sampling on: 64 prompts a round);
- `code`: every completion scored by the sandboxed code reward (one sandboxed process per completion, what a
  code task costs the host), 8 prompts x G = 8 a step, dynamic sampling off;
- `latency 0.5 s`: a reward that waits 0.5 s per batch and uses no CPU (a remote verifier or judge scoring the
  batch in one request), declared batched and with a thread (`user_reward(threads=1, batched=True)`), beside
  the math and format rewards; dynamic sampling off.

Each (workload, schedule) runs in a fresh process; the first `--warmup` iterations (compiles) and the last one
(nothing left to overlap it with) are dropped, and the schedules alternate over `--rounds`. A step is one whole loop iteration of `Trainer.run` (step, logs,
samples, checkpoint). The device (here the CPU's XLA programs) is busy for the decode and the update: that time
is measured in the sequential schedule, where the host waits for each (`time/rollout_wait` x the step's rounds
+ `time/update`), and the idle fraction of a schedule is 1 - device time / step time. `--policy RUN` starts
from a run's checkpoint (a trained policy writes answers that parse, which the code reward then runs) instead
of a random init. The sequential and overlapped arithmetic runs must log byte-identical metrics; the table
says whether they did.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))

SCHEDULES = {
    "sequential": ["rollout.overlap=false"],
    "overlapped": ["rollout.overlap=true"],
    "off-policy": ["rollout.off_policy_steps=1", "sampling.old_logp_source=recompute", "loss.tis_cap=2.0"],
}
LATENCY_S = 0.5
WORKLOADS = {
    "arithmetic": [],
    "code": ["dynamic.enabled=false", "prompts_per_step=8", "task.name=bench_pipeline:CodeScoredArithmetic",
             "rewards.specs=" + json.dumps([{"name": "code", "kwargs": {"wall_s": 5.0, "cpu_s": 2.0}},
                                            {"name": "format", "weight": 0.1}])],
    f"latency {LATENCY_S:g} s": [
        "dynamic.enabled=false",
        "rewards.specs=" + json.dumps([{"name": "math"}, {"name": "format", "weight": 0.1},
                                       {"name": "bench_pipeline:waits", "weight": 0.0,
                                        "kwargs": {"seconds": LATENCY_S}}])],
}


# ------------------------------------------------------------------ what the child processes import

def waits(completions, *, seconds: float):
    """Score 0 after waiting `seconds` for the whole batch, using no CPU: one request to a judge that answers a
    batch in that time. Declared batched and with a thread (as `user_reward("1", threads=1, batched=True)`
    marks it), as a remote judge's reward would be, so its wait runs beside the inline rewards and, with
    off-policy rollouts, beside the trainer's logging."""
    time.sleep(seconds)
    return [0.0] * len(completions)


waits.reward_version, waits.score_range, waits.reward_threads, waits.reward_batched = "1", (0.0, 1.0), 1, True


def _code_task():
    import dataclasses

    from grpo_jax.tasks.arithmetic import ArithmeticTask

    @dataclasses.dataclass(frozen=True)
    class CodeScoredArithmetic(ArithmeticTask):
        """3-digit addition whose rows carry a test, so the code reward runs every answer as a program (an
        answer such as `579` is a valid one) in the sandbox."""

        def generate(self, split, n, seed):
            return [dict(r, tests="assert True\n") for r in super().generate(split, n, seed)]

    return CodeScoredArithmetic()


def __getattr__(name):  # the task is built on first use, so importing this module imports no task code
    if name == "CodeScoredArithmetic":
        return _code_task()
    raise AttributeError(name)


CHILD = """
import hashlib, json, os, sys, tempfile
sys.path.insert(0, {here!r})
from grpo_jax import presets
from grpo_jax.config import override
from grpo_jax.train import Trainer
steps, warmup, extra, policy, policy_step = (int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]),
                                             sys.argv[4], sys.argv[5])
cfg = override(presets.arithmetic(), ["logging.tensorboard=false", "logging.progress=false", "checkpoint.every=10",
               "logging.eval_every=0", "task.n_eval=0", "monitor.collapse_action=warn",
               f"steps={{warmup + steps + 1}}"] + extra)
out = tempfile.mkdtemp()
tr = Trainer(cfg, out, quiet=True)
if policy:
    from grpo_jax.export import restore_policy
    tr.set_params(restore_policy(policy, int(policy_step) if policy_step else None)[2])
tr.run()
timed = slice(warmup, warmup + steps)  # the last iteration, with no next rollout to overlap, is left out
rows = [json.loads(l) for l in open(os.path.join(out, "timings.jsonl"))][timed]
metrics = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))][timed]
print(json.dumps({{"iteration": tr.iteration_seconds[timed],
                  "rollout_wait": [r["time/rollout_wait"] for r in rows],
                  "score": [r["time/score"] for r in rows], "update": [r["time/update"] for r in rows],
                  "rounds": [m.get("dynamic/rounds", 1.0) for m in metrics],
                  "metrics_sha256": hashlib.sha256(open(os.path.join(out, "metrics.jsonl"), "rb").read()).hexdigest(),
                  }}))
"""


def _child(steps: int, warmup: int, extra: list[str], policy: str, policy_step: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(here=HERE), str(steps), str(warmup), json.dumps(extra),
                          policy, policy_step], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])})
    if out.returncode:
        raise SystemExit(f"child failed ({extra}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=3, help="first iterations dropped (compiles)")
    p.add_argument("--rounds", type=int, default=2, help="runs per (workload, schedule), schedules alternating")
    p.add_argument("--policy", default="", help="a run folder whose checkpoint is the starting policy")
    p.add_argument("--policy-step", default="", help="its checkpoint step (default: the newest)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ", ".join(WORKLOADS))
    args = p.parse_args(argv)
    results = {}
    for workload in args.workloads.split(","):
        runs = {name: [] for name in SCHEDULES}
        for _ in range(args.rounds):
            for name, sets in SCHEDULES.items():
                runs[name].append(_child(args.steps, args.warmup, WORKLOADS[workload] + sets, args.policy,
                                         args.policy_step))
        seq = [r for run in runs["sequential"] for r in zip(run["rollout_wait"], run["rounds"], run["update"])]
        device = statistics.median(w * n + u for w, n, u in seq)
        score = statistics.median(s for run in runs["sequential"] for s in run["score"])
        rows = {}
        for name, rs in runs.items():
            step = statistics.median(t for run in rs for t in run["iteration"])
            rows[name] = {"step_s": step, "idle": max(0.0, 1.0 - device / step)}
        same = {run["metrics_sha256"] for run in runs["sequential"] + runs["overlapped"]}
        results[workload] = {"device_s": device, "score_s": score, "schedules": rows,
                             "sequential_equals_overlapped": len(same) == 1}
    _print(results)
    return results


def _print(results: dict) -> None:
    print(f"{'workload':<16}{'device':>8}{'score':>8}  " + "".join(f"{n + ' step / idle':>26}" for n in SCHEDULES)
          + f"{'overlap/seq':>13}{'off/seq':>9}{'bitwise':>9}")
    for workload, r in results.items():
        sched = r["schedules"]
        cells = "".join(f"{sched[n]['step_s']:>16.3f} s / {sched[n]['idle']:>4.0%}" for n in SCHEDULES)
        seq = sched["sequential"]["step_s"]
        print(f"{workload:<16}{r['device_s']:>7.3f}s{r['score_s']:>7.3f}s  {cells}"
              f"{sched['overlapped']['step_s'] / seq:>13.3f}{sched['off-policy']['step_s'] / seq:>9.3f}"
              f"{'yes' if r['sequential_equals_overlapped'] else 'NO':>9}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
