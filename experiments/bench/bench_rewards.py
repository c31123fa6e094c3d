"""Reward throughput benchmark: responses/s for math and format (inline) and code (sandbox pool).

    python experiments/bench/bench_rewards.py                 # 4,096 math + 4,096 format + 256 code, 2 workers
    python experiments/bench/bench_rewards.py --workers 4     # code pool size
    python experiments/bench/bench_rewards.py --smoke         # tiny sizes, for a quick check

The responses are synthetic but shaped like real ones (think segment, then an answer): math mixes
plain numbers, fractions, percents, thousands separators and LaTeX that needs the symbolic path; code
runs short HumanEval-style functions and stdin/stdout programs, a quarter of them wrong. A fresh
process runs this, so the first math call includes the one-off sympy import.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, replace

from grpo_jax.rewards import RewardSpec, evaluate
from grpo_jax.rewards.sandbox import SandboxPool, available_layers


@dataclass(frozen=True)
class BenchConfig:
    n_math: int = 4096  # math responses
    n_format: int = 4096  # format responses
    n_code: int = 256  # code responses (each one sandboxed process per test case)
    workers: int = 2  # sandbox pool size
    seed: int = 0  # synthetic data seed


def get_config(smoke: bool = False) -> BenchConfig:
    return BenchConfig(n_math=128, n_format=128, n_code=16) if smoke else BenchConfig()


def math_workload(n: int, rng: random.Random) -> tuple[list[str], list[dict]]:
    """(responses, samples): 70% numeric forms, 20% LaTeX needing sympy, 10% malformed/hedged."""
    responses, samples = [], []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(2, 60)
        kind = rng.random()
        if kind < 0.7:
            answer = str(a * b)
            shown = rng.choice([answer, f"{a * b:,}", answer + ".0", str(a * b + rng.choice([0, 0, 1]))])
            text = rng.choice([f"\\boxed{{{shown}}}", f"The answer is {shown}.", f"#### {shown}"])
        elif kind < 0.9:
            answer = f"\\frac{{{a}}}{{{b}}}\\sqrt{{2}}"
            text = rng.choice(
                [f"\\boxed{{\\frac{{{a}\\sqrt{{2}}}}{{{b}}}}}", f"\\boxed{{\\dfrac{{{a}}}{{{b}}}\\sqrt{{2}}}}"]
            )
        else:
            answer = str(a)
            text = rng.choice([f"\\boxed{{{a}}} or \\boxed{{{a + 1}}}", "\\boxed{", f"maybe {a}"])
        steps = " ".join(f"step {i}: {rng.randint(0, 99)} + {rng.randint(0, 99)}" for i in range(rng.randint(3, 12)))
        responses.append(f"<think>{steps}</think>{text}")
        samples.append({"answer": answer})
    return responses, samples


def format_workload(n: int, rng: random.Random) -> tuple[list[str], list[dict]]:
    templates = [
        "<think>{t}</think><answer>{a}</answer>",
        "<think>{t}</think>{a}",
        "{t} {a}",
        "<think>{t}<think>{t}</think>{a}",
        "<think>{t}</think><answer>{a}</answer> extra",
    ]
    responses = []
    for _ in range(n):
        thought = " ".join(
            rng.choice(["so", "then", "we", "add", "carry", "check"]) for _ in range(rng.randint(20, 200))
        )
        responses.append(rng.choice(templates).format(t=thought, a=rng.randint(0, 10**6)))
    return responses, [{} for _ in range(n)]


_SOLUTIONS = [
    (
        "def f(xs):\n    return sorted(xs)\n",
        "def check(c):\n    assert c([3, 1, 2]) == [1, 2, 3]\n    assert c([]) == []\n",
        True,
    ),
    ("def f(xs):\n    return xs\n", "def check(c):\n    assert c([3, 1, 2]) == [1, 2, 3]\n", False),
    (
        "def f(n):\n    return sum(range(n + 1))\n",
        "def check(c):\n    assert c(10) == 55\n    assert c(0) == 0\n",
        True,
    ),
    ("def f(s):\n    return s[::-1]\n", "def check(c):\n    assert c('abc') == 'cba'\n", True),
]


def code_workload(n: int, rng: random.Random) -> tuple[list[str], list[dict]]:
    """Half HumanEval-style (tests + entry_point), half stdin/stdout with two cases each."""
    responses, samples = [], []
    for i in range(n):
        if i % 2 == 0:
            program, tests, _ = rng.choice(_SOLUTIONS)
            samples.append({"tests": tests, "entry_point": "f"})
        else:
            op = rng.choice(["+", "-"])
            program = f"a, b = map(int, input().split())\nprint(a {op} b)\n"
            samples.append({"io": [{"input": "2 3\n", "output": "5\n"}, {"input": "10 4\n", "output": "14\n"}]})
        responses.append(f"<think>write it</think>```python\n{program}```")
    return responses, samples


def _timed(
    specs: list[RewardSpec], responses: list[str], samples: list[dict], pool: SandboxPool | None
) -> tuple[float, float]:
    t0 = time.perf_counter()
    rewards, _ = evaluate(specs, responses, samples, pool=pool)
    return time.perf_counter() - t0, float(rewards.mean())


def main(cfg: BenchConfig) -> list[tuple[str, int, float, float]]:
    rng = random.Random(cfg.seed)
    rows = []
    responses, samples = math_workload(cfg.n_math, rng)
    seconds, mean = _timed([RewardSpec("math")], responses, samples, None)
    rows.append(("math (mixed, incl. sympy)", cfg.n_math, seconds, mean))
    responses, samples = format_workload(cfg.n_format, rng)
    seconds, mean = _timed([RewardSpec("format")], responses, samples, None)
    rows.append(("format", cfg.n_format, seconds, mean))
    responses, samples = code_workload(cfg.n_code, rng)
    with SandboxPool(cfg.workers) as pool:
        seconds, mean = _timed([RewardSpec("code")], responses, samples, pool)
    rows.append((f"code (pool of {cfg.workers})", cfg.n_code, seconds, mean))
    layers = available_layers()
    print(f"sandbox layers: {', '.join(layers) or 'none'}")
    print(f"| {'reward':<28} | {'responses':>9} | {'seconds':>8} | {'responses/s':>11} | {'mean score':>10} |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 10}|{'-' * 13}|{'-' * 12}|")
    for name, n, seconds, mean in rows:
        print(f"| {name:<28} | {n:>9} | {seconds:>8.2f} | {n / seconds:>11.1f} | {mean:>10.3f} |")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=None, help="sandbox pool size (default 2)")
    parser.add_argument("--n-math", type=int, default=None)
    parser.add_argument("--n-code", type=int, default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes for a quick check")
    args = parser.parse_args()
    config = get_config(args.smoke)
    overrides = {"workers": args.workers, "n_math": args.n_math, "n_code": args.n_code}
    main(replace(config, **{k: v for k, v in overrides.items() if v is not None}))
