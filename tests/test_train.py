"""The GRPO trainer: one step, reproducibility, kill -9 + resume, checkpoint fallback, meshes, NaN skip."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import experience, train, update
from grpo_jax.checkpoint import CheckpointError
from grpo_jax.config import TrainConfig, override
from tests.tolerance import EPS32, logprob_tol

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


# Why SIGNAL: with TINY alone the random model scores 0 on every completion, every advantage is 0, and loss,
# grad_norm and the param update are exactly 0, so comparing two runs compares zeros. A length reward (the
# sampler's token count, `response_length`, against a target of 6 of the 12 new tokens) differs within
# groups whose completions stop at different lengths, which gives a real gradient at every step.
LENGTH_TARGET = 6
SIGNAL = [
    "rewards.specs=" + json.dumps([
        {"name": "math", "weight": 1.0},
        {"name": "format", "weight": 0.1, "kwargs": {"require_answer_tag": True}},
        {"name": "length", "weight": 1.0, "kwargs": {"target": LENGTH_TARGET}},
    ]),
]


def tiny_config(*extra: str) -> TrainConfig:
    return override(TrainConfig(), TINY + list(extra))


def signal_config(*extra: str) -> TrainConfig:
    return tiny_config(*SIGNAL, *extra)


def _assert_real_signal(grad_norms, skipped=None):
    """Every step had a non-zero gradient (and, when given, no step was skipped)."""
    assert len(grad_norms) > 0
    assert all(np.isfinite(g) and g > 0 for g in grad_norms), grad_norms
    if skipped is not None:
        assert all(s == 0 for s in skipped), skipped


def _assert_rows_have_signal(metrics_path):
    from grpo_jax.runlog import read_jsonl

    rows = read_jsonl(str(metrics_path))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    return rows


def _assert_moved(before, after, at_least=1e-4):
    """Some param moved by more than `at_least` (an Adam step at lr 3e-3 moves a weight by ~3e-3)."""
    assert len(before) == len(after)
    moved = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                for a, b in zip(after, before))
    assert moved > at_least, f"params moved by at most {moved}"


def _assert_same_update(actual, desired, initial, lr=3e-3):
    """Params after the same optimizer updates from the same `initial` params (two layouts, two programs, two
    batch shapes) agree, measured against the update instead of at a fixed atol. Adam divides by sqrt(v), so an
    element whose gradient is ~1e-8 (reduction-order noise of the same size) can land a visible fraction of a
    step away, and which element does depends on the machine. One Adam step at learning rate `lr` moves almost
    every element by ~0.7 lr to 1 lr, so `lr` (the runs' learning rate, 3e-3 in TINY) is the unit: the largest
    move of `desired` is at least lr / 2 (a real step was taken) and every leaf moved; each leaf is within
    lr / 300 everywhere or its difference is <= 1e-4 of its update in norm, no element is off by more than
    lr / 30, and at most 0.1% of elements are off by more than lr / 300. At lr 3e-3 (bounds 1e-5 and 1e-4), one
    of the 12,288 qkv weights lands ~1e-5 away on the 2x2x2 mesh (outside lr / 300, inside the norm bound), and
    one of a 256-element LoRA A matrix lands 7e-6 away on a 2x2 mesh (inside lr / 300, but 2e-4 of that small
    leaf's update in norm)."""
    assert len(actual) == len(desired) == len(initial)
    fine, coarse = lr / 300, lr / 30
    largest = 0.0
    for i, (a, b, x) in enumerate(zip(actual, desired, initial)):
        a, b, x = (np.asarray(v, np.float64) for v in (a, b, x))
        assert a.shape == b.shape == x.shape, (i, a.shape, b.shape, x.shape)
        diff, update = np.abs(a - b), np.linalg.norm(b - x)
        assert update > 0, f"leaf {i} did not move"
        largest = max(largest, float(np.abs(b - x).max()))
        assert diff.max() <= fine or np.linalg.norm(a - b) <= 1e-4 * update, (i, np.linalg.norm(a - b), update)
        assert diff.max() <= coarse, (i, diff.max(), coarse)
        assert (diff > fine).mean() <= 1e-3, (i, int((diff > fine).sum()), diff.size)
    assert largest >= lr / 2, f"the largest param move {largest} is under half a step at lr {lr}"


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def completion_logits(model_cfg, params, batch) -> np.ndarray:
    """The logits / temperature [N, T, V] predicting each completion token of an experience.Batch, from one full
    forward (as update.completion_logprobs): what tests/tolerance.logprob_tol bounds their logprobs with."""
    import models
    from models.rope import rope_positions, text_positions

    pos = rope_positions(model_cfg, text_positions(batch.attn_mask))
    logits, _ = models.forward(model_cfg, params, batch.tokens, pos, attn_mask=batch.attn_mask)
    t = np.asarray(batch.temperatures, np.float64)
    return np.asarray(logits, np.float64)[:, -t.shape[1] - 1 : -1] / np.where(t > 0, t, 1.0)[..., None]


def step_logprob_tol(tr, params, out) -> float:
    """logprob_tol for the completion tokens of a Trainer step `out` whose rollout decoded with `params`: how far
    two float32 programs (sampler and trainer, two layouts) may put their logprobs apart."""
    from tests.tolerance import logprob_tol

    batch = experience.batch_from_rollout(out.experience.rollout, np.zeros(out.experience.rollout.tokens.shape[:2]))
    logits = completion_logits(tr.actor.model_cfg, params, batch)
    return logprob_tol(logits[np.asarray(batch.loss_mask, bool)], tr.actor.model_cfg)


def grad_norm_rtol(model_cfg, n_rows: int, row_len: int, delta: float = 0.0) -> float:
    """How far, relative, two float32 programs (mesh layouts, process counts, a recomputed forward) may put one
    step's gradient norm: each token's coefficient -A rho moves by 2 delta relative (delta = logprob_tol between the
    programs' logprobs, on the trainer's and the sampler's side), and a gradient component by the roundings along
    its longest chain of sums, eps each (forward_tol's model, relative to the magnitude): the forward's n_layers
    width, the log-softmax's V, the backward's 2 n_layers width and the parameter gradient's sum over the
    n_rows row_len positions. The model is first order and relative to the norm itself: tokens whose gradients
    cancel (advantages of both signs) and a second step's start from params that already differ (within
    _assert_same_update's bounds) are outside it."""
    width = max(model_cfg.d_model, model_cfg.mlp_dim, model_cfg.n_heads * model_cfg.head_dim)
    k = 3 * model_cfg.n_layers * width + model_cfg.vocab_size + n_rows * row_len
    return 2 * delta + k * EPS32


def steps_with_tols(tr, n: int):
    """n steps of `tr`: their metrics, and for each the (loss atol, grad-norm rtol) `step_tols` gives it against
    another program computing the same step."""
    metrics, tols = [], []
    for _ in range(n):
        params = jax.tree.map(np.asarray, tr.policy_params())  # a copy: the step donates the state
        out = tr.step_once()
        metrics.append(out.metrics)
        tols.append(step_tols(tr, params, out))
    return metrics, tols


def step_tols(tr, params, out) -> tuple[float, float]:
    """(loss atol, grad-norm rtol) for one Trainer step `out` (rolled out with `params`) against the same step in
    another float32 program. Loss: the token weights c_t / den sum to 1 and each token's term is -A rho (clipped
    or not; these runs have beta = 0 and no entropy term), |A| <= (G - 1) / sqrt(G) (Samuelson: a ddof-1 z-score
    of G values), rho <= ratio_max; the programs' logprobs (trainer's and sampler's) move rho by <= 2 delta rho
    (delta = logprob_tol), and their float sums of num_tokens terms (TOKEN_OPS roundings each) differ by twice
    sum_tol: a_max ratio_max (2 delta + (num_tokens + TOKEN_OPS) eps). Grad norm: grad_norm_rtol."""
    from tests.test_losses import TOKEN_OPS

    cfg, m = tr.cfg, out.metrics
    assert cfg.loss.beta == 0.0 and m["control/entropy_coef"] == 0.0
    assert cfg.advantage.estimator == "grpo" and cfg.advantage.std_ddof == 1
    g = cfg.sampling.group_size
    delta = step_logprob_tol(tr, params, out)
    loss_tol = (g - 1) / np.sqrt(g) * m["ratio_max"] * (2 * delta + (m["num_tokens"] + TOKEN_OPS) * EPS32)
    tokens = out.experience.rollout.tokens
    n_rows = int(np.prod(tokens.shape[:2]))
    row_len = int(out.experience.rollout.prompt_tokens.shape[-1] + tokens.shape[-1])
    return float(loss_tol), grad_norm_rtol(tr.actor.model_cfg, n_rows, row_len, delta)


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
    params = jax.tree.map(np.asarray, tr.policy_params())  # a copy: the step donates the state
    out = tr.step_once()
    metrics, timings, exp = out.metrics, out.timings, out.experience
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
    # sampler and trainer logprobs: two float32 programs of one forward, a mean |gap| within their logprob_tol
    assert metrics["logp_gap"] <= step_logprob_tol(tr, params, out)


def _run(out, *extra):
    cmd = [sys.executable, "-m", "grpo_jax.train", "--out", str(out), "--quiet"]
    for item in TINY + list(extra):
        cmd += ["--set", item]
    return cmd


def test_same_seed_same_metrics_different_seed_different(tmp_path):
    streams, finals = [], []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        tr = train.Trainer(signal_config(f"seed={seed}"), str(tmp_path / name), quiet=True)
        before = _leaves(tr.state.params)
        tr.run()
        _assert_rows_have_signal(tmp_path / name / "metrics.jsonl")
        finals.append(_leaves(tr.state.params))
        _assert_moved(before, finals[-1])
        streams.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert streams[0] == streams[1]
    assert streams[0] != streams[2]
    for a, b in zip(finals[0], finals[1]):
        np.testing.assert_array_equal(a, b)
    assert any(a.shape != c.shape or (a != c).any() for a, c in zip(finals[0], finals[2]))


KILL_SEED = 19


def run_straight_and_killed(tmp_path, extra, *, steps: int, kill_after: int) -> None:
    """The run of `extra` (its last step `steps`) twice from the command line: <tmp>/straight uninterrupted, and
    <tmp>/killed killed with SIGKILL once a checkpoint at step >= kill_after is on disk (before the last step),
    then resumed with --resume."""
    subprocess.run(_run(tmp_path / "straight", *extra), check=True, cwd=ROOT, timeout=600)
    proc = subprocess.Popen(_run(tmp_path / "killed", *extra), cwd=ROOT)
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        done = [int(p) for p in os.listdir(ckpts) if p.isdigit()] if ckpts.exists() else []
        if done and max(done) >= kill_after:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the kill landed mid-run: the process died of the SIGKILL, after step kill_after and before the last step
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    done = [int(p) for p in os.listdir(ckpts) if p.isdigit()]
    assert kill_after <= max(done) < steps, (kill_after, done)
    subprocess.run(_run(tmp_path / "killed", *extra) + ["--resume"], check=True, cwd=ROOT, timeout=600)


def assert_same_final_state(tmp_path, extra, *, steps: int) -> None:
    """<tmp>/straight and <tmp>/killed end on a checkpoint at `steps` with bitwise equal params and optimizer
    state, and the params moved from their initialisation. Both runs have one config, so one probe Trainer of it
    gives the restore target and the initial params for both (a Trainer built compiles its programs)."""
    from grpo_jax.checkpoint import Checkpointer

    tr = train.Trainer(tiny_config(*extra), str(tmp_path / "probe"), quiet=True)
    initial = _leaves(tr.state.params)  # the params a resume that rebuilt them from the seed would have
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tr.state)
    finals = []
    for name in ("straight", "killed"):
        ck = Checkpointer(str(tmp_path / name / "checkpoints"))
        state, _, step = ck.restore(target)
        ck.close()
        assert step == steps
        _assert_moved(initial, _leaves(state.params))
        finals.append(_leaves(state.params) + _leaves(state.opt_state))
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)


def test_kill_minus_9_then_resume_is_bitwise_identical(tmp_path):
    steps = 6
    extra = (*SIGNAL, f"steps={steps}")
    # a random step, so the resume is not tested at one fixed point only; seeded so that a failure reproduces
    kill_after = int(np.random.default_rng(KILL_SEED).integers(1, steps - 1))
    run_straight_and_killed(tmp_path, extra, steps=steps, kill_after=kill_after)
    assert_same_final_state(tmp_path, extra, steps=steps)
    rows = _assert_rows_have_signal(tmp_path / "straight" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
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


def _direct_step(*extra, dtype="float32"):
    """(state, jitted step, batch of 4 prompts x G=4 from the state's own sampler) for a tiny model."""
    cfg = tiny_config(*extra)
    import models
    from grpo_jax import sampler

    model_cfg = models.tiny(vocab_size=58).replace(param_dtype=dtype, dtype=dtype)
    opt = update.make_optimizer(cfg)
    state = update.initial_state(cfg, model_cfg, models.init_params(model_cfg, jax.random.key(0)), opt,
                                 jax.random.key(0))
    step = jax.jit(update.make_train_step(model_cfg, cfg, opt))
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
    assert np.isnan(float(metrics["loss"]))  # logged as it is, so the non-finite-loss alarm can see it
    for a, b in zip(_leaves(new_state.params) + _leaves(new_state.opt_state), _leaves(state.params) + _leaves(state.opt_state)):
        np.testing.assert_array_equal(a, b)
    ok_state, ok_metrics = step(state, batch.replace(advantages=jnp.nan_to_num(adv)), jax.random.key(2))
    assert float(ok_metrics["skipped"]) == 0.0
    assert any((a != b).any() for a, b in zip(_leaves(ok_state.params), _leaves(state.params)))


def test_bfloat16_params_train_and_keep_their_dtype():
    """bf16 params (the GPU/TPU benchmark preset): the step runs over 2 microbatches with a reference
    model, moves the params, and every param and Adam moment stays bf16 (dividing the summed gradient by the
    f32 token count must not promote it to f32: that would break the minibatch scan's carry)."""
    state, step, batch = _direct_step("microbatches=2", "loss.beta=0.04", dtype="bfloat16")
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
    whole = update.chunked_logprobs(model_cfg, params, batch, t, 1)
    assert whole.shape == (n, t)
    # row slices of the batch: the same forward in programs of another batch size (tests/tolerance.logprob_tol)
    tol = logprob_tol(completion_logits(model_cfg, params, batch), model_cfg)
    for chunks in (2, 4):
        got = update.chunked_logprobs(model_cfg, params, batch, t, chunks)
        np.testing.assert_allclose(got, whole, rtol=0, atol=tol)


MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from grpo_jax import train
    from grpo_jax.config import TrainConfig, override
    items = json.loads(sys.argv[1])
    tr = train.Trainer(override(TrainConfig(), items), sys.argv[2], quiet=True)
    initial = [np.asarray(x).tolist() for x in jax.tree.leaves(tr.state.params)]
    from tests.test_train import steps_with_tols
    metrics, tols = steps_with_tols(tr, 2)
    qkv = tr.state.params["layers"][0]["qkv"]
    print(json.dumps({"losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
                      "loss_tols": [t[0] for t in tols], "grad_rtols": [t[1] for t in tols],
                      "skipped": [m["skipped"] for m in metrics], "spec": str(qkv.sharding.spec),
                      "devices": len(qkv.sharding.device_set), "initial": initial,
                      "params": [np.asarray(x).tolist() for x in jax.tree.leaves(tr.state.params)]}))
""")


def _assert_same_steps(run, one):
    """Each step's loss and gradient norm of `run` against the one-device run's, within the tolerances `one`
    derived for them (step_tols)."""
    for i, (loss_tol, grad_rtol) in enumerate(zip(one["loss_tols"], one["grad_rtols"])):
        np.testing.assert_allclose(run["losses"][i], one["losses"][i], rtol=0, atol=loss_tol, err_msg=f"step {i}")
        np.testing.assert_allclose(run["grad_norms"][i], one["grad_norms"][i], rtol=grad_rtol, atol=0,
                                   err_msg=f"step {i}")


def _mesh_run(tmp_path, name, devices, *extra):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    items = TINY + SIGNAL + ["model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=16", "model.d_model=64"]
    items += list(extra)
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT, json.dumps(items), str(tmp_path / name)], env=env,
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # two real updates: a gradient at both steps, and params that moved well beyond the 1e-5 compared below
    _assert_real_signal(result["grad_norms"], result["skipped"])
    _assert_moved(result["initial"], result["params"])
    return result


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The one-device run (MESH_SCRIPT, 2 steps) that the mesh and multi-process runs are compared with: the same
    subprocess for each of them, so it runs once per test process (a module's tests never change it)."""
    return _mesh_run(tmp_path_factory.mktemp("one_device"), "one", 1, "mesh.data=1")


def test_2x2x2_mesh_matches_single_device(tmp_path, one_device):
    one = one_device
    many = _mesh_run(tmp_path, "many", 8, "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2")
    assert many["devices"] == 8 and "tensor" in many["spec"] and "fsdp" in many["spec"], many["spec"]
    for a, b in zip(many["initial"], one["initial"]):  # the same start, so the comparison below is of the updates
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _assert_same_steps(many, one)
    _assert_same_update(many["params"], one["params"], one["initial"])


DIST_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    pid, port, items, out = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from grpo_jax import train
    from grpo_jax.config import TrainConfig, override
    assert jax.device_count() == 4 and jax.local_device_count() == 2
    tr = train.Trainer(override(TrainConfig(), items), out, quiet=True)
    from grpo_jax import sharding
    owned = sharding.process_rows(tr.mesh, 4)  # each process scores only the 2 groups on its devices
    assert sorted(np.concatenate(owned).tolist()) == [0, 1, 2, 3] and [len(o) for o in owned] == [2, 2]
    metrics = [tr.step_once().metrics for _ in range(2)]
    leaves = jax.tree.leaves(tr.state.params)
    assert all(x.is_fully_replicated for x in leaves)  # a data-only mesh: every process holds whole params
    params = [np.asarray(x.addressable_shards[0].data).tolist() for x in leaves]
    print(json.dumps({"losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
                      "skipped": [m["skipped"] for m in metrics], "params": params, "pid": pid}))
""")


def test_two_processes_with_jax_distributed_match_one_process(tmp_path, one_device):
    """Two CPU processes x 2 devices (a stand-in for a pod) run 2 steps and agree with one process."""
    import socket

    items = TINY + SIGNAL + ["model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=16", "model.d_model=64"]
    one = one_device
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    # output to files, not pipes: the params printed are bigger than a pipe's buffer, and a process blocked
    # writing to an unread pipe never reaches jax.distributed's shutdown barrier, where the other one waits
    logs = [(tmp_path / f"dist-{i}.out", tmp_path / f"dist-{i}.err") for i in range(2)]
    procs = []
    for i, (so, se) in enumerate(logs):
        with open(so, "w") as fo, open(se, "w") as fe:
            procs.append(subprocess.Popen([sys.executable, "-c", DIST_SCRIPT, str(i), str(port),
                                           json.dumps(items + ["mesh.data=4"]), str(tmp_path / "dist")],
                                          env=env, cwd=ROOT, stdout=fo, stderr=fe, text=True))
    for p in procs:
        p.wait(timeout=900)
    for p, (_, se) in zip(procs, logs):
        assert p.returncode == 0, se.read_text()[-3000:]
    results = [json.loads(so.read_text().strip().splitlines()[-1]) for so, _ in logs]
    assert sorted(r["pid"] for r in results) == [0, 1]
    for r in results:
        _assert_real_signal(r["grad_norms"], r["skipped"])
        _assert_same_steps(r, one)
        _assert_same_update(r["params"], one["params"], one["initial"])


def test_inner_epochs_and_minibatches_count_grpo_steps(tmp_path):
    """mu = 2 epochs x 2 minibatches = 4 optimizer updates per GRPO step; steps still count rollouts."""
    tr = train.Trainer(signal_config("steps=2", "mu=2", "minibatches=2", "microbatches=2"), str(tmp_path), quiet=True)
    before = _leaves(tr.state.params)
    tr.run()
    rows = _assert_rows_have_signal(tmp_path / "metrics.jsonl")
    _assert_moved(before, _leaves(tr.state.params))
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["num_seqs"] == 2 * 16  # both epochs saw all 16 rows (4 prompts x G=4)
    assert tr.step == 2


# ---- run folders: interrupted, resumed, rerun; startup checks and what they log ------------------------------

def _interrupt_before_first_checkpoint(out, cfg):
    """What a run killed (Ctrl-C, kill -9) after logging its first step, during its first save, leaves: rows
    in the step files, an unfinished orbax save, no checkpoint."""
    tr = train.Trainer(cfg, str(out), quiet=True)
    step = tr.step_once()
    tr.logger.log(1, step.metrics, timings=step.timings, histograms=step.histograms)
    tr.logger.close()
    (out / "checkpoints" / "1.orbax-checkpoint-tmp-1796000000").mkdir(parents=True)
    assert tr.ckpt.steps() == []


def _events(out):
    from grpo_jax.runlog import read_jsonl

    return read_jsonl(str(out / "events.jsonl"))


def test_interrupted_before_its_first_checkpoint_restarts_keeping_the_old_logs(tmp_path):
    """A folder left by a run that stopped before its first checkpoint: both --resume and a plain rerun start
    it again (rather than failing with FileExistsError: "pass resume_step=k", a parameter the command line
    does not have), move the first attempt's logs to interrupted/ and log a restart event."""
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


def test_a_setting_that_acts_on_nothing_is_logged_and_warned_at_the_start(tmp_path):
    # clip-higher with one on-policy update per rollout: the ratio never leaves 1, so eps_high clips nothing
    with pytest.warns(RuntimeWarning, match=r"loss.eps_high = 0.28 \(clip-higher\) clips nothing"):
        tr = train.Trainer(tiny_config("loss.eps_high=0.28"), str(tmp_path / "a"), quiet=True)
    tr.logger.close()
    (note,) = [e for e in _events(tmp_path / "a") if e["kind"] == "inert_setting"]
    assert "mu or minibatches above 1" in note["message"]
    tr = train.Trainer(tiny_config(), str(tmp_path / "b"), quiet=True)  # the defaults: nothing to say
    tr.logger.close()
    assert not [e for e in _events(tmp_path / "b") if e["kind"] == "inert_setting"]


def test_model_vocabulary_smaller_than_the_tokenizers_is_an_error_naming_both(tmp_path):
    """JAX clamps out-of-range ids in the embedding lookup, so without this check such a model would train
    silently on garbage."""
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
    """A rejected hot reload of the reward weights is recorded in events.jsonl, not only warned on stderr."""
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
    """Falling back from a truncated checkpoint warns once, and the abandoned reads of the bad step print no
    "RuntimeError: Event loop is closed" tracebacks (those show only in a process that goes on working, hence
    the subprocess)."""
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


# ---- one run per folder; checkpoints and logs of one run ------------------------------------------------------

# `python -m grpo_jax.train` that says on stderr how many jax compile events (tracing, lowering, compiling a
# program; jax.monitoring) it had when it exited
COUNTED_MAIN = ("import sys\n"
                "import jax.monitoring\n"
                "events = []\n"
                "jax.monitoring.register_event_duration_secs_listener(\n"
                "    lambda name, *_, **__: events.append(name) if name.startswith('/jax/core/compile/') else None)\n"
                "from grpo_jax import train\n"
                "try:\n"
                "    train.main(sys.argv[1:])\n"
                "finally:\n"
                "    print(f'exited after {len(events)} jax compile events', file=sys.stderr)\n")


def test_a_second_run_on_the_same_out_is_refused_and_the_first_finishes_as_if_alone(tmp_path):
    extra = (*SIGNAL, "steps=3")
    subprocess.run(_run(tmp_path / "alone", *extra), check=True, cwd=ROOT, timeout=600)
    shared = tmp_path / "shared"
    with open(tmp_path / "first.log", "w") as log:  # a file, not a pipe: nobody reads it while it runs
        first = subprocess.Popen(_run(shared, *extra), cwd=ROOT, stdout=log, stderr=log)
    deadline = time.time() + 600
    while not (shared / "run.lock").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    second = subprocess.run([sys.executable, "-c", COUNTED_MAIN, *_run(shared, *extra)[3:]], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert second.returncode == 1, second.stderr[-3000:]
    assert f"in use by another run: pid {first.pid} on host {socket.gethostname()}" in second.stderr
    assert "Traceback" not in second.stderr
    # refused at once, before building the run: nothing was traced or compiled (a count of work, where a bound on
    # the seconds it ran fails on a loaded machine)
    assert "exited after 0 jax compile events" in second.stderr, second.stderr[-3000:]
    rows = _assert_rows_have_signal(shared / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]  # one run's rows, not two interleaved
    assert (shared / "metrics.jsonl").read_bytes() == (tmp_path / "alone" / "metrics.jsonl").read_bytes()
    assert not (shared / "run.lock").exists()  # released when the first run ended


def test_a_stale_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                   "started": 0.0, "command": "killed"}))
    with pytest.warns(RuntimeWarning, match=rf"stale lock .*pid {dead.pid} .* is not running"):
        tr = train.Trainer(tiny_config("steps=1"), str(tmp_path), quiet=True)
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    tr.run()
    assert not (tmp_path / "run.lock").exists()


def test_resume_refuses_checkpoints_and_logs_of_different_runs_naming_both(tmp_path):
    runs = {}
    for name, seed, steps in (("a", 1, 2), ("b2", 2, 2), ("b3", 2, 3)):
        tr = train.Trainer(signal_config(f"seed={seed}", f"steps={steps}"), str(tmp_path / name), quiet=True)
        before = _leaves(tr.state.params)
        tr.run()
        _assert_moved(before, _leaves(tr.state.params))
        runs[name] = tmp_path / name
    _assert_rows_have_signal(runs["a"] / "metrics.jsonl")
    out = runs["a"]
    config = (out / "config.json").read_text()
    changed = json.loads(config)
    changed["sampling"]["group_size"] = 2
    (out / "config.json").write_text(json.dumps(changed))
    with pytest.raises(CheckpointError, match=r"cannot resume .*different runs: checkpoint step 2 .* and .*config.json "
                                              r"differ in keys that must match: sampling.group_size: 4 vs 2"):
        train.Trainer(signal_config("seed=1", "steps=3"), str(out), resume=True, quiet=True)
    (out / "config.json").write_text(config)
    kept = (out / "metrics.jsonl").read_bytes()
    for other, why in (("b3", r"checkpoint step 3 \(.*\) is beyond the last step logged in .*metrics.jsonl \(2\)"),
                       ("b2", r"checkpoint step 2 \(.*\) recorded .* = .* at step 1, .*metrics.jsonl has .*; "
                              r"config differences \(checkpoint vs .*config.json\): seed: 2 vs 1")):
        shutil.rmtree(out / "checkpoints")
        shutil.copytree(runs[other] / "checkpoints", out / "checkpoints")
        refused = rf"cannot resume {re.escape(str(out))}: its checkpoints and its logs are of different runs: {why}"
        with pytest.raises(CheckpointError, match=refused):
            train.Trainer(signal_config("seed=1", "steps=4"), str(out), resume=True, quiet=True)
        assert (out / "metrics.jsonl").read_bytes() == kept  # nothing in the folder changed
        assert sorted(os.listdir(out / "checkpoints")) == sorted(os.listdir(runs[other] / "checkpoints"))
        assert not (out / "run.lock").exists()  # the refused trainer let go of the folder
