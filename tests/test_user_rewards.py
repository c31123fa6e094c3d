"""A researcher's own rewards and tasks by import path (examples/my_rewards.py, examples/my_task.py): the
adapter's guarantees, versions, errors naming the spec and the path, and a real run that trains, resumes,
rolls back and exports with a reward from outside the package."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
import sys
import textwrap

import jax
import numpy as np
import pytest

from grpo_jax import build, export, train
from grpo_jax.config import TrainConfig, from_dict, override
from grpo_jax.rewards import MissingFieldError, RewardInputError, RewardResult
from grpo_jax.rewards.registry import RewardSpec, describe, evaluate, start_evaluate
from grpo_jax.rewards.user import adapt, adapt_batched, source_version, user_reward
from grpo_jax.runlog import read_jsonl
from grpo_jax.tasks import get_task
from tests.test_train import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
ROW = {"prompt": "12+30=", "answer": "42", "difficulty": 0}


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch):
    """The example modules are outside the package: importable only with their folder on sys.path."""
    monkeypatch.syspath_prepend(EXAMPLES)


def test_a_plain_function_gets_the_completion_the_row_fields_and_its_spec_kwargs():
    seen = {}

    def scorer(completion, answer, scale=1.0):  # names two of the row's fields' worth: only `answer` is passed
        seen.update(completion=completion, answer=answer, scale=scale)
        return scale * (answer in completion)

    fn = adapt(user_reward("3")(scorer), "mod:scorer")
    result = fn("it is 42", ROW, scale=0.5)
    assert result.score == 0.5 and result.info["reason"] == "ok"
    assert seen == {"completion": "it is 42", "answer": "42", "scale": 0.5}
    assert fn.reward_version == "3" and fn.accepted_kwargs == {"answer", "scale"}

    everything = adapt(lambda completion, **row: float(sorted(row) == ["answer", "difficulty", "prompt"]), "m:f")
    assert everything("x", ROW).score == 1.0 and everything.accepted_kwargs is None  # **row: every field


def test_model_output_never_raises_a_failure_is_an_error_none_does_not_apply_and_scores_pass_through():
    def fragile(completion, answer):
        return 1.0 / (len(completion) - 3)  # ZeroDivisionError on a 3-character completion

    fn = adapt(fragile, "mod:fragile")
    broken = fn("abc", ROW)  # the row does not count for the dimension (NaN) and says why, where
    assert math.isnan(broken.score) and broken.info["reason"] == "internal_error"
    assert broken.info["error"] == "ZeroDivisionError: float division by zero"
    assert broken.info["error_kind"] == "ZeroDivisionError" and broken.info["where"].endswith("in fragile")
    assert fn("abcd", ROW).score == 1.0
    low = fn("ab", ROW)  # 1 / -1: no range declared, so the score is the function's, unclamped
    assert low.score == -1.0 and low.info["reason"] == "ok"
    assert fn(None, ROW).info["reason"] == "response_not_a_string"
    for value, kind in (("yes", "wrong_type"), ([1.0], "wrong_type"), (float("nan"), "not_finite"),
                        (float("inf"), "not_finite")):
        odd = adapt(lambda completion, v=value, **row: v, "mod:odd")("x", ROW)
        assert math.isnan(odd.score) and odd.info["reason"] == "bad_score" and odd.info["error_kind"] == kind, value
    assert "a reward returns a number, None" in adapt(lambda completion, **row: "yes", "m:s")("x", ROW).info["error"]
    skipped = adapt(lambda completion, **row: None, "mod:none")("x", ROW)  # TRL's None: does not apply here
    assert math.isnan(skipped.score) and skipped.info["reason"] == "not_applicable"
    penalty = user_reward("1", low=-1.0, high=0.0)
    assert adapt(penalty(lambda completion, **row: -0.25), "m:p")("x", ROW).score == -0.25
    outside = adapt(penalty(lambda completion, **row: 0.5), "m:p")("x", ROW)
    assert math.isnan(outside.score) and outside.info["error_kind"] == "out_of_range"
    assert "outside the range [-1, 0]" in outside.info["error"]
    assert adapt(user_reward("1", lo=-1.0, hi=0.0)(lambda completion, **row: 0), "m:q").score_range == (-1.0, 0.0)
    assert adapt(lambda completion, **row: 0, "m:r").score_range == (-math.inf, math.inf)
    with pytest.raises(MissingFieldError, match=r"reward 'mod:fragile' takes \['answer'\], which the row does not"):
        fn("abcd", {"prompt": "1+1="})  # a data bug: stops the run
    with pytest.raises(RewardInputError, match=r"keyword arguments \['answer'\] of its spec are also fields"):
        adapt(lambda completion, **row: 1.0, "mod:f")("x", ROW, answer="7")

    def strict(completion, answer):
        raise RewardInputError("the user's own check of its row")

    with pytest.raises(RewardInputError, match="the user's own check"):
        adapt(strict, "mod:strict")("x", ROW)


def _specs(*entries):
    cfg = override(TrainConfig(), ["rewards.specs=" + json.dumps(list(entries))])
    return build.reward_specs(cfg, get_task("arithmetic"))


def test_the_version_comes_from_the_decorator_the_spec_or_else_a_digest_of_the_source():
    specs = _specs({"name": "my_rewards:brevity", "kwargs": {"budget": 8}},
                   {"name": "my_rewards:contains_answer", "version": "7"})
    assert [(d["dimension"], d["name"], d["version"]) for d in describe(specs)] == [
        ("brevity", "my_rewards:brevity", "1"), ("contains_answer", "my_rewards:contains_answer", "7")]
    assert describe(specs)[0]["file"] == os.path.join(EXAMPLES, "my_rewards.py")
    rewards, infos = evaluate(specs, ["", "42 is it"], [ROW, ROW])
    np.testing.assert_allclose(rewards, [[1.0, 0.0], [0.0, 1.0]])
    assert infos["versions"] == {"brevity": "1", "contains_answer": "7"}
    # neither: a digest of the function's source, which changes with the function's text
    digest = describe(_specs({"name": "my_rewards:contains_answer"}))[0]["version"]
    source = inspect.getsource(importlib.import_module("my_rewards").contains_answer)
    assert digest == "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]

    def one(completion):
        return 1.0

    def other(completion):
        return 0.0

    assert source_version(one) != source_version(other)
    with pytest.raises(ValueError, match=r"rewards\.specs\[0\] = .*pins version '2' but the reward is '1'"):
        _specs({"name": "my_rewards:brevity", "version": "2"})
    with pytest.raises(ValueError, match=r"rewards\.specs\[0\] = .*unknown kwargs \['budgt'\]; accepted: \['answer'\]"):
        _specs({"name": "my_rewards:contains_answer", "version": "1", "kwargs": {"budgt": 3}})


@pytest.mark.parametrize("name, words", [
    ("no_such_module:brevity", r"'no_such_module:brevity': no module named 'no_such_module' on the Python path"),
    ("my_rewards:brevty", r"'my_rewards:brevty': 'my_rewards' has no attribute 'brevty'"),
    ("my_rewards:RewardResult.nope", r"'my_rewards:RewardResult\.nope': 'my_rewards:RewardResult' has no attribute"),
    ("my_rewards:", r"'my_rewards:' is not an import path of the form package\.module:function"),
])
def test_an_unknown_module_or_attribute_is_one_line_naming_the_spec_and_the_path(name, words):
    with pytest.raises(ValueError) as e:
        _specs({"name": "math"}, {"name": name, "version": "1"})
    message = str(e.value)
    assert "\n" not in message and message.startswith("rewards.specs[1] = "), message
    assert __import__("re").search(words, message), message


def test_a_module_that_fails_to_import_or_a_name_that_is_no_reward_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_rewards.py").write_text("import definitely_not_installed_pkg\n")
    (tmp_path / "odd_rewards.py").write_text("LIMIT = 3\n\ndef nothing():\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, words in (
            ("broken_rewards:f", r"importing module 'broken_rewards' failed: ModuleNotFoundError: .*definitely_not"),
            ("odd_rewards:LIMIT", r"'odd_rewards:LIMIT' is a int, not a reward function"),
            ("odd_rewards:nothing", r"'odd_rewards:nothing' must take the completion text as its first argument")):
        with pytest.raises(ValueError, match=r"rewards\.specs\[0\] = .*" + words) as e:
            _specs({"name": name, "version": "1"})
        assert "\n" not in str(e.value)


def test_a_task_by_import_path_takes_its_options():
    task = get_task("my_task:subtraction", digits=2)
    assert task.name == "subtraction" and task.digits == 2
    rows = task.generate("train", 4, seed=0)
    assert all(r["op"] == "-" and len(r["prompt"]) == 6 for r in rows)
    with pytest.raises(ValueError, match=r"task 'my_task:subtraction' cannot take task.options \['digts'\]"):
        get_task("my_task:subtraction", digts=2)
    with pytest.raises(ValueError, match=r"'my_task:nope': 'my_task' has no attribute 'nope'"):
        get_task("my_task:nope")
    with pytest.raises(ValueError, match=r"task 'my_rewards:brevity' gave a float without a Task's generate"):
        get_task("my_rewards:brevity", completion="x")
    with pytest.raises(ValueError, match=r"unknown task 'arithmetc'; .*or your own as package\.module:TaskClass"):
        get_task("arithmetc")


USER_SPECS = [{"name": "math", "weight": 1.0}, {"name": "my_rewards:brevity", "weight": 1.0, "kwargs": {"budget": 12}},
              {"name": "my_rewards:contains_answer", "weight": 0.1, "version": "1"},
              {"name": "my_rewards:judged_in_one_request", "weight": 0.1}]


@pytest.mark.slow
def test_a_run_with_a_user_reward_trains_resumes_rolls_back_and_exports(tmp_path):
    out = str(tmp_path / "run")
    cfg = tiny_config("steps=2", "task.name=my_task:subtraction", "task.options.digits=2",
                      "rewards.specs=" + json.dumps(USER_SPECS))
    train.Trainer(cfg, out, quiet=True).run()
    rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2]
    # brevity differs between completions of one prompt that stop at different lengths: a real gradient
    assert all(np.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows), [r["grad_norm"] for r in rows]
    assert all("reward/brevity/mean" in r for r in rows)
    # the batched judge scores as contains_answer does, per completion
    assert [r["reward/judged_in_one_request/mean"] for r in rows] == [r["reward/contains_answer/mean"] for r in rows]

    # the import paths live in config.json: a run rebuilt from it alone resumes, as a fresh process would
    saved = from_dict(TrainConfig, json.load(open(os.path.join(out, "config.json"))))
    assert saved.task.name == "my_task:subtraction" and saved.rewards.specs[1]["name"] == "my_rewards:brevity"
    resumed = train.Trainer(override(saved, ["steps=3"]), out, resume=True, quiet=True)
    assert resumed.step == 2
    resumed.run()
    assert [r["step"] for r in read_jsonl(os.path.join(out, "metrics.jsonl"))] == [1, 2, 3]

    manifest = json.load(open(os.path.join(out, "manifest.json")))
    for record in (manifest, manifest["previous_starts"][0]):  # the resumed start and the first one
        rewards = {r["name"]: r for r in record["rewards"]}
        assert rewards["my_rewards:brevity"]["version"] == "1" and rewards["my_rewards:brevity"]["dimension"] == "brevity"
        assert rewards["my_rewards:contains_answer"]["version"] == "1"
        assert rewards["my_rewards:judged_in_one_request"]["dimension"] == "judged_in_one_request"
        assert record["regression"]["my_rewards:brevity"]["status"] == "no cases"
    assert manifest["start_step"] == 2

    info = export.main([out, str(tmp_path / "hf")])  # rebuilds the task's tokenizer from its import path
    assert info["step"] == 3 and os.path.exists(os.path.join(tmp_path, "hf", "config.json"))
    rolled = train.Trainer(override(saved, ["steps=3"]), out, rollback_to=1, quiet=True)
    rolled.release_lock()
    assert rolled.step == 1
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert manifest["start_step"] == 1 and len(manifest["previous_starts"]) == 2
    assert {r["name"]: r["version"] for r in manifest["rewards"]}["my_rewards:brevity"] == "1"


def test_a_user_reward_module_is_imported_again_by_a_fresh_process(tmp_path):
    """What resume, rollback and export rely on: a new process rebuilds the specs from config.json alone."""
    cfg = override(TrainConfig(), ["rewards.specs=" + json.dumps(USER_SPECS)])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(__import__("grpo_jax.config", fromlist=["to_dict"]).to_dict(cfg)))
    code = textwrap.dedent(f"""
        import json
        from grpo_jax import build
        from grpo_jax.config import TrainConfig, from_dict
        from grpo_jax.rewards.registry import describe
        from grpo_jax.tasks import get_task
        cfg = from_dict(TrainConfig, json.load(open({str(path)!r})))
        print(json.dumps([(d["name"], d["version"]) for d in describe(build.reward_specs(cfg, get_task("arithmetic")))]))
    """)
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLES, ROOT]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        ["math", "7"], ["my_rewards:brevity", "1"], ["my_rewards:contains_answer", "1"],
        ["my_rewards:judged_in_one_request", "1"]]


@pytest.mark.slow
def test_a_run_with_a_user_reward_killed_mid_run_resumes_in_a_new_process_and_exports(tmp_path):
    """The user's path end to end in separate processes: `python -m grpo_jax.train` with a reward and a task
    from outside the package is killed (SIGKILL) after a checkpoint, a new process resumes it with --resume,
    trains on with a real gradient, and the export reads the run back; the manifest of each start lists the
    user reward with its version."""
    import signal
    import subprocess
    import time

    from tests.test_train import _run

    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLES, ROOT]))
    args = ("task.name=my_task:subtraction", "task.options.digits=2", "rewards.specs=" + json.dumps(USER_SPECS),
            "checkpoint.every=1", "checkpoint.keep_last=5", "logging.eval_every=0")
    proc = subprocess.Popen(_run(out, "steps=500", *args), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    ckpts = out / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if ckpts.is_dir() and sum(p.name.isdigit() for p in ckpts.iterdir()) >= 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read()[-2000:]  # still training: the kill lands mid-run
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(r["step"] for r in read_jsonl(str(out / "metrics.jsonl")))
    assert 2 <= killed_at < 500

    resumed = subprocess.run(_run(out, f"steps={killed_at + 2}", *args) + ["--resume"], env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = read_jsonl(str(out / "metrics.jsonl"))
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == killed_at + 2  # no step twice, none lost
    assert all(np.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows if r["step"] > killed_at - 1)
    manifest = json.load(open(out / "manifest.json"))
    for record in (manifest, manifest["previous_starts"][0]):
        assert {r["name"]: r["version"] for r in record["rewards"]}["my_rewards:brevity"] == "1"
    assert manifest["start_step"] >= 1
    # the resumed process moved the policy: its last checkpoint differs from the one it resumed from
    _, _, resumed_from, _, _ = export.restore_policy(str(out), manifest["start_step"])
    _, _, final, _, final_step = export.restore_policy(str(out))
    assert final_step == killed_at + 2
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(resumed_from), strict=True))

    exported = subprocess.run([sys.executable, "-m", "grpo_jax.export", str(out), str(tmp_path / "hf")], env=env,
                              capture_output=True, text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert (tmp_path / "hf" / "config.json").exists()


# A reward that waits (a remote judge) declared with threads: its calls run in threads, concurrently, and
# `start_evaluate` returns while they wait, so the caller's host work overlaps them.
WAITING_REWARDS = """
import threading
from grpo_jax.rewards import user_reward

RELEASE = threading.Event()
TOGETHER = threading.Barrier(4, timeout=20)
THREADS = []

@user_reward("1", threads=4)
def judged(completion, **row):
    THREADS.append(threading.current_thread().name)
    TOGETHER.wait()  # passes only when 4 calls run at once
    return float(RELEASE.wait(timeout=20))  # 0 if nobody released it: the caller waited for it first

@user_reward("1", threads=2)
def judge_down(completion, **row):
    raise {error}("the judge is down")
"""


def _waiting_rewards(tmp_path, monkeypatch, module: str, error: str = "RuntimeError"):
    (tmp_path / f"{module}.py").write_text(WAITING_REWARDS.format(error=error))
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(module)


def test_a_reward_declared_with_threads_runs_concurrently_and_after_start_returns(tmp_path, monkeypatch):
    """8 calls of a threads=4 reward: they pass a 4-party barrier (4 ran at once, off the main thread), and they
    finish only after `start_evaluate` returned and the caller released them, which it could not have done
    if they ran inline (each would wait out its 20 s and score 0). The inline format reward beside it is done
    by then. Results come back in response order, whatever order the threads finished in."""
    mod = _waiting_rewards(tmp_path, monkeypatch, "waiting_rewards_a")
    specs = [RewardSpec("waiting_rewards_a:judged"), RewardSpec("format")]
    responses = [f"<think>{i}</think><answer>{i}</answer>" for i in range(8)]
    scoring = start_evaluate(specs, responses, [dict(ROW, id=i) for i in range(8)])
    assert "format" in scoring.columns and not all(f.done() for f in scoring.pending["judged"])
    mod.RELEASE.set()
    r, infos = scoring.result()
    np.testing.assert_array_equal(r[:, 0], np.ones(8))
    assert len(mod.THREADS) == 8 and all(name.startswith("reward-judged") for name in mod.THREADS)
    assert infos["dimensions"] == ["judged", "format"] and r[:, 1].min() > 0
    assert [p["judged"]["reason"] for p in infos["per_response"]] == ["ok"] * 8


@pytest.mark.parametrize("error", ["RuntimeError", "RewardInputError"])
def test_a_threaded_reward_that_raises_is_scored_or_named_like_an_inline_one(tmp_path, monkeypatch, error):
    """What a threaded user reward raises is handled as it is inline: an ordinary exception fails the row (NaN,
    left out of the dimension) with the error in its info; a RewardInputError (a bad row) stops scoring, raised by
    `result()` with the dimension and the row named."""
    if error == "RewardInputError":
        WAITING = "from grpo_jax.rewards import RewardInputError\n"
        (tmp_path / "waiting_rewards_c.py").write_text(WAITING + WAITING_REWARDS.format(error=error))
        monkeypatch.syspath_prepend(str(tmp_path))
        spec = RewardSpec("waiting_rewards_c:judge_down")
        with pytest.raises(RewardInputError, match=r"'judge_down'.*response \d of 3 \(row id=\d"):
            start_evaluate([spec], ["a", "b", "c"], [dict(ROW, id=i) for i in range(3)]).result()
        return
    _waiting_rewards(tmp_path, monkeypatch, "waiting_rewards_b", error)
    r, infos = evaluate([RewardSpec("waiting_rewards_b:judge_down")], ["a", "b"], [ROW, ROW])
    assert np.isnan(r[:, 0]).all()  # a failed row does not count for the dimension
    assert infos["per_response"][0]["judge_down"]["reason"] == "internal_error"
    assert "the judge is down" in json.dumps(infos["per_response"][0])


def test_threads_must_be_a_non_negative_int_and_travel_through_the_adapter():
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="threads must be an int >= 0"):
            user_reward("1", threads=bad)
    fn = adapt(user_reward("1", threads=3)(lambda completion, **row: 1.0), "m:judge")
    assert fn.reward_threads == 3
    assert adapt(user_reward("1")(lambda completion, **row: 1.0), "m:plain").reward_threads == 0


def test_a_batched_reward_is_called_once_per_batch_with_the_rows_as_columns():
    """`batched=True`: one call for the batch, the completions as a list and each row field as a list over the
    batch (spec kwargs as they are); each score is read as a per-completion reward's is: no declared range, so
    3.0 stays 3.0, and a NaN is an error of that row."""
    calls = []

    @user_reward("1", batched=True)
    def judge(completions, answer, scale=1.0):
        calls.append((list(completions), list(answer), scale))
        return [scale * (a in c) for c, a in zip(completions, answer)][:-1] + [float("nan")]

    fn = adapt_batched(judge, "m:judge")
    rows = [dict(ROW, answer=a) for a in ("42", "7", "9")]
    results = fn(["it is 42", "8", "9", "x"], rows + [dict(ROW, answer="x")], scale=3.0)
    assert calls == [(["it is 42", "8", "9", "x"], ["42", "7", "9", "x"], 3.0)]
    assert [r.score for r in results[:3]] == [3.0, 0.0, 3.0] and np.isnan(results[3].score)
    assert [r.info["reason"] for r in results] == ["ok", "ok", "ok", "bad_score"]
    assert results[3].info["error_kind"] == "not_finite"
    assert fn.reward_batched and fn.accepted_kwargs == {"answer", "scale"}


@pytest.mark.parametrize("body, reasons, words", [
    ("raise RuntimeError('judge down')", ["internal_error"] * 2, "judge down"),
    ("return [1.0]", ["bad_score"] * 2, "returned 1 scores for 2 completions"),
    ("return 1.0", ["bad_score"] * 2, "returned float 1.0; a batched reward returns one score per completion"),
    ("return [1.0, 'yes']", ["ok", "bad_score"], "returned str"),
])
def test_a_batched_reward_that_fails_fails_its_rows_with_the_error(body, reasons, words):
    namespace: dict = {}
    exec(f"def judge(completions, **row):\n    {body}\n", namespace)
    fn = adapt_batched(user_reward("1", batched=True)(namespace["judge"]), "m:judge")
    results = fn(["a", "b"], [ROW, ROW])
    assert [r.info["reason"] for r in results] == reasons
    failed = [r for r in results if r.info["reason"] != "ok"]
    assert all(np.isnan(r.score) and words in r.info["error"] for r in failed)


def test_a_batched_reward_with_a_missing_field_names_it_and_the_batch(tmp_path, monkeypatch):
    (tmp_path / "batched_rewards.py").write_text(
        "from grpo_jax.rewards import user_reward\n\n"
        "@user_reward('1', batched=True)\ndef needs_gold(completions, gold):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingFieldError, match=r"'needs_gold'.*batch of 2 responses.*\['gold'\], which the row"):
        evaluate([RewardSpec("batched_rewards:needs_gold")], ["a", "b"], [dict(ROW, id=1), dict(ROW, id=2)])


def test_a_batched_reward_with_threads_waits_beside_the_inline_rewards(tmp_path, monkeypatch):
    """A batched judge with a thread: one call, off the main thread, still waiting when `start_evaluate` has
    returned (the caller releases it); its scores land in response order."""
    (tmp_path / "batched_judge.py").write_text(
        "import threading\nfrom grpo_jax.rewards import user_reward\nRELEASE, SEEN = threading.Event(), []\n\n"
        "@user_reward('1', threads=1, batched=True)\ndef judge(completions, id):\n"
        "    SEEN.append((threading.current_thread().name, list(id)))\n"
        "    return [float(RELEASE.wait(timeout=20)) * i / 10 for i in id]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import batched_judge

    scoring = start_evaluate([RewardSpec("batched_judge:judge"), RewardSpec("format")], ["a", "b", "c"],
                             [dict(ROW, id=i) for i in (3, 1, 2)])
    assert "format" in scoring.columns and not scoring.pending["judge"][0].done()
    batched_judge.RELEASE.set()
    r, infos = scoring.result()
    np.testing.assert_allclose(r[:, 0], [0.3, 0.1, 0.2])
    assert len(batched_judge.SEEN) == 1 and batched_judge.SEEN[0][0].startswith("reward-judge")
    assert batched_judge.SEEN[0][1] == [3, 1, 2] and infos["time_s"]["judge"] > 0
