"""Throughput of the code reward's two-process harness on bulk work that one interpreter does in well
under a second: a 3M-element result, 200k calls, 200 calls with 5,000-element lists (argument and
result). Each case is scored by `code_reward` with a generous wall limit and reports its status and
the sandbox's wall time, so the wire's cost shows directly.

    PYTHONPATH=. python experiments/bench/bench_wire.py [--wall 60]
"""

from __future__ import annotations

import argparse
import time

from grpo_jax.rewards import code_reward

CASES = {
    "3M-int result": ("def f(n):\n    return list(range(n))\n", "assert len(f(3_000_000)) == 3_000_000\n"),
    "1M-float result": ("def f(n):\n    return [i / 7 for i in range(n)]\n", "assert f(1_000_000)[7] == 1.0\n"),
    "300k-str result": ("def f(n):\n    return [str(i) for i in range(n)]\n", "assert f(300_000)[-1] == '299999'\n"),
    "200k calls": ("def f(x):\n    return x + 1\n", "for i in range(200_000):\n    assert f(i) == i + 1\n"),
    "200 calls x 5000-list": (
        "def f(xs):\n    return sorted(xs)\n",
        "import random\nrandom.seed(0)\nfor _ in range(200):\n    xs = [random.randrange(10**6) for _ in range(5000)]\n"
        "    assert f(xs) == sorted(xs)\n",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wall", type=float, default=60.0, help="wall-clock limit per case (s)")
    parser.add_argument("--cpu", type=float, default=60.0, help="CPU limit per process (s)")
    parser.add_argument("--memory-mb", type=int, default=2048)
    args = parser.parse_args()
    for name, (program, tests) in CASES.items():
        start = time.perf_counter()
        result = code_reward(
            "<think>x</think>```python\n" + program + "```",
            {"tests": tests},
            wall_s=args.wall,
            cpu_s=args.cpu,
            memory_mb=args.memory_mb,
        )
        elapsed = time.perf_counter() - start
        statuses = [r.get("status") for r in result.info.get("results", [])]
        print(f"{name:24s} score={result.score:.0f} status={statuses} total={elapsed:6.2f}s", flush=True)


if __name__ == "__main__":
    main()
