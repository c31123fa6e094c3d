"""Run provenance: the manifest of a smoke run (resolved rewards with versions, regression status, package
versions, git commit, data hashes), kept across a resume; the reward reasons of every completion counted
per step in the metrics (against a hand count) and written with the logged samples."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax import experience, provenance, sampler, train
from grpo_jax.config import SamplingConfig, override
from grpo_jax.rewards import RewardSpec, regress
from grpo_jax.rewards.registry import reward_version
from grpo_jax.runlog import read_jsonl
from grpo_jax.tasks import get_task
from grpo_jax.tokenizer import CharTokenizer
from models import tiny
from tests.test_train import ROOT, SIGNAL, _assert_real_signal, signal_config, tiny_config

N_COMPLETIONS = 16  # TINY: prompts_per_step=4 x group_size=4


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real GRPO step of the tiny model on arithmetic rows read from JSONL files."""
    tmp = tmp_path_factory.mktemp("provenance")
    task = get_task("arithmetic")
    train_path = _write_jsonl(tmp / "train.jsonl", task.generate("train", 32, seed=0))
    eval_path = _write_jsonl(tmp / "eval.jsonl", task.generate("heldout", 4, seed=0))
    cfg = signal_config("steps=1", f"task.train_path={train_path}", f"task.eval_path={eval_path}", "task.n_eval=4",
                        f"logging.samples_per_step={N_COMPLETIONS}")  # every completion: whole groups
    out = str(tmp / "run")
    train.Trainer(cfg, out, quiet=True).run()
    rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    return {"out": out, "cfg": cfg, "train_path": train_path, "eval_path": eval_path, "rows": rows}


def _regression_cases(name: str) -> int:
    lines = (regress.REGRESSION_DIR / f"{name}.jsonl").read_text().splitlines()
    return sum(1 for line in lines if line.strip() and json.loads(line)["reward"] == name)


def test_manifest_of_a_smoke_run(run):
    m = json.load(open(os.path.join(run["out"], "manifest.json")))
    assert m["start_step"] == 0 and "previous_starts" not in m
    # every reward dimension used, with the version that scored it
    assert [(r["dimension"], r["name"]) for r in m["rewards"]] == [("math", "math"), ("format", "format"),
                                                                    ("length", "length")]
    for r in m["rewards"]:
        assert isinstance(r["version"], str) and r["version"] == reward_version(r["name"])
    assert m["rewards"][2]["kwargs"] == {"target": 6} and m["rewards"][1]["weight"] == 0.1
    # their regression sets, run at start
    for name in ("math", "format", "length"):
        n = _regression_cases(name)
        assert n > 0 and m["regression"][name] == {"status": "pass", "cases": n, "passed": n, "failed": 0,
                                                   "failed_ids": []}
    # package versions, python, the git commit
    for name in provenance.PACKAGES:
        assert m["packages"][name] == importlib.metadata.version(name)
    assert m["packages"]["python"] == platform.python_version()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert m["git"]["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    # the data files, hashed
    for key in ("train_path", "eval_path"):
        data = open(run[key], "rb").read()
        assert m["data"][key] == {"path": run[key], "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert m["data"]["model_config"] is None


def test_resume_writes_a_new_manifest_and_keeps_the_first(run):
    first = json.load(open(os.path.join(run["out"], "manifest.json")))
    cfg = override(run["cfg"], ["steps=2"])
    trainer = train.Trainer(cfg, run["out"], resume=True, quiet=True)
    trainer.logger.close()
    trainer.ckpt.close()
    m = json.load(open(os.path.join(run["out"], "manifest.json")))
    assert m["start_step"] == 1 and m["previous_starts"] == [first]


def test_task_default_rewards_are_resolved_and_failed_regressions_reported(tmp_path, monkeypatch):
    """rewards.specs empty: the manifest lists the task's defaults (config.json cannot say them); a reward
    failing its regression set at start is an event and a warning."""
    failing = {"status": "fail", "cases": 3, "passed": 2, "failed": 1, "failed_ids": ["math-007"]}
    real = provenance.regression_status
    monkeypatch.setattr(provenance, "regression_status",
                        lambda names: {**real(names), "math": failing})
    out = str(tmp_path / "r")
    warning = rf"reward 'math' \(version {reward_version('math')}\) fails 1 of its 3 regression cases.*math-007"
    with pytest.warns(RuntimeWarning, match=warning):
        trainer = train.Trainer(tiny_config(), out, quiet=True)
    trainer.logger.close()
    trainer.ckpt.close()
    assert json.load(open(os.path.join(out, "config.json")))["rewards"]["specs"] == []
    m = json.load(open(os.path.join(out, "manifest.json")))
    assert [(r["name"], r["weight"]) for r in m["rewards"]] == [("math", 1.0), ("format", 0.1)]
    assert m["regression"]["math"] == failing and m["regression"]["format"]["status"] == "pass"
    events = [e for e in read_jsonl(os.path.join(out, "events.jsonl")) if e["kind"] == "regression_failed"]
    assert len(events) == 1 and "math-007" in events[0]["message"]


def test_regression_status_skips_the_sandbox_and_counts_failures():
    cases = regress.load_cases()
    status = provenance.regression_status(["code", "format", "format"], cases)
    assert list(status) == ["code", "format"]
    assert status["code"]["status"] == provenance.SANDBOX_SKIP == "skipped (code: sandbox)"
    assert "regress --only code" in status["code"]["reason"]
    fmt = [c for c in cases if c.data["reward"] == "format"]
    broken = regress.Case(fmt[0].path, fmt[0].line, {**fmt[0].data, "expected": 1.0 - fmt[0].data["expected"]})
    status = provenance.regression_status(["format", "length"], [broken, *fmt[1:]])
    assert status["format"] == {"status": "fail", "cases": len(fmt), "passed": len(fmt) - 1, "failed": 1,
                                "failed_ids": [fmt[0].data["id"]]}
    assert status["length"]["status"] == "no cases" and status["length"]["cases"] == 0


def test_git_state_without_a_checkout_or_without_git(tmp_path, monkeypatch):
    state = provenance.git_state(str(tmp_path))
    assert state["commit"] is None and "CalledProcessError" in state["error"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no git binary on it
    state = provenance.git_state(ROOT)
    assert state["commit"] is None and "FileNotFoundError" in state["error"]


def test_write_manifest_keeps_every_earlier_start(tmp_path):
    for step in (0, 5, 9):
        provenance.write_manifest(str(tmp_path), {"start_step": step})
    m = json.load(open(tmp_path / "manifest.json"))
    assert m["start_step"] == 9 and [p["start_step"] for p in m["previous_starts"]] == [0, 5]
    assert all("previous_starts" not in p for p in m["previous_starts"])
    assert os.listdir(tmp_path) == ["manifest.json"]  # written atomically: no temp file left


# --------------------------------------------------------------------------------------------------
# reasons
# --------------------------------------------------------------------------------------------------

# B = 2 prompts x G = 3 completions with the reasons math / format(require_answer_tag) / length give them
TEXTS = [["<think>1+1</think><answer>2</answer>", "<answer>2</answer>", "<think>x</think>"],
         ["7", "<answer>2</answer><answer>3</answer>", "<answer>5</answer>"]]
HAND_COUNT = {
    "reason/math/correct": 2, "reason/math/no_answer": 1, "reason/math/wrong_answer": 3,
    "reason/format/ok": 1, "reason/format/missing_tag:<think>": 3, "reason/format/missing_tag:<answer>": 1,
    "reason/format/repeated_tag:<answer>": 1,
    "reason/length/ok": 6,
}


def _rollout(tok: CharTokenizer, texts, t: int = 12) -> sampler.Rollout:
    b, g = len(texts), len(texts[0])
    tokens, lengths = np.zeros((b, g, t), np.int32), np.zeros((b, g), np.int32)
    for i, row in enumerate(texts):
        for j, text in enumerate(row):
            ids = tok.encode(text)
            tokens[i, j, : len(ids)], lengths[i, j] = ids, len(ids)
    zeros = np.zeros((b, g, t), np.float32)
    return sampler.Rollout(prompt_tokens=np.ones((b, 3), np.int32), prompt_mask=np.ones((b, 3), bool), tokens=tokens,
                           completion_mask=zeros, logprobs=zeros, entropies=zeros, policy_entropies=zeros, lengths=lengths,
                           truncated=np.zeros((b, g), bool), temperatures=zeros, policy_mask=np.ones((b, g, t), bool))


def _actor() -> experience.Actor:
    specs = (RewardSpec("math"), RewardSpec("format", kwargs={"require_answer_tag": True}),
             RewardSpec("length", kwargs={"target": 4}))
    tok = CharTokenizer()
    return experience.Actor(tiny(vocab_size=tok.vocab_size), tok, specs, SamplingConfig(group_size=3))


def test_reason_counts_per_step_equal_a_hand_count():
    actor = _actor()
    rows = [{"prompt": "1+1=?", "answer": "2"}] * 2
    ro = _rollout(actor.tokenizer, TEXTS)
    exp = experience.score(actor, rows, ro)
    assert list(exp.texts) == [t for row in TEXTS for t in row]
    metrics = experience.host_metrics(exp, actor.dims)
    assert {k: v for k, v in metrics.items() if k.startswith("reason/")} == HAND_COUNT
    # the logged samples carry each completion's reasons beside its rewards
    samples = experience.logged_samples(exp, actor.dims, 3, advantages_BxG=np.zeros((2, 3)))
    assert [s["reasons"] for s in samples] == [
        {"math": "correct", "format": "ok", "length": "ok"},
        {"math": "correct", "format": "missing_tag:<think>", "length": "ok"},
        {"math": "no_answer", "format": "missing_tag:<answer>", "length": "ok"}]
    assert [s["rewards"]["math"] for s in samples] == [1.0, 1.0, 0.0] and samples[0]["response"] == TEXTS[0][0]
    # dynamic sampling's group selection keeps each completion's reasons with it
    picked = experience.select_groups([exp, exp], [(1, 1), (0, 0)], pad_id=0)
    assert picked.reasons == exp.reasons[3:] + exp.reasons[:3] and picked.texts == exp.texts[3:] + exp.texts[:3]


def test_reason_codes_round_trip_and_cut_long_reasons():
    dims = ["a", "b"]
    long = "x" * (experience.REASON_BYTES - 1) + "é"  # the 2-byte character straddles the limit
    infos = [{"a": {"reason": "ok"}, "b": {"reason": long}}, {"a": {}, "b": {"reason": "naïve:<think>"}}]
    codes = experience.reason_codes(infos, dims)
    assert codes.shape == (2, 2, experience.REASON_BYTES) and codes.dtype == np.uint8
    assert experience.reasons_from_codes(codes, dims) == [{"a": "ok", "b": "x" * (experience.REASON_BYTES - 1)},
                                                          {"a": "", "b": "naïve:<think>"}]


def test_smoke_run_logs_reasons_every_step_and_in_samples(run):
    for row in run["rows"]:
        for dim in ("math", "format", "length"):
            counts = [v for k, v in row.items() if k.startswith(f"reason/{dim}/")]
            assert sum(counts) == N_COMPLETIONS, (dim, counts)
    samples = read_jsonl(os.path.join(run["out"], "samples.jsonl"))
    assert len(samples) == run["cfg"].logging.samples_per_step
    for s in samples:
        assert set(s["reasons"]) == set(s["rewards"]) == {"math", "format", "length"}
        assert (s["reasons"]["math"] == "correct") == (s["rewards"]["math"] == 1.0)
        assert (s["reasons"]["format"] == "ok") == (s["rewards"]["format"] == 1.0)
        assert s["reasons"]["length"] == "ok"


def test_samples_carry_each_groups_prompt_once_and_the_advantage_it_was_trained_with(run):
    """samples.jsonl: the prompt on a group's first row only; each completion's advantage is the estimator's
    on the logged rewards of its whole group (so it is the one the update used, not zeros or another row's)."""
    from grpo_jax import advantages as adv_lib
    from tests.tolerance import rounding_tol

    cfg, samples = run["cfg"], read_jsonl(os.path.join(run["out"], "samples.jsonl"))
    g, dims = cfg.sampling.group_size, ["math", "format", "length"]
    assert [s["group"] for s in samples] == [i // g for i in range(N_COMPLETIONS)]
    assert [("prompt" in s) for s in samples] == [i % g == 0 for i in range(N_COMPLETIONS)]
    prompts = [json.loads(line)["prompt"] for line in open(run["train_path"])]
    assert all(s["prompt"] in prompts for s in samples if "prompt" in s)
    rewards = np.array([[s["rewards"][d] for d in dims] for s in samples], np.float32).reshape(-1, g, len(dims))
    weights = np.array([spec["weight"] for spec in json.loads(SIGNAL[0].split("=", 1)[1])], np.float32)
    expected, _ = adv_lib.compute_advantages(rewards, weights, cfg=cfg.advantage)
    logged = np.array([s["advantage"] for s in samples], np.float32).reshape(-1, g)
    assert np.abs(logged).max() > 0  # a real signal: groups whose completions differ
    np.testing.assert_allclose(logged, np.asarray(expected), rtol=0, atol=rounding_tol(expected))


def test_a_launcher_from_another_checkout_is_refused(tmp_path):
    """A launcher inside a checkout with its own grpo_jax/ (e.g. a worktree of an older commit) while grpo_jax is
    imported from elsewhere would train with the other code and record the other commit: parse_args refuses it
    with the PYTHONPATH that fixes it. This repo's own launchers and scripts outside any checkout pass."""
    from grpo_jax.cli import checkout_mismatch, parse_args
    from grpo_jax.config import UserError

    other = tmp_path / "worktree"
    (other / "grpo_jax").mkdir(parents=True)
    (other / "experiments").mkdir()
    launcher = other / "experiments" / "study.py"
    launcher.write_text("from grpo_jax.config import TrainConfig\n\n\ndef get_config(smoke=False):\n"
                        "    return TrainConfig()\n")
    spec = importlib.util.spec_from_file_location("worktree_launcher", launcher)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["worktree_launcher"] = module
    try:
        with pytest.raises(UserError, match=f"PYTHONPATH={other}"):
            parse_args([], get_config=module.get_config)
    finally:
        del sys.modules["worktree_launcher"]
    assert checkout_mismatch(str(launcher)) is not None
    assert checkout_mismatch(os.path.join(ROOT, "experiments", "countdown.py")) is None
    assert checkout_mismatch(str(tmp_path / "alone.py")) is None  # no grpo_jax/ beside its folder
