"""Data-parallel rollouts inside the Trainer: prompts split over the mesh's data axes, each device
decoding its own groups, the same tokens as one device for the same key; rows that do not divide are padded
and dropped; each process scores only its own groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    import jax, numpy as np
    from grpo_jax import experience, sharding, train
    from grpo_jax.config import TrainConfig, override
    from tests.test_train import SIGNAL, TINY, completion_logits
    from tests.tolerance import logprob_tol

    items = json.loads(sys.argv[1])
    tr = train.Trainer(override(TrainConfig(), TINY + SIGNAL + items), sys.argv[2], quiet=True)
    out = {"devices": jax.device_count()}
    step = tr.step_once()  # the training step's own rollout
    metrics, exp = step.metrics, step.experience
    sh = exp.rollout.tokens.sharding
    out["step"] = {"replicated": sh.is_fully_replicated, "spec0": str(sh.spec[0]) if sh.spec else None,
                   "n_devices": len(sh.device_set), "grad_norm": metrics["grad_norm"],
                   "shard_rows": sorted({s.data.shape[0] for s in exp.rollout.tokens.addressable_shards}),
                   "params_devices": len(jax.tree.leaves(tr.state.params)[0].sharding.device_set)}
    one = dataclasses.replace(tr.actor, mesh=None)
    one_params = jax.device_put(tr.state.params, jax.devices()[0])  # single-device path of the sampler
    key = jax.random.key(7)
    for n in (4, 3):  # 3 prompts on 4 data shards: padded, padding dropped
        rows = tr.stream.rows[:n]
        ro = experience.rollout(tr.actor, tr.state.params, rows, key, group_size=4, temperature=1.0)
        ref = experience.rollout(one, one_params, rows, key, group_size=4, temperature=1.0)
        r_mesh = experience.score(tr.actor, rows, ro).rewards
        r_one = experience.score(one, rows, ref).rewards
        # how far two float32 programs' logprobs of these tokens may be apart: logprob_tol of their logits
        batch = experience.batch_from_rollout(ref, np.zeros(ref.tokens.shape[:2]))
        logits = completion_logits(tr.actor.model_cfg, one_params, batch)[np.asarray(batch.loss_mask, bool)]
        out[f"b{n}"] = {"shape": list(ro.tokens.shape), "tokens": np.asarray(ro.tokens).tolist(),
                        "logp_tol": logprob_tol(logits, tr.actor.model_cfg),
                        "ref_tokens": np.asarray(ref.tokens).tolist(),
                        "logprobs_diff": float(np.max(np.abs(np.asarray(ro.logprobs) - np.asarray(ref.logprobs)))),
                        "rewards": r_mesh.tolist(), "ref_rewards": r_one.tolist()}
    print(json.dumps(out))
""")


def _run(tmp_path, name, devices, *items):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(list(items)), str(tmp_path / name)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("layout", [
    ("mesh.data=4",),  # params replicated: one shard_map decode loop per device
    ("mesh.data=2", "mesh.fsdp=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=4",
     "model.head_dim=16"),  # params sharded over fsdp: one SPMD program, rows still split 4 ways
    ("mesh.data=1", "mesh.rollout_data=4"),  # the update on 1 device, the rollout on a 4-device mesh of its own
], ids=["data4", "data2-fsdp2", "update1-rollout4"])
def test_trainer_rollout_is_split_over_the_data_axes_and_matches_one_device(tmp_path, layout):
    r = _run(tmp_path, "run", 4, *layout)
    assert r["devices"] == 4
    step = r["step"]
    # the training step's rollout lives on 4 devices, one group per device (4 prompts / 4 data shards)
    assert not step["replicated"] and step["n_devices"] == 4, step
    assert "data" in step["spec0"], step
    assert step["shard_rows"] == [1], step
    assert step["grad_norm"] > 0
    assert step["params_devices"] == (1 if "mesh.rollout_data=4" in layout else 4)
    for n in (4, 3):
        b = r[f"b{n}"]
        assert b["shape"][0] == n  # the padding row of b=3 is dropped
        np.testing.assert_array_equal(b["tokens"], b["ref_tokens"])
        # the mesh's programs and one device's compute the same logits in another order: logprob_tol
        assert b["logprobs_diff"] <= b["logp_tol"], (b["logprobs_diff"], b["logp_tol"])
        np.testing.assert_array_equal(b["rewards"], b["ref_rewards"])
        # the comparison is of real samples: the groups are not all one repeated completion
        assert len({json.dumps(row) for group in b["tokens"] for row in group}) > n


def test_process_rows_partition_the_groups_like_the_batch_sharding():
    """The rows each process scores (`sharding.process_rows`) are where `shard_rows` puts them. On one
    process that is every row; the two-process training test covers two (it matches one process only if
    the gathered rewards are in place)."""
    import jax

    from grpo_jax import sharding
    from grpo_jax.config import MeshConfig

    mesh = sharding.make_mesh(MeshConfig(data=1), devices=jax.devices()[:1])
    assert [r.tolist() for r in sharding.process_rows(mesh, 5)] == [[0, 1, 2, 3, 4]]
    assert [r.tolist() for r in sharding.process_rows(None, 3)] == [[0, 1, 2]]
    local = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(sharding.gather_rows(local, [np.arange(3)], 3), local)


def test_a_mesh_may_use_fewer_devices_only_beside_a_rollout_mesh():
    import jax

    from grpo_jax import sharding
    from grpo_jax.config import MeshConfig

    two = jax.devices()[:1] * 2  # stands for two devices: only the count is read before the check
    with pytest.raises(ValueError, match="does not match 2 devices"):
        sharding.make_mesh(MeshConfig(data=1), devices=two)
    assert sharding.make_mesh(MeshConfig(data=1, rollout_data=1), devices=two).devices.size == 1
    assert sharding.make_rollout_mesh(MeshConfig()) is None
    with pytest.raises(ValueError, match="rollout_data"):
        sharding.make_rollout_mesh(MeshConfig(rollout_data=3), devices=two)
    with pytest.raises(ValueError, match="rollout_data"):
        MeshConfig(rollout_data=-2)
