"""The GRPO trainer: one step, reproducibility, kill -9 + resume, checkpoint fallback, meshes, NaN skip."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import experience, train
from grpo_jax.config import TrainConfig, override

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "steps=3", "prompts_per_step=4", "sampling.group_size=4", "sampling.max_new_tokens=12",
    "task.n_train=64", "task.n_eval=8", "logging.eval_every=0", "logging.progress=false",
    "logging.tensorboard=false", "checkpoint.every=1", "optim.lr=0.003", "model.d_model=32", "model.mlp_dim=64",
    "model.n_layers=1",
    # a random tiny model scores 0 on almost every group, which is a group-variance collapse by construction:
    # these tests exercise other things, so the collapse alarms warn instead of pausing
    "monitor.collapse_action=warn",
]


def tiny_config(*extra: str) -> TrainConfig:
    return override(TrainConfig(), TINY + list(extra))


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _final_params(run_dir):
    from grpo_jax.checkpoint import Checkpointer

    ck = Checkpointer(os.path.join(run_dir, "checkpoints"))
    step = ck.latest_step()
    meta = ck.read_meta(step)
    ck.close()
    return step, meta


def test_one_step_changes_params_and_metrics_are_sane(tmp_path):
    tr = train.Trainer(tiny_config("steps=1", "loss.beta=0.04"), str(tmp_path), quiet=True)
    before = _leaves(tr.state.params)
    metrics, timings, exp, _ = tr.step_once()
    texts, r = exp.texts, exp.rewards
    after = _leaves(tr.state.params)
    assert any((a != b).any() for a, b in zip(before, after))
    for a, b in zip(_leaves(tr.state.ref_params), before):  # the reference is frozen
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(metrics["loss"]) and metrics["skipped"] == 0
    assert 0 <= metrics["reward/math/mean"] <= 1 and 0 <= metrics["format_rate"] <= 1
    assert metrics["kl"] >= 0 and 0 <= metrics["clip_frac_low"] <= 1
    assert metrics["length/max"] <= 12 and metrics["entropy/mean"] > 0
    assert r.shape == (4, 4, 2) and len(texts) == 16
    # a fresh model samples near-uniform tokens: sampler and trainer logprobs agree to float32 noise
    assert metrics["logp_gap"] < 1e-4


def _run(out, *extra):
    cmd = [sys.executable, "-m", "grpo_jax.train", "--out", str(out), "--quiet"]
    for item in TINY + list(extra):
        cmd += ["--set", item]
    return cmd


def test_same_seed_same_metrics_different_seed_different(tmp_path):
    streams = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        train.Trainer(tiny_config(f"seed={seed}"), str(tmp_path / name), quiet=True).run()
        streams.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert streams[0] == streams[1]
    assert streams[0] != streams[2]


def test_kill_minus_9_then_resume_is_bitwise_identical(tmp_path):
    steps = 6
    extra = (f"steps={steps}",)
    subprocess.run(_run(tmp_path / "straight", *extra), check=True, cwd=ROOT, timeout=600)
    kill_after = int(np.random.default_rng().integers(1, steps))  # a random step, as the issue asks
    proc = subprocess.Popen(_run(tmp_path / "killed", *extra), cwd=ROOT)
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        done = [int(p) for p in os.listdir(ckpts) if p.isdigit()] if ckpts.exists() else []
        if done and max(done) >= kill_after:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(_run(tmp_path / "killed", *extra) + ["--resume"], check=True, cwd=ROOT, timeout=600)
    from grpo_jax.checkpoint import Checkpointer

    finals = []
    for name in ("straight", "killed"):
        tr = train.Trainer(tiny_config(*extra), str(tmp_path / f"probe-{name}"), quiet=True)
        ck = Checkpointer(str(tmp_path / name / "checkpoints"))
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tr.state)
        state, _, step = ck.restore(target)
        assert step == steps
        finals.append(_leaves(state.params) + _leaves(state.opt_state))
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)
    assert (tmp_path / "straight" / "metrics.jsonl").read_bytes() == (tmp_path / "killed" / "metrics.jsonl").read_bytes()


def test_corrupt_latest_checkpoint_falls_back_and_unsafe_resume_is_refused(tmp_path):
    cfg = tiny_config("steps=2")
    train.Trainer(cfg, str(tmp_path), quiet=True).run()
    latest = tmp_path / "checkpoints" / "2"
    data_files = [os.path.join(d, f) for d, _, fs in os.walk(latest) for f in fs if os.path.getsize(os.path.join(d, f)) > 0]
    for path in data_files:  # overwrite every non-empty file of the newest checkpoint with garbage
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(os.urandom(size))
    with pytest.warns(RuntimeWarning, match="trying an older checkpoint"):
        tr = train.Trainer(override(cfg, ["steps=3"]), str(tmp_path), resume=True, quiet=True)
    assert tr.step == 1
    from grpo_jax.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="group_size"):
        train.Trainer(override(cfg, ["sampling.group_size=2"]), str(tmp_path), resume=True, quiet=True)


def _direct_step(*extra, dtype="float32", keep_reference=False):
    """(state, jitted step, batch of 4 prompts x G=4 from the state's own sampler) for a tiny model."""
    cfg = tiny_config(*extra)
    import models
    from grpo_jax import sampler

    model_cfg = models.tiny(vocab_size=58).replace(param_dtype=dtype, dtype=dtype)
    opt = train.make_optimizer(cfg)
    state = train.init_state(models.init_params(model_cfg, jax.random.key(0)), opt, keep_reference=keep_reference)
    step = jax.jit(train.make_train_step(model_cfg, cfg, opt))
    prompts, mask = jnp.full((4, 8), 9), jnp.ones((4, 8), bool)
    ro = sampler.sample(model_cfg, state.params, prompts, mask, key=jax.random.key(1), group_size=4,
                        max_new_tokens=12)
    batch = experience.batch_from_rollout(ro, jnp.linspace(-1, 1, 16))
    return state, (lambda st, bt, key: step(st, bt, key, jnp.float32(0.0))), batch


def test_nan_loss_skips_the_update():
    state, step, batch = _direct_step()
    adv = batch.advantages.at[3].set(jnp.nan)  # NaN reaches the loss through one row
    batch = batch.replace(advantages=adv)
    new_state, metrics = step(state, batch, jax.random.key(2))
    assert float(metrics["skipped"]) == 1.0
    for a, b in zip(_leaves(new_state.params) + _leaves(new_state.opt_state), _leaves(state.params) + _leaves(state.opt_state)):
        np.testing.assert_array_equal(a, b)
    ok_state, ok_metrics = step(state, batch.replace(advantages=jnp.nan_to_num(adv)), jax.random.key(2))
    assert float(ok_metrics["skipped"]) == 0.0
    assert any((a != b).any() for a, b in zip(_leaves(ok_state.params), _leaves(state.params)))


def test_bfloat16_params_train_and_keep_their_dtype():
    """bf16 params (the GPU/TPU benchmark preset): the step runs over 2 microbatches with a reference
    model, moves the params, and every param and Adam moment stays bf16 (the averaged gradient used to be
    promoted to f32 by the f32 token count, which broke the minibatch scan's carry)."""
    state, step, batch = _direct_step("microbatches=2", "loss.beta=0.04", dtype="bfloat16", keep_reference=True)
    new_state, metrics = step(state, batch, jax.random.key(2))
    assert float(metrics["skipped"]) == 0.0 and np.isfinite(float(metrics["loss"]))
    for old, new in zip(_leaves(state.params) + _leaves(state.opt_state), _leaves(new_state.params) + _leaves(new_state.opt_state)):
        assert new.dtype == old.dtype
    assert {x.dtype for x in _leaves(new_state.params)} == {jnp.dtype(jnp.bfloat16)}
    assert any((a != b).any() for a, b in zip(_leaves(new_state.params), _leaves(state.params)))


def test_chunked_logprobs_equal_one_pass():
    """The reference / recompute pass sliced into row chunks (lax.map) gives the one-pass numbers; rows
    differ (random tokens, per-token temperatures), so a chunk mix-up would show."""
    import models

    model_cfg = models.tiny(vocab_size=58)
    params = models.init_params(model_cfg, jax.random.key(0))
    n, length, t = 8, 20, 12
    tokens = jax.random.randint(jax.random.key(1), (n, length), 0, 58)
    batch = experience.Batch(tokens=tokens, attn_mask=jnp.ones((n, length), bool), loss_mask=None, old_logp=None,
                             advantages=None, temperatures=jax.random.uniform(jax.random.key(2), (n, t), minval=0.5,
                                                                              maxval=1.5))
    whole = train.chunked_logprobs(model_cfg, params, batch, t, 1)
    assert whole.shape == (n, t)
    for chunks in (2, 4):
        np.testing.assert_allclose(train.chunked_logprobs(model_cfg, params, batch, t, chunks), whole, atol=1e-5)


MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from grpo_jax import train
    from grpo_jax.config import TrainConfig, override
    items = json.loads(sys.argv[1])
    tr = train.Trainer(override(TrainConfig(), items), sys.argv[2], quiet=True)
    losses = [tr.step_once()[0]["loss"] for _ in range(2)]
    qkv = tr.state.params["layers"][0]["qkv"]
    print(json.dumps({"losses": losses, "spec": str(qkv.sharding.spec), "devices": len(qkv.sharding.device_set),
                      "params": [np.asarray(x).tolist() for x in jax.tree.leaves(tr.state.params)]}))
""")


def _mesh_run(tmp_path, name, devices, *extra):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    items = TINY + ["model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=16", "model.d_model=64"] + list(extra)
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT, json.dumps(items), str(tmp_path / name)], env=env,
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_2x2x2_mesh_matches_single_device(tmp_path):
    one = _mesh_run(tmp_path, "one", 1, "mesh.data=1")
    many = _mesh_run(tmp_path, "many", 8, "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2")
    assert many["devices"] == 8 and "tensor" in many["spec"] and "fsdp" in many["spec"], many["spec"]
    np.testing.assert_allclose(many["losses"], one["losses"], atol=1e-5)
    for a, b in zip(many["params"], one["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


DIST_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    pid, port, items, out = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from grpo_jax import train
    from grpo_jax.config import TrainConfig, override
    assert jax.device_count() == 4 and jax.local_device_count() == 2
    tr = train.Trainer(override(TrainConfig(), items), out, quiet=True)
    losses = [tr.step_once()[0]["loss"] for _ in range(2)]
    print(json.dumps({"losses": losses, "pid": pid}))
""")


def test_two_processes_with_jax_distributed_match_one_process(tmp_path):
    """Two CPU processes x 2 devices (a stand-in for a pod) run 2 steps and agree with one process."""
    import socket

    items = TINY + ["model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=16", "model.d_model=64"]
    one = _mesh_run(tmp_path, "one", 1, "mesh.data=1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, "-c", DIST_SCRIPT, str(i), str(port), json.dumps(items + ["mesh.data=4"]),
                               str(tmp_path / "dist")], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
    results = [json.loads(so.strip().splitlines()[-1]) for so, _ in outs]
    for r in results:
        np.testing.assert_allclose(r["losses"], one["losses"], atol=1e-5)


def test_inner_epochs_and_minibatches_count_grpo_steps(tmp_path):
    """mu = 2 epochs x 2 minibatches = 4 optimizer updates per GRPO step; steps still count rollouts."""
    tr = train.Trainer(tiny_config("steps=2", "mu=2", "minibatches=2", "microbatches=2"), str(tmp_path), quiet=True)
    tr.run()
    from grpo_jax.runlog import read_jsonl

    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["num_seqs"] == 2 * 16  # both epochs saw all 16 rows (4 prompts x G=4)
    assert tr.step == 2


# ---- issue 18: run folders ----------------------------------------------------------------------------------

def _interrupt_before_first_checkpoint(out, cfg):
    """What a run killed (Ctrl-C, kill -9) after logging its first step, during its first save, leaves: rows
    in the step files, an unfinished orbax save, no checkpoint."""
    tr = train.Trainer(cfg, str(out), quiet=True)
    metrics, timings, _, histograms = tr.step_once()
    tr.logger.log(1, metrics, timings=timings, histograms=histograms)
    tr.logger.close()
    (out / "checkpoints" / "1.orbax-checkpoint-tmp-1796000000").mkdir(parents=True)
    assert tr.ckpt.steps() == []


def _events(out):
    from grpo_jax.runlog import read_jsonl

    return read_jsonl(str(out / "events.jsonl"))


def test_interrupted_before_its_first_checkpoint_restarts_keeping_the_old_logs(tmp_path):
    """Issue 18: neither --resume nor a plain rerun could use such a folder (FileExistsError: "pass
    resume_step=k", a parameter the command line does not have)."""
    cfg = tiny_config("steps=2", "checkpoint.every=0")
    train.Trainer(cfg, str(tmp_path / "straight"), quiet=True).run()
    for name, resume in (("resumed", True), ("rerun", False)):
        out = tmp_path / name
        _interrupt_before_first_checkpoint(out, cfg)
        old = {f: (out / f).read_bytes() for f in ("metrics.jsonl", "events.jsonl", "config.json")}
        with pytest.warns(RuntimeWarning, match="stopped before its first checkpoint .* moved to"):
            tr = train.Trainer(cfg, str(out), resume=resume, quiet=True)
        assert tr.run()["steps"] == 2
        assert (out / "metrics.jsonl").read_bytes() == (tmp_path / "straight" / "metrics.jsonl").read_bytes(), name
        (kept,) = (out / "interrupted").iterdir()
        assert {f: (kept / f).read_bytes() for f in old} == old, name  # nothing of the first attempt is lost
        assert _events(out)[0]["kind"] == "restart" and _events(out)[0]["previous_logs"] == str(kept)
    # a folder with checkpoints is never restarted over: the message names the flags that continue it
    with pytest.raises(FileExistsError, match=r"checkpoints at steps \[2\].*--resume.*--rollback-to"):
        train.Trainer(cfg, str(tmp_path / "straight"), quiet=True)


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    with pytest.warns(RuntimeWarning, match="--resume: .* has no checkpoint to resume from .*starting a new run"):
        tr = train.Trainer(tiny_config(), str(tmp_path), resume=True, quiet=True)
    tr.logger.close()
    assert [e["kind"] for e in _events(tmp_path)][:2] == ["resume_nothing", "data"]


def test_model_vocabulary_smaller_than_the_tokenizers_is_an_error_naming_both(tmp_path):
    """Issue 18: JAX clamps out-of-range ids in the embedding lookup, so this trained silently on garbage."""
    import models
    from grpo_jax.tasks import get_task

    n_ids = get_task("arithmetic").tokenizer().vocab_size
    for name, vocab in (("small", n_ids - 5), ("padded", n_ids + 6)):
        cfg = models.tiny(vocab_size=vocab)
        models.save_hf(cfg, models.init_params(cfg, jax.random.key(0)), str(tmp_path / name))
    with pytest.raises(ValueError, match=rf"vocab_size {n_ids - 5} \(config\.json\), smaller than the {n_ids} ids "
                                         rf"of CharTokenizer.*ids {n_ids - 5}\.\.{n_ids - 1} would be clamped"):
        train.Trainer(tiny_config(f"model.hf_path={tmp_path / 'small'}"), str(tmp_path / "run1"), quiet=True)
    tr = train.Trainer(tiny_config(f"model.hf_path={tmp_path / 'padded'}"), str(tmp_path / "run2"), quiet=True)
    assert tr.actor.model_cfg.vocab_size == n_ids + 6  # a larger (padded) vocabulary is fine
    tr.logger.close()


def test_rejected_weights_file_is_logged_in_events(tmp_path):
    """Issue 18: a rejected hot reload showed only on stderr."""
    wfile = tmp_path / "weights.json"
    wfile.write_text('{"math": "heavy"}')
    tr = train.Trainer(tiny_config("steps=1", f"rewards.weights.weights_file={wfile}"), str(tmp_path / "run"),
                       quiet=True)
    with pytest.warns(UserWarning, match="ignored at step 0"):
        tr.step_once()
    tr.logger.close()
    (event,) = [e for e in _events(tmp_path / "run") if e["kind"] == "reward_weights_rejected"]
    assert event["step"] == 0 and event["file"] == str(wfile)
    assert "weight of 'math' must be a finite number" in event["problem"] and event["kept"]["math"] == 1.0


def test_fallback_from_a_truncated_checkpoint_warns_once_without_event_loop_tracebacks(tmp_path):
    """Issue 18: the abandoned reads of the bad step printed ~28 "RuntimeError: Event loop is closed"
    tracebacks (only in a process that goes on working, hence the subprocess)."""
    train.Trainer(tiny_config("steps=2"), str(tmp_path), quiet=True).run()
    state = tmp_path / "checkpoints" / "2" / "state"
    shards = [os.path.join(d, f) for d, _, fs in os.walk(state) for f in fs if os.path.basename(d) == "d"]
    assert shards
    for path in shards:
        os.truncate(path, os.path.getsize(path) // 2)
    out = subprocess.run(_run(tmp_path, "steps=3") + ["--resume"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("trying an older checkpoint") == 1
    assert "Event loop is closed" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
