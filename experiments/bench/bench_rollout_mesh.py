"""Step time by mesh layout on the default experiment's GRPO step (3-digit addition shapes: 32 prompts x G=8,
14 new tokens, width 128, 2 layers), from the Trainer's own timings:

    python experiments/bench/bench_rollout_mesh.py              # 3 layouts x 2 rounds, each a fresh process
    python experiments/bench/bench_rollout_mesh.py --steps 20 --rounds 3

Layouts: `1 device` (everything on one CPU device); `data 2` (rollout and update both split over 2 devices);
`update 1, rollout 2` (the update on one device, the rollout on a 2-device mesh of its own: mesh.data=1,
mesh.rollout_data=2, params resharded every step). Each layout runs in its own process (the CPU device
count is fixed at start-up), its first `--warmup` steps (compiles) are dropped, and the layouts alternate
over `--rounds` so that machine noise hits all of them. Prints the median step, rollout and update times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

LAYOUTS = {
    "1 device": (1, ["mesh.data=1"]),
    "data 2": (2, ["mesh.data=2"]),
    "update 1, rollout 2": (2, ["mesh.data=1", "mesh.rollout_data=2"]),
}

CHILD = """
import json, sys, tempfile
from grpo_jax import presets
from grpo_jax.config import override
from grpo_jax.train import Trainer
steps, warmup, extra = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
cfg = override(presets.arithmetic(), ["logging.tensorboard=false", "checkpoint.every=0", "logging.eval_every=0",
                              "task.n_eval=0", "monitor.collapse_action=warn"] + extra)
tr = Trainer(cfg, tempfile.mkdtemp(), quiet=True)
rows = [tr.step_once().timings for _ in range(warmup + steps)][warmup:]
print(json.dumps({k: [r[k] for r in rows] for k in ("time/step", "time/rollout_and_reward", "time/update")}))
"""


def run_layout(devices: int, extra: list[str], steps: int, warmup: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    out = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(warmup), json.dumps(extra)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=15, help="timed steps per layout and round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps (compiles)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    times = {name: {"time/step": [], "time/rollout_and_reward": [], "time/update": []} for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, (devices, extra) in LAYOUTS.items():
            for k, v in run_layout(devices, extra, args.steps, args.warmup).items():
                times[name][k] += v
    print(f"\nGRPO step of the default experiment, median of {args.steps} x {args.rounds} steps per layout")
    print(f"{'layout':<24}{'step s':>9}{'rollout s':>11}{'update s':>10}{'vs 1 device':>13}")
    base = statistics.median(times["1 device"]["time/step"])
    result = {}
    for name, t in times.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        result[name] = med
        print(f"{name:<24}{med['time/step']:>9.3f}{med['time/rollout_and_reward']:>11.3f}{med['time/update']:>10.3f}"
              f"{med['time/step'] / base:>12.2f}x")
    return result


if __name__ == "__main__":
    main()
