"""LoRA (models.lora, lora.* config): a fresh adapter (B = 0) leaves the logits unchanged for every target;
merged weights give the attached forward's logits; only the adapters train (the base is bitwise frozen and
outside the optimizer state); dropout acts only with a key; the trainer rolls out the merged policy,
exports it, resumes bitwise, and matches one device on a 2 x 2 (fsdp x tensor) mesh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import experience, export, sampler, sharding, train, update
from grpo_jax.config import LORA_TARGETS, LoraConfig, TrainConfig, override
from grpo_jax.runlog import read_jsonl
from models import lora
from models.rope import text_positions
from tests.test_train import (ROOT, SIGNAL, TINY, _assert_moved, _assert_real_signal, _assert_same_steps,
                              _assert_same_update, _leaves, completion_logits, signal_config, tiny_config)
from tests.tolerance import forward_tol, logprob_tol, rounding_tol

# one model with every optional piece the adapters sit beside: GQA (4 query / 2 kv heads, so k and v are
# narrower than q), a q/k/v bias and Qwen3's q/k norms
MODEL = models.tiny(vocab_size=58).replace(qkv_bias=True, qk_norm=True)
TARGET_SETS = [(t,) for t in LORA_TARGETS] + [LORA_TARGETS]
SCALE = 32.0 / 4  # the default alpha over rank 4


def _tokens(n=3, length=11):
    toks = jax.random.randint(jax.random.key(7), (n, length), 0, MODEL.vocab_size)
    mask = jnp.ones((n, length), bool).at[0, :3].set(False)  # one left-padded row
    return toks, mask


def _logits(params, *, dropout_key=None):
    toks, mask = _tokens()
    return models.forward(MODEL, params, toks, text_positions(mask), attn_mask=mask, dropout_key=dropout_key)[0]


def _trained_like(adapters, seed=3):
    """Adapters with non-zero B (what training makes of them), A and B perturbed by N(0, 0.05^2)."""
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def base():
    return models.init_params(MODEL, jax.random.key(0))


def test_config_validates_against_the_models_own_target_list():
    assert LORA_TARGETS is lora.TARGETS  # one list, read from models.config, not a copy


@pytest.mark.parametrize("targets", TARGET_SETS, ids="+".join)
def test_zero_initialised_b_gives_the_base_logits_exactly(base, targets):
    """B = 0, so every adapter adds scale * (x A) 0 = 0 and y + 0 = y in floating point: bitwise the base in
    the training forward (with dropout and a key too). In the sampler's jitted decode the extra (zero) terms
    change how XLA fuses the projections, which moves a logprob by an ulp or two (4.8e-7 seen): the same
    tokens, logprobs within float32 rounding of the forward (tests/tolerance.py)."""
    adapters = lora.init_adapters(MODEL, 4, targets, jax.random.key(1))
    assert all(float(jnp.abs(ad["a"]).max()) > 0 and not jnp.any(ad["b"]) for layer in adapters["layers"]
               for ad in layer.values())
    want = _logits(base)
    np.testing.assert_array_equal(_logits(lora.attach(base, adapters, scale=SCALE)), want)
    np.testing.assert_array_equal(
        _logits(lora.attach(base, adapters, scale=SCALE, dropout=0.5), dropout_key=jax.random.key(2)), want)
    toks, mask = _tokens()
    kw = dict(key=jax.random.key(4), group_size=2, max_new_tokens=5)
    got = sampler.sample(MODEL, lora.attach(base, adapters, scale=SCALE), toks, mask, **kw)
    ref = sampler.sample(MODEL, base, toks, mask, **kw)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=forward_tol(ref.logprobs, MODEL), rtol=0)


@pytest.mark.parametrize("targets", TARGET_SETS, ids="+".join)
def test_merged_equals_attached(base, targets):
    """W + scale * A B in the target's columns gives the attached forward's logits (to float32 rounding, relative
    to their magnitude: tests/tolerance.py): a wrong column offset (k where v is), a missing scale or a
    transposed product would move them by ~0.1-1."""
    adapters = _trained_like(lora.init_adapters(MODEL, 4, targets, jax.random.key(1)))
    attached = _logits(lora.attach(base, adapters, scale=SCALE))
    assert float(jnp.abs(attached - _logits(base)).max()) > 1e-2  # the adapters matter at this size
    merged = lora.merge(MODEL, base, adapters, SCALE)
    assert jax.tree.structure(merged) == jax.tree.structure(base)
    np.testing.assert_allclose(_logits(merged), attached, atol=forward_tol(attached, MODEL), rtol=0)
    # merge touches only the targeted tensors' columns, and leaves its input alone
    changed = {name for m, b in zip(merged["layers"], base["layers"]) for name in b
               if not np.array_equal(np.asarray(m[name]), np.asarray(b[name]))}
    assert changed == {lora.target_slot(MODEL, t)[0] for t in targets}
    for name in ("qkv", "gate_up"):
        w, m = np.asarray(base["layers"][0][name]), np.asarray(merged["layers"][0][name])
        cols = np.flatnonzero(np.any(w != m, axis=0))
        want = [c for t in targets if lora.target_slot(MODEL, t)[0] == name
                for c in range(lora.target_slot(MODEL, t)[1],
                               lora.target_slot(MODEL, t)[1] + lora.target_shapes(MODEL)[t][1])]
        assert cols.tolist() == sorted(want), (name, targets)


def test_dropout_only_with_a_key_and_unbiased(base):
    adapters = _trained_like(lora.init_adapters(MODEL, 4, LORA_TARGETS, jax.random.key(1)))
    plain = _logits(lora.attach(base, adapters, scale=SCALE))
    dropped = lora.attach(base, adapters, scale=SCALE, dropout=0.3)
    np.testing.assert_array_equal(_logits(dropped), plain)  # no key (sampling, logprob passes): no dropout
    one, two = (_logits(dropped, dropout_key=jax.random.key(k)) for k in (10, 11))
    assert float(jnp.abs(one - plain).max()) > 1e-3 and float(jnp.abs(one - two).max()) > 1e-3
    np.testing.assert_array_equal(_logits(dropped, dropout_key=jax.random.key(10)), one)  # a key fixes the mask
    # inverted dropout: E[scale * (mask * x / (1 - p)) A B] = scale * x A B, the term is linear in the mask,
    # so the mean over 4000 masks is the plain term to ~ sqrt(p / (1 - p) / 4000) ~ 1% relative
    x = jax.random.normal(jax.random.key(5), (3, MODEL.d_model))
    layer = dropped["layers"][0]["lora"]
    exact = lora.delta(layer, "q", x, jnp.float32, None)
    mean = jnp.mean(jax.vmap(lambda k: lora.delta(layer, "q", x, jnp.float32, k))(
        jax.random.split(jax.random.key(6), 4000)), axis=0)
    assert float(jnp.linalg.norm(mean - exact) / jnp.linalg.norm(exact)) < 0.05


def _lora_step(*extra, trained=False):
    """(cfg, model cfg, state, step(state, key)): a LoRA rank-4 state on the tiny model (trained=True: its
    adapters `_trained_like`) and a batch of 4 prompts x G=4 sampled from its merged policy with advantages
    -1..1 (a gradient by construction)."""
    cfg = tiny_config("lora.rank=4", *extra)
    model_cfg = models.tiny(vocab_size=58)
    opt = update.make_optimizer(cfg)
    state = update.initial_state(cfg, model_cfg, models.init_params(model_cfg, jax.random.key(0)), opt,
                                jax.random.key(9))
    if trained:
        state = state.replace(params=_trained_like(state.params))
    step = jax.jit(update.make_train_step(model_cfg, cfg, opt))
    prompts, mask = jnp.full((4, 8), 9), jnp.ones((4, 8), bool)
    ro = sampler.sample(model_cfg, update.policy_params(model_cfg, cfg, state), prompts, mask, key=jax.random.key(1),
                        group_size=4, max_new_tokens=12)
    batch = experience.batch_from_rollout(ro, jnp.linspace(-1, 1, 16))
    run = lambda st, key: step(st, batch, key, jnp.float32(0.0))  # noqa: E731
    run.batch = batch  # what it trains on (the tests that bound its logprobs read it)
    return cfg, model_cfg, state, run


def _part(adapters, which):
    """Every adapter's A (which="a") or B, as host arrays, by layer and target name (a jitted step returns
    dicts with sorted keys)."""
    return [np.asarray(layer[t][which]) for layer in adapters["layers"] for t in sorted(layer)]


def test_only_the_adapters_train_and_the_optimizer_holds_only_them():
    cfg, model_cfg, state, step = _lora_step("loss.beta=0.04")
    n_adapter = lora.num_params(state.params)
    n_base = sum(x.size for x in jax.tree.leaves(state.base))
    assert n_adapter == model_cfg.n_layers * 4 * sum(i + o for i, o in lora.target_shapes(model_cfg).values())
    # Adam's state: mu and nu shaped as the adapters, plus scalar counts; nothing base-shaped
    shapes = sorted(x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert shapes == sorted(2 * [x.shape for x in jax.tree.leaves(state.params)])
    assert sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim) == 2 * n_adapter < n_base
    assert state.ref_params == {} and update.reference_params(cfg, state) is state.base  # the base is the reference
    base0, a0, b0 = _leaves(state.base), _part(state.params, "a"), _part(state.params, "b")
    first, m1 = step(state, jax.random.key(2))
    _assert_real_signal([float(m1["grad_norm"])], [float(m1["skipped"])])
    assert float(m1["kl"]) == 0.0  # the rollout policy is the base at step 0, so is the reference
    # dL/dA = x^T (dL/dy) B^T = 0 while B = 0, and Adam moves a weight with zero gradient by 0: step 1 moves
    # every B and leaves every A bitwise where it was; step 2 (B != 0) moves the A's
    for a, b in zip(a0, _part(first.params, "a")):
        np.testing.assert_array_equal(a, b)
    _assert_moved(b0, _part(first.params, "b"))
    second, m2 = step(first, jax.random.key(3))
    _assert_moved(a0, _part(second.params, "a"))
    assert float(m2["kl"]) > 0  # the policy has left the base the KL is measured against
    for x, y in zip(base0, _leaves(second.base)):  # the base is bitwise frozen
        np.testing.assert_array_equal(x, y)


def test_adapter_dropout_in_the_loss_forward_only():
    """Trained adapters (B != 0) and dropout 0.5: the loss forward differs, so loss, gradient and update do;
    the recomputed pi_old (no key) does not: the sampler-trainer gap stays float32 noise (merged vs attached
    weights) as without dropout, where a dropped-out recompute would put it near the loss change."""
    _cfg, _model_cfg, state, plain = _lora_step("sampling.old_logp_source=recompute", trained=True)
    _, _, _, dropped = _lora_step("sampling.old_logp_source=recompute", "lora.dropout=0.5", trained=True)
    p_state, p_m = plain(state, jax.random.key(2))
    d_state, d_m = dropped(state, jax.random.key(2))
    assert abs(float(p_m["loss"]) - float(d_m["loss"])) > 1e-4, (p_m["loss"], d_m["loss"])
    assert abs(float(p_m["grad_norm"]) - float(d_m["grad_norm"])) > 1e-4
    assert max(float(np.abs(a - b).max()) for a, b in zip(_leaves(p_state.params), _leaves(d_state.params))) > 1e-4
    # the sampler's merged weights against the recompute's attached adapters: two float32 programs of one forward,
    # a mean |gap| within their logprob_tol
    batch = plain.batch
    logits = completion_logits(_model_cfg, update.policy_params(_model_cfg, _cfg, state), batch)
    delta = logprob_tol(logits[np.asarray(batch.loss_mask, bool)], _model_cfg)
    assert float(p_m["gap/abs_logp"]) <= delta and float(d_m["gap/abs_logp"]) == float(p_m["gap/abs_logp"])


def test_config_errors_name_the_field():
    for item, words in [("lora.rank=-1", r"LoraConfig\.rank: must be an int >= 0"),
                        ("lora.rank=2.5", r"lora\.rank \(LoraConfig\.rank\): must be an integer"),
                        ("lora.alpha=0", r"LoraConfig\.alpha: must be a finite number > 0"),
                        ("lora.dropout=1.0", r"LoraConfig\.dropout: must be in \[0, 1\)"),
                        ('lora.targets=["q", "qkv"]', r"LoraConfig\.targets: unknown projections \['qkv'\]; known: q,"),
                        ('lora.targets=["q", "q"]', r"LoraConfig\.targets: a projection is named twice"),
                        ("lora.targets=[]", r"LoraConfig\.targets: must be a non-empty list"),
                        ("lora.targets=q", r"lora\.targets \(LoraConfig\.targets\): must be a list")]:
        with pytest.raises(ValueError, match=words):
            override(TrainConfig(), [item])
    cfg = override(TrainConfig(), ["lora.rank=8", 'lora.targets=["q", "v"]'])
    assert cfg.lora == LoraConfig(rank=8, alpha=32.0, targets=("q", "v")) and cfg.lora.scale == 4.0
    assert TrainConfig().lora.rank == 0 and TrainConfig().lora.scale == 0.0  # off by default


def test_trainer_rolls_out_and_exports_the_merged_policy(tmp_path, monkeypatch):
    """2 GRPO steps with rank-4 adapters and a real gradient: the adapters move, the base does not, the
    rollouts and the evaluation get the merged policy, and both exports write it (transformers loads it and
    gives the attached forward's logits)."""
    import transformers

    from tests.hf_util import hf_logits

    seen = []  # the params each training rollout decoded with (the greedy evaluation's, G = 1, left out)
    rollout = experience.rollout
    monkeypatch.setattr(experience, "rollout", lambda actor, params, *a, **k: (
        k["group_size"] > 1 and seen.append(params), rollout(actor, params, *a, **k))[1])
    out = tmp_path / "run"
    tr = train.Trainer(signal_config("steps=2", "lora.rank=4", "loss.beta=0.04", "checkpoint.export_hf=true"),
                       str(out), quiet=True)
    assert sharding.param_specs(tr.state.params, tr.mesh)  # every adapter leaf has logical axes
    adapters0, base0 = _leaves(tr.state.params), _leaves(tr.state.base)
    merged = []  # the merged policy before each step, which that step must have rolled out
    real_step = tr.step_once
    monkeypatch.setattr(tr, "step_once", lambda: (merged.append(_leaves(tr.policy_params())), real_step())[1])
    tr.run()
    rows = read_jsonl(str(out / "metrics.jsonl"))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    _assert_moved(adapters0, _leaves(tr.state.params))
    for x, y in zip(base0, _leaves(tr.state.base)):
        np.testing.assert_array_equal(x, y)
    assert len(seen) == 2 and len(merged) == 2
    for rolled, want in zip(seen, merged):
        for x, y in zip(_leaves(rolled), want):
            np.testing.assert_array_equal(x, y)
    for x, y in zip(_leaves(seen[0]), base0):  # B = 0 at step 0: the merged policy is the base
        np.testing.assert_array_equal(x, y)
    _assert_moved(base0, _leaves(seen[1]))  # after step 1 it is not
    # the exports (end of run and from the checkpoint) hold W + scale A B; transformers agrees with the
    # attached forward on them
    model_cfg = tr.actor.model_cfg
    final = update.policy_params(model_cfg, tr.cfg, tr.state)
    export.main([str(out), str(tmp_path / "cli")])
    tokens = np.asarray(jax.random.randint(jax.random.key(3), (2, 9), 0, model_cfg.vocab_size))
    pos = text_positions(np.ones_like(tokens))
    attached = models.forward(model_cfg, update.forward_params(tr.cfg, tr.state.params, tr.state.base),
                              jnp.asarray(tokens), pos)[0]
    for folder in (out / "hf", tmp_path / "cli"):
        _, params = models.load_hf(str(folder))
        for x, y in zip(_leaves(params), _leaves(final)):
            # W + scale A B on each side: the rank-4 sum, the scale and the add, 6 roundings of eps/2 of the
            # merged weights' magnitude (the adapters' product is small beside W): 6 ulps is 2x room
            np.testing.assert_allclose(x, y, rtol=0, atol=rounding_tol(y, ulps=6))
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        ref = hf_logits(hf, tokens)
        assert float(np.abs(np.asarray(attached) - ref).max()) <= forward_tol(ref, model_cfg)


def test_resume_with_lora_is_bitwise_and_the_reference_resets_to_the_merged_policy(tmp_path):
    """ref_reset_every=2 with beta > 0: the reference is a held copy from the start (so the checkpoint's
    shapes never change) and after step 2 equals the merged policy. A run stopped after step 2 and resumed
    continues exactly as a straight 3-step run (dropout 0.1 on, so the dropout keys must line up too)."""
    extra = ("lora.rank=4", "lora.dropout=0.1", "loss.beta=0.04", "ref_reset_every=2")
    straight = train.Trainer(signal_config("steps=3", *extra), str(tmp_path / "straight"), quiet=True)
    assert jax.tree.structure(straight.state.ref_params) == jax.tree.structure(straight.state.base)
    straight.run()
    train.Trainer(signal_config("steps=2", *extra), str(tmp_path / "resumed"), quiet=True).run()
    resumed = train.Trainer(signal_config("steps=3", *extra), str(tmp_path / "resumed"), resume=True, quiet=True)
    assert resumed.step == 2
    at2 = resumed.policy_params()
    for x, y in zip(_leaves(resumed.state.ref_params), _leaves(at2)):  # reset after step 2, saved with it
        np.testing.assert_array_equal(x, y)
    _assert_moved(_leaves(resumed.state.base), _leaves(resumed.state.ref_params))
    resumed.run()
    for a, b in zip(_leaves(straight.state), _leaves(resumed.state)):
        np.testing.assert_array_equal(a, b)
    rows = read_jsonl(str(tmp_path / "straight" / "metrics.jsonl"))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    # the same rows, except that the 2-step segment evaluated at its last step (eval/* in its row 2)
    logs = [[{k: v for k, v in r.items() if not k.startswith("eval/")}
             for r in read_jsonl(str(tmp_path / name / "metrics.jsonl"))] for name in ("straight", "resumed")]
    assert logs[0] == logs[1] and [r["step"] for r in logs[0]] == [1, 2, 3]


MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from grpo_jax import train
    from grpo_jax.config import TrainConfig, override
    tr = train.Trainer(override(TrainConfig(), json.loads(sys.argv[1])), sys.argv[2], quiet=True)
    initial = [np.asarray(x).tolist() for x in jax.tree.leaves(tr.state.params)]
    base0 = [np.asarray(x) for x in jax.tree.leaves(tr.state.base)]
    from tests.test_train import steps_with_tols
    metrics, tols = steps_with_tols(tr, 2)
    frozen = all((a == np.asarray(b)).all() for a, b in zip(base0, jax.tree.leaves(tr.state.base)))
    q = tr.state.params["layers"][0]["q"]
    print(json.dumps({"losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
                      "loss_tols": [t[0] for t in tols], "grad_rtols": [t[1] for t in tols],
                      "skipped": [m["skipped"] for m in metrics], "initial": initial,
                      "specs": [str(q["a"].sharding.spec), str(q["b"].sharding.spec),
                                str(tr.state.base["layers"][0]["qkv"].sharding.spec)],
                      "base_frozen": bool(frozen),
                      "params": [np.asarray(x).tolist() for x in jax.tree.leaves(tr.state.params)]}))
""")


def _mesh_run(tmp_path, name, devices, *extra):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    items = TINY + SIGNAL + ["model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=16", "model.d_model=64",
                             "lora.rank=4"] + list(extra)
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT, json.dumps(items), str(tmp_path / name)], env=env,
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    _assert_real_signal(result["grad_norms"], result["skipped"])
    assert result["base_frozen"]
    return result


def test_fsdp_x_tensor_mesh_matches_single_device(tmp_path):
    """A on fsdp like its base tensor's input rows, B on tensor like its output columns; 2 steps on 2 x 2
    devices give one device's adapters (the comparison of test_train's 2x2x2 mesh test)."""
    one = _mesh_run(tmp_path, "one", 1, "mesh.data=1")
    many = _mesh_run(tmp_path, "many", 4, "mesh.data=1", "mesh.fsdp=2", "mesh.tensor=2")
    spec = jax.sharding.PartitionSpec
    assert many["specs"] == [str(spec("fsdp")), str(spec(None, "tensor")), str(spec("fsdp", "tensor"))], \
        many["specs"]  # q's A (a trailing None is dropped from an array's spec), q's B, the base qkv
    for a, b in zip(many["initial"], one["initial"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _assert_same_steps(many, one)
    _assert_same_update(many["params"], one["params"], one["initial"])
