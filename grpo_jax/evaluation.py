"""Held-out evaluation that can see both collapses: greedy accuracy, and with k samples per problem at
T = 1 the pass@1 .. pass@k curve and the distinct correct completions (`eval/t1/distinct_correct`: strings; with
the task's canonical answers `eval/t1/distinct_solutions`: solutions), plus each reward dimension's satisfaction and
their joint success.

    ev = evaluate_problems(actor, params, rows, samples=16)
    metrics = ev.metrics()          # eval/accuracy, eval/t1/pass@1 .. eval/t1/pass@16, eval/satisfied/<dim>, ...
    per_problem = ev.per_problem()  # greedy_correct [N], t1_correct [N] (counts of k): for paired statistics

Why both: a policy whose entropy collapsed can keep (or raise) its greedy accuracy while its samples all
say the same thing, so pass@k and the number of distinct correct solutions are what show what the
collapse cost. pass@k is the unbiased estimator of Chen et al. 2021 (`stats.pass_at_k`). A completion
"satisfies" a dimension when its reward reaches 1 (the primary, first dimension satisfied = correct).
The sampled evaluation draws from fixed keys (`SAMPLE_SEED`), the same at every evaluation, so two
evaluations of one run differ only by the policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from grpo_jax import experience, stats
from grpo_jax.experience import Actor, Row

SAMPLE_SEED = 0x5A3B1E  # the key of the sampled evaluation (fold_in with each chunk's first row index)
SATISFIED = 1.0 - 1e-6  # a reward at or above this satisfies its dimension
COVER_TAU = 0.5  # eval/t1/cover@0.5: the share of problems solved by at least half of the samples (`stats.cover_at`)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One policy scored on N held-out problems."""

    dims: tuple[str, ...]  # the reward dimensions, in column order; the first is the primary (correctness)
    greedy: np.ndarray  # [N, K] rewards of the greedy completion
    sampled: np.ndarray  # [N, k, K] rewards of k completions at T = 1 ([N, 0, K] when not sampled)
    sampled_texts: tuple  # [N * k] those completions, row-major over (problem, sample)
    # [N * k] each sampled completion's answer in the task's canonical writing (None: no answer it can read); ()
    # when the task has no `canonical_answer`
    sampled_canonical: tuple = ()
    greedy_calls: np.ndarray | None = None  # [N] tool calls of each greedy completion; None without a tool

    def per_problem(self) -> dict[str, np.ndarray]:
        """greedy_correct [N] bool and t1_correct [N] int (how many of the k samples are correct); with canonical
        answers, t1_solutions [N] int (how many distinct solutions the correct samples hold)."""
        out = {"greedy_correct": self.greedy[:, 0] >= SATISFIED,
               "t1_correct": np.sum(self.sampled[..., 0] >= SATISFIED, axis=1)}
        if self.sampled_canonical:
            out["t1_solutions"] = self._distinct_solutions()
        return out

    def _distinct_solutions(self) -> np.ndarray:
        n, k = self.sampled.shape[:2]
        answers = np.asarray(self.sampled_canonical, dtype=object).reshape(n, k)
        correct = self.sampled[..., 0] >= SATISFIED
        return np.array([len(set(a[c]) - {None}) for a, c in zip(answers, correct)], np.int64)

    def metrics(self) -> dict[str, float]:
        """Flat `eval/...` figures (see the module docstring); {} for no problems."""
        if not len(self.greedy):
            return {}
        g = self.greedy
        out = {"eval/accuracy": float(np.mean(g[:, 0] >= SATISFIED)), "eval/score": float(np.mean(g[:, 0]))}
        if "format" in self.dims:
            out["eval/format_rate"] = float(np.mean(g[:, self.dims.index("format")] >= 1.0))
        out.update(satisfaction(g, self.dims, "eval"))
        if self.greedy_calls is not None:
            out.update({"eval/tool/call_rate": float(np.mean(self.greedy_calls > 0)),
                        "eval/tool/calls_per_row": float(np.mean(self.greedy_calls))})
        if self.sampled.shape[1]:
            out.update(self._sampled_metrics())
        return out

    def _sampled_metrics(self) -> dict[str, float]:
        n, k = self.sampled.shape[:2]
        correct = self.sampled[..., 0] >= SATISFIED  # [N, k]
        curve = stats.pass_at_k_curve(np.full(n, k), correct.sum(axis=1), range(1, k + 1))
        out = {f"eval/t1/pass@{j}": float(v) for j, v in curve.items()}
        texts = np.asarray(self.sampled_texts, dtype=object).reshape(n, k)
        out["eval/t1/distinct_correct"] = float(np.mean([len(set(t[c])) for t, c in zip(texts, correct)]))
        out["eval/t1/distinct"] = float(np.mean([len(set(t)) for t in texts]))
        out[f"eval/t1/cover@{COVER_TAU:g}"] = stats.cover_at(np.full(n, k), correct.sum(axis=1), COVER_TAU)
        if self.sampled_canonical:
            out["eval/t1/distinct_solutions"] = float(np.mean(self._distinct_solutions()))
        out.update(satisfaction(self.sampled.reshape(n * k, -1), self.dims, "eval/t1"))
        return out


def sampled_k(row: dict) -> int:
    """The k of a logged sampled evaluation (`logging.eval_samples`): its largest `eval/t1/pass@k` key; 0 for a
    row without one."""
    return max((int(key.split("@")[1]) for key in row if key.startswith("eval/t1/pass@")), default=0)


def satisfaction(rewards_NxK: np.ndarray, dims: Sequence[str], prefix: str) -> dict[str, float]:
    """`<prefix>/satisfied/<dim>`: the fraction of completions whose reward in that dimension reaches 1,
    and `<prefix>/satisfied_all`: the fraction that satisfy every dimension (joint success). A missing
    reward (NaN) does not satisfy."""
    ok = np.nan_to_num(rewards_NxK, nan=0.0) >= SATISFIED
    out = {f"{prefix}/satisfied/{d}": float(np.mean(ok[:, i])) for i, d in enumerate(dims)}
    out[f"{prefix}/satisfied_all"] = float(np.mean(ok.all(axis=1)))
    return out


def evaluate_problems(actor: Actor, params, rows: Sequence[Row], *, samples: int = 0, batch_size: int = 256,
                      canonical=None) -> Evaluation:
    """The greedy completion of every row, and with `samples` = k, k completions at T = 1 each, scored
    (`batch_size` completions per rollout call). canonical: (text, row) -> the answer in the task's canonical
    writing or None (a task's `canonical_answer`), so distinct solutions are counted, not distinct strings."""
    greedy, _, calls = _scored(actor, params, rows, group=1, temperature=0.0, batch_size=batch_size)
    sampled, texts, _ = (_scored(actor, params, rows, group=samples, temperature=1.0, batch_size=batch_size)
                         if samples else (np.zeros((len(rows), 0, len(actor.dims)), np.float32), (), None))
    answers = tuple(canonical(t, rows[i // samples]) for i, t in enumerate(texts)) if canonical and samples else ()
    return Evaluation(dims=tuple(actor.dims), greedy=greedy[:, 0], sampled=sampled, sampled_texts=texts,
                      sampled_canonical=answers, greedy_calls=None if calls is None else calls[:, 0])


def without_tool(actor: Actor, params, rows: Sequence[Row], *, batch_size: int = 256) -> dict:
    """A tool-using policy's greedy accuracy when no call is answered (one-turn decoding: what it does in its
    head), as `eval/no_tool/...`; {} for an actor without a tool."""
    if actor.tool is None:
        return {}
    ev = evaluate_problems(dataclasses.replace(actor, tool=None), params, rows, batch_size=batch_size).metrics()
    return {k.replace("eval/", "eval/no_tool/", 1): v for k, v in ev.items() if not k.startswith("eval/satisfied")}


def evaluate(actor: Actor, params, rows: Sequence[Row], *, samples: int = 0, batch_size: int = 256) -> dict:
    """`evaluate_problems(...).metrics()`: the figures a run logs."""
    return evaluate_problems(actor, params, rows, samples=samples, batch_size=batch_size).metrics()


def _scored(actor: Actor, params, rows: Sequence[Row], *, group: int, temperature: float,
            batch_size: int) -> tuple[np.ndarray, tuple, np.ndarray | None]:
    """(R [N, group, K], the completions [N * group], the tool calls [N, group] or None without a tool) of `group`
    completions per row at `temperature`."""
    per_call = max(1, batch_size // group)
    rewards, texts, calls = [np.zeros((0, group, len(actor.dims)), np.float32)], [], [np.zeros((0, group))]
    for start in range(0, len(rows), per_call):
        chunk = rows[start : start + per_call]
        key = jax.random.fold_in(jax.random.key(SAMPLE_SEED), start) if temperature > 0 else jax.random.key(0)
        exp = experience.score(actor, chunk, experience.rollout(actor, params, chunk, key, group_size=group,
                                                                temperature=temperature))
        rewards.append(exp.rewards)
        texts.extend(exp.texts)
        if exp.rollout.tool_stats is not None:
            calls.append(np.asarray(exp.rollout.tool_stats)[..., 0])
    return np.concatenate(rewards), tuple(texts), np.concatenate(calls) if actor.tool is not None else None
