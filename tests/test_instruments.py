"""The instruments that see both collapses: the policy's own (T = 1) token entropy split by kind of token,
and the held-out evaluation's pass@k, distinct correct solutions and per-dimension satisfaction, on
hand-built inputs and in a real run's logs against a NumPy recomputation."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import evaluation, experience, sampler, train
from grpo_jax.rewards.format import SEGMENT_KINDS, segment_kinds
from grpo_jax.runlog import read_jsonl
from grpo_jax.tokenizer import CharTokenizer
from models.rope import rope_positions
from tests.test_train import tiny_config
from tests.tolerance import entropy_tol

O, R, A = (SEGMENT_KINDS.index(k) for k in ("other", "reasoning", "answer"))


@pytest.mark.parametrize("text, kinds", [
    # tags are "other"; the think block is reasoning; the answer block's content is answer
    ("<think>ab</think><answer>12</answer>", "O" * 7 + "RR" + "O" * 8 + "O" * 8 + "AA" + "O" * 9),
    # an unclosed think: everything after <think> is reasoning, text before it is other
    ("x<think>ab", "O" + "O" * 7 + "RR"),
    # no answer tag after </think>: the whole region is the answer (split_response's rule)
    ("<think>a</think> 4", "O" * 7 + "R" + "O" * 8 + "AA"),
    # no tags at all: a model without a think template answers with everything
    ("42", "AA"),
    # a stray closing answer tag is not answer text
    ("<think>a</think>4</answer>", "O" * 7 + "R" + "O" * 8 + "A" + "O" * 9),
])
def test_segment_kinds_mark_the_segments_split_response_reads(text, kinds):
    assert "".join("ORA"[k] for k in segment_kinds(text)) == kinds


def test_token_kinds_on_hand_built_sequences():
    tok = CharTokenizer()
    ids = tok.encode("<think>1+2=3</think><answer>3</answer>") + [tok.eos_id]
    n = len(ids)
    tokens = np.full((1, 2, n + 3), tok.pad_id, np.int32)
    tokens[0, 0, :n] = ids
    tokens[0, 1, :3] = tok.encode("12") + [tok.eos_id]  # no tags: the answer, then EOS
    kinds = experience.token_kinds(tok, tokens, np.array([[n, 3]]))
    # <think>, 5 characters, </think>, <answer>, "3", </answer>, EOS, then padding
    np.testing.assert_array_equal(kinds[0, 0], [O, R, R, R, R, R, O, O, A, O, O, O, O, O])
    np.testing.assert_array_equal(kinds[0, 1], [A, A, O] + [O] * (n + 3 - 3))


def _numpy_entropy(logits_NxV: np.ndarray) -> np.ndarray:
    z = logits_NxV - logits_NxV.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return -(p * np.log(p)).sum(-1)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_policy_entropy_is_softmax_of_the_logits_whatever_the_sampling_temperature(temperature):
    """policy_entropies = H(softmax(logits)) of the teacher-forced logits at each completion position;
    entropies (the sampled distribution) = H(softmax(logits / T))."""
    cfg = models.tiny(vocab_size=64)
    params = jax.tree.map(lambda p: p * 4 if p.ndim == 2 else p, models.init_params(cfg, jax.random.key(0)))
    prompts, mask = jnp.full((2, 5), 7, jnp.int32), jnp.ones((2, 5), bool)
    ro = sampler.sample(cfg, params, prompts, mask, key=jax.random.key(1), group_size=3, max_new_tokens=6,
                        temperature=temperature)
    seq, seq_mask = experience.full_sequences(ro)
    pos = jnp.maximum(jnp.cumsum(seq_mask, axis=-1) - 1, 0)
    p = ro.prompt_tokens.shape[1]  # the prompt bucket width
    logits = np.asarray(models.forward(cfg, params, seq, rope_positions(cfg, pos), attn_mask=seq_mask)[0],
                        np.float64)[:, p - 1 : -1]  # the logits predicting each completion token
    m = np.asarray(ro.completion_mask).reshape(6, -1) > 0
    want_t1, want_t = _numpy_entropy(logits), _numpy_entropy(logits / temperature)
    # the sampler's cached decode against one full forward, then each its float32 entropy (tests/tolerance.entropy_tol)
    tol_t1, tol_t = entropy_tol(logits[m], cfg), entropy_tol(logits[m] / temperature, cfg)
    np.testing.assert_allclose(np.asarray(ro.policy_entropies).reshape(6, -1)[m], want_t1[m], rtol=0, atol=tol_t1)
    np.testing.assert_allclose(np.asarray(ro.entropies).reshape(6, -1)[m], want_t[m], rtol=0, atol=tol_t)
    assert not np.allclose(want_t1[m], want_t[m], rtol=1e-2)  # the two really differ at this temperature


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021 eq. 1 with exact binomials: 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_evaluation_figures_on_hand_written_rewards():
    # 2 problems x 4 samples x (correct, format): problem 0 has 1 correct of 4, problem 1 has 3 of 4
    sampled = np.zeros((2, 4, 2), np.float32)
    sampled[0, 0] = (1, 1)
    sampled[1, :3, 0] = 1
    sampled[1, :, 1] = 1
    texts = ("a", "b", "b", "c", "x", "y", "x", "z")  # problem 1's correct texts are x, y, x: 2 distinct
    ev = evaluation.Evaluation(dims=("correct", "format"), greedy=np.array([[1, 0], [0, 1]], np.float32),
                               sampled=sampled, sampled_texts=texts)
    m = ev.metrics()
    assert m["eval/accuracy"] == 0.5 and m["eval/satisfied_all"] == 0.0  # neither greedy answer is both
    assert m["eval/satisfied/correct"] == 0.5 and m["eval/satisfied/format"] == 0.5
    for k in range(1, 5):  # pass@k = mean over problems of 1 - C(4 - c, k) / C(4, k)
        assert m[f"eval/t1/pass@{k}"] == pytest.approx((_pass_at_k(4, 1, k) + _pass_at_k(4, 3, k)) / 2)
    assert m["eval/t1/pass@1"] == pytest.approx(0.5)  # (1/4 + 3/4) / 2
    assert m["eval/t1/distinct_correct"] == pytest.approx((1 + 2) / 2)
    assert m["eval/t1/satisfied_all"] == pytest.approx(4 / 8)  # (0, 0) and problem 1's first three
    np.testing.assert_array_equal(ev.per_problem()["t1_correct"], [1, 3])
    assert m["eval/t1/cover@0.5"] == 0.5  # 1/4 and 3/4 correct: only problem 1 reaches half
    assert "eval/t1/distinct_solutions" not in m and "t1_solutions" not in ev.per_problem()  # no canonical answers
    # canonical answers: problem 1's correct x and y are one solution written twice, and a None is no solution
    canon = ev.__class__(**{**ev.__dict__, "sampled_canonical": ("s", None, None, None, "X", "X", "X", None)})
    assert canon.metrics()["eval/t1/distinct_solutions"] == pytest.approx((1 + 1) / 2)
    np.testing.assert_array_equal(canon.per_problem()["t1_solutions"], [1, 1])


def test_a_real_run_logs_every_instrument_as_numpy_recomputes_it(tmp_path):
    """A random tiny model writes tags often enough that reasoning, answer and other tokens all occur in 64
    completions of 24 tokens; the step's logged entropy figures equal a NumPy recomputation from the step's
    own rollout, and the logged pass@k equals Chen's formula on the logged per-problem counts."""
    cfg = tiny_config("steps=2", "prompts_per_step=8", "sampling.group_size=8", "sampling.max_new_tokens=24",
                      "logging.eval_every=2", "logging.eval_samples=4", "task.n_eval=6")
    tr = train.Trainer(cfg, str(tmp_path / "step"), quiet=True)
    out = tr.step_once()
    ro, kinds = out.experience.rollout, out.experience.token_kinds
    ent, mask = np.asarray(ro.policy_entropies), np.asarray(ro.completion_mask) > 0
    for code, name in enumerate(SEGMENT_KINDS):
        values = ent[mask & (kinds == code)]
        assert len(values), f"no {name} tokens in 64 completions"
        assert out.metrics[f"entropy_t1/{name}/mean"] == pytest.approx(values.mean(), rel=1e-5)
        assert out.metrics[f"entropy_t1/{name}/p50"] == pytest.approx(np.percentile(values, 50), rel=1e-5)
        assert out.metrics[f"entropy_t1/{name}/num_tokens"] == len(values)
    assert out.metrics["entropy_t1/mean"] == pytest.approx(ent[mask].mean(), rel=1e-5)

    run = train.Trainer(cfg, str(tmp_path / "run"), quiet=True)
    run.run()
    rows = read_jsonl(os.path.join(run.out_dir, "metrics.jsonl"))
    problems = read_jsonl(os.path.join(run.out_dir, "problems.jsonl"))
    assert [p["step"] for p in problems] == [0, 2]  # the sampled evaluation at the start and the end
    for p in problems:
        logged = next(r for r in rows if r["step"] == p["step"])
        assert logged["eval/accuracy"] == pytest.approx(np.mean(p["greedy_correct"]))
        for k in range(1, 5):
            want = np.mean([_pass_at_k(4, c, k) for c in p["t1_correct"]])
            assert logged[f"eval/t1/pass@{k}"] == pytest.approx(want)
        assert "entropy_t1/reasoning/hist" in rows[-1] and "eval/t1/distinct_correct" in logged
    md, js = run.report({"steps": 2}, title="instruments")
    report = open(md).read()
    assert "entropy_by_kind.png" in report and "pass_at_k.png" in report
    prov = json.loads(open(js).read())["provenance"]  # what reruns and traces the figures
    assert {"git", "source_digest", "packages", "command", "machine"} <= set(prov)
    assert prov["machine"]["cores"] >= 1 and len(prov["source_digest"]) == 64 and prov["packages"]["jax"]


def test_an_alarm_can_watch_the_reasoning_tokens_own_entropy():
    """A rule on entropy_t1/reasoning/mean fires when the reasoning entropy falls under a tenth of its first
    value, while the overall mean (held up by other tokens) would not."""
    from grpo_jax.config import AlarmRule, MonitorConfig
    from grpo_jax.monitor import Monitor

    rule = AlarmRule(metric="entropy_t1/reasoning/mean", kind="below_first_frac", threshold=0.1, name="reasoning")
    mon = Monitor(MonitorConfig(rules=(rule,)))
    fired = [mon.observe(s, {"entropy_t1/reasoning/mean": h, "entropy_t1/mean": 1.0})
             for s, h in enumerate([1.0, 0.5, 0.2, 0.05])]
    assert [len(a) for a in fired] == [0, 0, 0, 1] and fired[-1][0].rule.name == "reasoning"
