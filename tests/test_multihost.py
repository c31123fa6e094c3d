"""Multi-host end to end: two `jax.distributed` processes on localhost run the default
experiment's smoke with real signal, checkpoint, are killed with SIGKILL mid-run, resume, and end with the
params of one process that ran straight through; one metrics stream and one checkpoint set."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np

from tests.test_train import (ROOT, SIGNAL, _assert_moved, _assert_real_signal, _assert_same_update, _leaves,
                              grad_norm_rtol, step_logprob_tol)

STEPS = 4
KILL_SEED = 23
# real signal (the length reward of the trainer tests) and a checkpoint every step, so a kill lands between two
# and the trainer tests' lr (3e-3, not the experiment's 1e-4), so that the RL updates, not the warm start,
# are what the final params are compared on
EXTRA = ["--set", SIGNAL[0], "--set", f"steps={STEPS}", "--set", "checkpoint.every=1", "--set", "optim.lr=0.003"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(out, *extra):
    return [sys.executable, "experiments/arithmetic.py", "--smoke", "--quiet", "--out", str(out), *EXTRA, *extra]


def _launch_pair(out, logs, *extra):
    """Two processes x 2 CPU devices, a 4-way data mesh over both (a stand-in for two hosts)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    port = _port()
    procs = []
    for pid in range(2):
        dist = ["--set", f"mesh.coordinator=127.0.0.1:{port}", "--set", "mesh.num_processes=2",
                "--set", f"mesh.process_id={pid}", "--set", "mesh.data=4"]
        with open(logs / f"p{pid}-{len(list(logs.iterdir()))}.log", "w") as f:  # files, not pipes (see test_train)
            procs.append(subprocess.Popen(_cmd(out, *dist, *extra), env=env, cwd=ROOT, stdout=f, stderr=f))
    return procs


def _checkpoints(out):
    ckpts = out / "checkpoints"
    return sorted(int(p) for p in os.listdir(ckpts) if p.isdigit()) if ckpts.exists() else []


def _probe(probe_dir):
    """A Trainer of the experiment's config (the same for every checkpoint read here), built once: the target
    every checkpoint is restored into, the params a rebuilt-from-seed resume would start from, and the first step
    the gradient-norm tolerance is taken on (each Trainer built compiles the run's programs again)."""
    from grpo_jax import presets, train
    from grpo_jax.cli import parse_args

    _, cfg = parse_args(["--smoke", *EXTRA], get_config=presets.arithmetic)
    return train.Trainer(cfg, str(probe_dir), quiet=True)


def _state(probe, run_dir, step=None):
    """(step, params + optimizer state leaves) of the checkpoint of `run_dir` at `step` (default: the newest),
    restored into the layout of the `probe` Trainer's state."""
    from grpo_jax.checkpoint import Checkpointer

    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), probe.state)
    ck = Checkpointer(str(run_dir / "checkpoints"))
    state, _, step = ck.restore(target, step=step)
    ck.close()
    return step, _leaves(state.params) + _leaves(state.opt_state)


def _grad_norm_rtol(probe) -> float:
    """tests/test_train.grad_norm_rtol for this experiment's steps: its model, its batch shape and the logprob_tol
    of a first step's rollout, taken on the probe Trainer (one extra step; its state is donated, so this comes
    after every restore into the probe's layout)."""
    params = jax.tree.map(np.asarray, probe.policy_params())  # a copy: the step donates the state
    out = probe.step_once()
    ro = out.experience.rollout
    return grad_norm_rtol(probe.actor.model_cfg, int(np.prod(ro.tokens.shape[:2])),
                          int(ro.prompt_tokens.shape[-1] + ro.tokens.shape[-1]), step_logprob_tol(probe, params, out))


def test_two_processes_killed_mid_run_resume_and_match_one_process(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    subprocess.run(_cmd(tmp_path / "one", "--set", "mesh.data=1"), check=True, cwd=ROOT, env=env, timeout=900)

    out = tmp_path / "two"
    kill_after = int(np.random.default_rng(KILL_SEED).integers(1, STEPS - 1))  # seeded, so a failure reproduces
    procs = _launch_pair(out, logs)
    deadline = time.time() + 900
    while time.time() < deadline and all(p.poll() is None for p in procs):
        if _checkpoints(out) and max(_checkpoints(out)) >= kill_after:
            break
        time.sleep(0.05)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    # the kill landed mid-run: both died of SIGKILL, after checkpoint kill_after and before the last step
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2, [p.returncode for p in procs]
    assert kill_after <= max(_checkpoints(out)) < STEPS, (kill_after, _checkpoints(out))

    procs = _launch_pair(out, logs, "--resume")
    for p in procs:
        p.wait(timeout=900)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(f.read_text()[-2000:] for f in logs.iterdir())

    # one metrics stream (process 0's), one checkpoint set, no per-process log folders
    from grpo_jax.runlog import read_jsonl

    rows = [r for r in read_jsonl(str(out / "metrics.jsonl")) if "grad_norm" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    assert not [p for p in os.listdir(out) if p.startswith("process-")], os.listdir(out)
    assert (out / "report.md").exists()

    probe = _probe(tmp_path / "probe")
    seed_params = _leaves(probe.state.params)  # the params a resume that rebuilt them from the seed would have
    step_one, one = _state(probe, tmp_path / "one")
    step_two, two = _state(probe, out)
    assert step_one == step_two == STEPS
    n_params = len(seed_params)
    _assert_moved(seed_params, two[:n_params])  # the resume did not rebuild params from the seed
    # compared relative to the last two RL updates of the straight run (checkpoint STEPS - 2 -> STEPS)
    _, before = _state(probe, tmp_path / "one", STEPS - 2)
    initial = before[:n_params]
    _assert_moved(initial, one[:n_params])
    one_rows = {r["step"]: r for r in read_jsonl(str(tmp_path / "one" / "metrics.jsonl")) if "grad_norm" in r}
    # the same steps in another float32 program (2 processes x 2 devices): grad_norm_rtol, relative
    np.testing.assert_allclose([r["grad_norm"] for r in rows], [one_rows[r["step"]]["grad_norm"] for r in rows],
                               rtol=_grad_norm_rtol(probe), atol=0)
    _assert_same_update(two[:n_params], one[:n_params], initial)
