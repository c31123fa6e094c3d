"""Checkpointer: bitwise round trip, retention, corruption fallback, killed saves, sharded restore."""

import gc
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.checkpoint import Checkpointer, CheckpointError, check_compatible


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _host(x):
    return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)


def _assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert _host(x).tobytes() == _host(y).tobytes()


def _small_state(seed: int):
    k_w, k_b = jax.random.split(jax.random.key(seed))
    return {"w": jax.random.normal(k_w, (64, 64)), "b": jax.random.normal(k_b, (64,)).astype(jnp.bfloat16),
            "step": jnp.int32(seed)}


def _biggest_data_file(ckpt_dir: str, step: int) -> str:
    # OCDBT keeps array chunks in content-named files under state/ocdbt.process_*/d/; with one 16 KiB
    # random leaf, the biggest file holds it.
    files = glob.glob(os.path.join(ckpt_dir, str(step), "state", "ocdbt.process_*", "d", "*"))
    return max(files, key=os.path.getsize)


def test_round_trip_is_bitwise(tmp_path):
    params = {"embed": jax.random.normal(jax.random.key(0), (16, 8)).astype(jnp.bfloat16),
              "layers": [{"w": jax.random.normal(jax.random.key(i), (8, 8))} for i in (1, 2)]}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = {"step": jnp.int32(7), "params": params, "opt_state": optimizer.init(params), "ref_params": {},
             "key": jax.random.key(3), "counts": jnp.arange(5, dtype=jnp.int32)}
    meta = {"config": {"model": {"d_model": 8}, "lr": 1e-3}, "cursor": {"epoch": 1, "order": [3, 1, 2]}}
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(7, state, meta=meta)
    with Checkpointer(str(tmp_path)) as ckpt:
        restored, restored_meta, step = ckpt.restore(_abstract(state))
        _assert_bitwise_equal(restored, state)
        assert (restored_meta, step) == (meta, 7)
        assert ckpt.read_meta() == meta
        # Concrete arrays work as the target too.
        _assert_bitwise_equal(ckpt.restore(state, step=7)[0], state)


def test_retention_keeps_last_and_best(tmp_path):
    # keep_last=2, keep_best=1 by acc (max); acc per step 1..5 = 0.1, 0.9, 0.3, 0.2, 0.4. Retention runs
    # after every save, over the steps still on disk:
    #   after 2: last {1,2}                      -> [1, 2]
    #   after 3: last {2,3}, best of 1..3 is 2   -> [2, 3]      (1 goes)
    #   after 4: last {3,4}, best of 2..4 is 2   -> [2, 3, 4]
    #   after 5: last {4,5}, best of 2..5 is 2   -> [2, 4, 5]   (3 goes)
    with Checkpointer(str(tmp_path), keep_last=2, keep_best=1, best_metric="acc") as ckpt:
        for step, acc in zip(range(1, 6), [0.1, 0.9, 0.3, 0.2, 0.4]):
            ckpt.save(step, _small_state(step), meta={"step": step}, metrics={"acc": acc})
        assert ckpt.steps() == [2, 4, 5]
    # Ranks are read back from disk: after 6 (acc 0.0), last {5,6} + best {2} -> [2,5,6].
    with Checkpointer(str(tmp_path), keep_last=2, keep_best=1, best_metric="acc") as ckpt:
        ckpt.save(6, _small_state(6), meta={"step": 6}, metrics={"acc": 0.0})
        assert ckpt.steps() == [2, 5, 6]


def test_retention_never_ranks_nan_or_missing(tmp_path):
    # keep_last=1, keep_best=1: step 1 acc NaN, step 2 acc 0.5, step 3 no acc -> last {3} + best {2}.
    with Checkpointer(str(tmp_path), keep_last=1, keep_best=1, best_metric="acc") as ckpt:
        ckpt.save(1, _small_state(1), meta={}, metrics={"acc": math.nan})
        ckpt.save(2, _small_state(2), meta={}, metrics={"acc": 0.5})
        ckpt.save(3, _small_state(3), meta={}, metrics={"loss": 1.0})
        assert ckpt.steps() == [2, 3]


def _three_steps(ckpt_dir):
    states = {s: _small_state(s) for s in (1, 2, 3)}
    with Checkpointer(ckpt_dir) as ckpt:
        for s, state in states.items():
            ckpt.save(s, state, meta={"step": s})
    return states


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _zero_middle(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(64))


def _swap_state_with_step_2(ckpt_dir):
    # A "bad copy": step 3's arrays replaced by step 2's. orbax reads them without complaint; only the
    # recorded checksums can tell.
    shutil.rmtree(os.path.join(ckpt_dir, "3", "state"))
    shutil.copytree(os.path.join(ckpt_dir, "2", "state"), os.path.join(ckpt_dir, "3", "state"))


# A failed orbax restore leaves un-awaited read coroutines behind (orbax internals, harmless); the tests
# that cause them collect them before they end so the warning is not pinned on a later test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("corrupt, reason", [
    pytest.param(lambda d: _truncate(_biggest_data_file(d, 3)), "restore failed", id="truncated"),
    pytest.param(lambda d: os.remove(_biggest_data_file(d, 3)), "restore failed", id="missing"),
    pytest.param(lambda d: _zero_middle(_biggest_data_file(d, 3)), "", id="overwritten"),
    pytest.param(_swap_state_with_step_2, "checksum mismatch", id="bad-copy"),
])
def test_corrupt_newest_falls_back_to_previous(tmp_path, corrupt, reason):
    ckpt_dir = str(tmp_path)
    states = _three_steps(ckpt_dir)
    corrupt(ckpt_dir)
    with Checkpointer(ckpt_dir) as ckpt:
        with pytest.warns(RuntimeWarning, match=f"step 3 .*{reason}"):
            state, meta, step = ckpt.restore(_abstract(states[1]))
        assert (step, meta) == (2, {"step": 2})
        _assert_bitwise_equal(state, states[2])
        with pytest.raises(CheckpointError, match="step 3"):
            ckpt.restore(_abstract(states[1]), step=3)
        _assert_bitwise_equal(ckpt.restore(_abstract(states[1]), step=1)[0], states[1])
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_all_corrupt_raises(tmp_path):
    ckpt_dir = str(tmp_path)
    states = _three_steps(ckpt_dir)
    for s in states:
        _truncate(_biggest_data_file(ckpt_dir, s))
    with Checkpointer(ckpt_dir) as ckpt, pytest.warns(RuntimeWarning):
        with pytest.raises(CheckpointError, match="no usable checkpoint") as err:
            ckpt.restore(_abstract(states[1]))
    assert all(f"step {s} in {ckpt_dir}" in str(err.value) for s in states)
    gc.collect()


def test_corrupt_meta_falls_back_in_read_meta(tmp_path):
    ckpt_dir = str(tmp_path)
    _three_steps(ckpt_dir)
    for meta_file in glob.glob(os.path.join(ckpt_dir, "3", "meta", "*")):
        if not meta_file.endswith(".txt"):
            with open(meta_file, "w") as f:
                f.write(json.dumps({"step": 33}))  # valid JSON, wrong content
    with Checkpointer(ckpt_dir) as ckpt:
        with pytest.warns(RuntimeWarning, match="step 3 .*meta checksum"):
            assert ckpt.read_meta() == {"step": 2}
        with pytest.raises(CheckpointError, match="step 3"):
            ckpt.read_meta(3)


def test_wrong_target_is_a_caller_error_not_a_fallback(tmp_path):
    ckpt_dir = str(tmp_path)
    states = _three_steps(ckpt_dir)
    target = _abstract(states[1])
    target["w"] = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=target["w"].sharding)
    del target["b"]
    with Checkpointer(ckpt_dir) as ckpt:
        with pytest.raises(CheckpointError, match=r"step 3 .*\n.*\['b'\].*\n.*\['w'\]: checkpoint has float32\[64, 64\]"):
            ckpt.restore(target)


def test_save_only_moves_forward(tmp_path):
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(5, _small_state(5), meta={})
        with pytest.raises(CheckpointError, match="step 5 .*latest checkpoint 5"):
            ckpt.save(5, _small_state(5), meta={})
        with pytest.raises(CheckpointError, match="step 4 .*latest checkpoint 5"):
            ckpt.save(4, _small_state(4), meta={})
        with pytest.raises(CheckpointError, match="step 6 .*not JSON"):
            ckpt.save(6, _small_state(6), meta={"x": object()})
        ckpt.delete(5)  # a rollback past step 5
        ckpt.save(4, _small_state(4), meta={})
        assert ckpt.steps() == [4]
        with pytest.raises(CheckpointError, match="no checkpoint for step 9"):
            ckpt.restore(_abstract(_small_state(0)), step=9)


def test_uncommitted_tmp_directory_is_ignored(tmp_path):
    ckpt_dir = str(tmp_path)
    states = _three_steps(ckpt_dir)
    # What a save killed before its final rename leaves: a full step under the tmp name, and one with
    # an item missing.
    shutil.copytree(os.path.join(ckpt_dir, "3"), os.path.join(ckpt_dir, "4.orbax-checkpoint-tmp-1700000000"))
    shutil.copytree(os.path.join(ckpt_dir, "3"), os.path.join(ckpt_dir, "5.orbax-checkpoint-tmp-1700000001"))
    shutil.rmtree(os.path.join(ckpt_dir, "5.orbax-checkpoint-tmp-1700000001", "state"))
    with Checkpointer(ckpt_dir, keep_last=5) as ckpt:
        assert ckpt.steps() == [1, 2, 3] and ckpt.latest_step() == 3
        assert ckpt.restore(_abstract(states[1]))[2] == 3
        ckpt.save(4, states[1], meta={})  # the writer's first save clears the leftovers
        assert ckpt.steps() == [1, 2, 3, 4]
    assert not glob.glob(os.path.join(ckpt_dir, "*orbax-checkpoint-tmp*"))


_KILLED_SAVE = """
import sys, time
import jax, numpy as np
import orbax.checkpoint as ocp
from grpo_jax.checkpoint import Checkpointer

ckpt = Checkpointer(sys.argv[1])
ckpt.save(1, {"w": jax.numpy.ones((256, 256))}, meta={"step": 1})

async def hang(self, *args, **kwargs):  # stop right before a tmp directory would be committed
    print("WRITING", flush=True)
    time.sleep(60)

ocp.path.atomicity.AtomicRenameTemporaryPath.finalize = hang
ckpt.save(2, {"w": jax.numpy.full((256, 256), 2.0)}, meta={"step": 2})
"""


def test_save_killed_mid_write_leaves_earlier_checkpoints_intact(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, ckpt_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "WRITING"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert glob.glob(os.path.join(ckpt_dir, "2.orbax-checkpoint-tmp*"))  # the save did get under way
    target = _abstract({"w": jnp.zeros((256, 256))})
    with Checkpointer(ckpt_dir) as ckpt:
        assert ckpt.steps() == [1]
        state, meta, step = ckpt.restore(target)
        assert (step, meta) == (1, {"step": 1}) and bool((state["w"] == 1.0).all())
        ckpt.save(2, {"w": jnp.full((256, 256), 3.0)}, meta={"step": 2})
        assert ckpt.steps() == [1, 2] and ckpt.restore(target)[1] == {"step": 2}


_SHARDED = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from grpo_jax.checkpoint import Checkpointer

devices = np.array(jax.devices())
assert devices.size == 4, devices
row_mesh = Mesh(devices, ("data",))
x = jax.device_put(jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6), NamedSharding(row_mesh, P("data")))
state = {"x": x, "key": jax.device_put(jax.random.key(5), NamedSharding(row_mesh, P()))}
with Checkpointer(sys.argv[1]) as ckpt:
    ckpt.save(1, state, meta={})
grid_mesh = Mesh(devices.reshape(2, 2), ("fsdp", "tensor"))
for spec in (P("fsdp", "tensor"), P(None, "tensor"), P()):
    sharding = NamedSharding(grid_mesh, spec)
    target = {"x": jax.ShapeDtypeStruct((8, 6), jnp.float32, sharding=sharding),
              "key": jax.ShapeDtypeStruct((), state["key"].dtype, sharding=NamedSharding(grid_mesh, P()))}
    with Checkpointer(sys.argv[1]) as ckpt:
        restored, _, _ = ckpt.restore(target)
    assert restored["x"].sharding == sharding, (restored["x"].sharding, sharding)
    np.testing.assert_array_equal(np.asarray(restored["x"]), np.asarray(x))
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
print("OK")
"""


def test_sharded_restore_takes_target_sharding(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_SHARDED), str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_check_compatible_names_every_differing_key():
    saved = {"model": {"d_model": 64, "n_layers": 2}, "sampling": {"group_size": 8, "temperature": 1.0},
             "advantage": {"estimator": "grpo", "weights": [1.0, 0.5]}, "steps": 100}
    same = json.loads(json.dumps(saved))
    same["advantage"]["weights"] = (1.0, 0.5)  # a tuple in the live config equals the saved JSON list
    same["steps"] = 200  # not a guarded key
    keys = ["model.d_model", "model.n_layers", "sampling.group_size", "advantage.estimator", "advantage.weights"]
    check_compatible(saved, same, keys)

    new = json.loads(json.dumps(same))
    new["model"]["d_model"] = 128
    new["sampling"]["group_size"] = 4
    new["advantage"]["estimator"] = "drgrpo"
    del new["model"]["n_layers"]
    new["sampling"]["temperature"] = 0.7  # not guarded
    with pytest.raises(CheckpointError) as err:
        check_compatible(saved, new, keys)
    message = str(err.value)
    for key in ("model.d_model: checkpoint 64, now 128", "sampling.group_size: checkpoint 8, now 4",
                'advantage.estimator: checkpoint "grpo", now "drgrpo"', "model.n_layers: checkpoint 2, now <missing>"):
        assert key in message
    assert "temperature" not in message and "weights" not in message and "steps" not in message


def test_relative_directory_works(tmp_path, monkeypatch):
    """Run directories are usually given relative (runs/arithmetic); orbax itself insists on absolute paths."""
    import jax.numpy as jnp

    monkeypatch.chdir(tmp_path)
    ck = Checkpointer("runs/x/checkpoints")
    ck.save(1, {"a": jnp.arange(3.0)}, meta={"k": 1})
    assert ck.steps() == [1] and (tmp_path / "runs" / "x" / "checkpoints" / "1").is_dir()
    ck.close()


def test_a_state_field_newer_than_the_checkpoint_restores_when_it_holds_no_leaves(tmp_path):
    # A checkpoint written before TrainState gained `base` (LoRA): its tree is (step, params, opt_state,
    # ref_params = {}), the new target's has base = {} too. The leaves agree, so the restore fills the
    # old fields and keeps the empty new one; a target with a leaf the checkpoint lacks stays an error.
    import flax.struct

    @flax.struct.dataclass
    class Old:
        step: jax.Array
        params: dict
        ref_params: dict

    @flax.struct.dataclass
    class New:
        step: jax.Array
        params: dict
        ref_params: dict
        base: dict

    old = Old(step=jnp.int32(3), params=_small_state(0), ref_params={})
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(3, old, meta={"config": {}})
    target = New(step=jnp.int32(0), params=_abstract(old.params), ref_params={}, base={})
    with Checkpointer(str(tmp_path)) as ckpt:
        state, _, step = ckpt.restore(target)
    assert step == 3 and isinstance(state, New) and state.base == {} and state.ref_params == {}
    _assert_bitwise_equal(state.params, old.params)
    assert int(state.step) == 3
    with Checkpointer(str(tmp_path)) as ckpt, pytest.raises(CheckpointError, match=r"base.*not in the checkpoint"):
        ckpt.restore(target.replace(base={"w": jax.ShapeDtypeStruct((2,), jnp.float32)}))


def test_resume_check_takes_defaults_for_keys_the_saved_config_lacks():
    saved = {"model": {"d_model": 64}}  # written before `lora` existed
    now = {"model": {"d_model": 64}, "lora": {"rank": 0}}
    check_compatible(saved, now, ["model.d_model", "lora.rank"], defaults={"lora": {"rank": 0}})
    with pytest.raises(CheckpointError, match=r"lora\.rank: checkpoint 0, now 4"):
        check_compatible(saved, {**now, "lora": {"rank": 4}}, ["lora.rank"], defaults={"lora": {"rank": 0}})
    with pytest.raises(CheckpointError, match=r"lora\.rank: checkpoint <missing>"):
        check_compatible(saved, now, ["lora.rank"])  # without defaults a missing key is still a difference


def test_asyncio_logs_of_the_abandoned_reads_of_a_failed_restore_are_dropped_and_no_others():
    """A read of a failed restore that fails after nobody waits for it is logged by asyncio as "Task exception
    was never retrieved" (its traceback runs through orbax's `async_deserialize`): that record is dropped, one
    with any other traceback or message passes (a failure we did not cause stays visible)."""
    import logging

    from grpo_jax.checkpoint import _AbandonedReadLogs

    def async_deserialize():  # the frame name orbax's read has
        raise ValueError("OUT_OF_RANGE: byte range not valid")

    def elsewhere():
        raise ValueError("something else")

    def record(fn, msg):
        try:
            fn()
        except ValueError:
            import sys as _sys
            return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, _sys.exc_info())

    keep = _AbandonedReadLogs().filter
    assert not keep(record(async_deserialize, "Task exception was never retrieved"))
    assert keep(record(elsewhere, "Task exception was never retrieved"))
    assert keep(record(async_deserialize, "Unclosed event loop"))
    assert keep(logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Task was destroyed", None, None))
