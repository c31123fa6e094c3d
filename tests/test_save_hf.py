"""`models.save_hf` round trip: save -> `models.load_hf` gives back the same config and every param leaf
bit for bit, and transformers' PyTorch model loaded from the saved folder gives our logits.

Every param is perturbed away from its init (random q/k/v biases, non-unit norm weights, no zero or
repeated rows), so a tensor written under the wrong name, transposed, split at the wrong offset (q/k/v,
gate/up) or dropped would show. Each supported (arch, rope kind) with tied and untied embeddings; n_kv_heads
differs from n_heads and (Llama, Qwen2) head_dim from d_model / n_heads, so those fields must be written too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import models
from models.rope import text_positions
from tests.hf_util import hf_logits
from tests.tolerance import forward_tol

NOISE_STD = 0.05  # added to every param leaf (init: matrices ~N(0, 0.02), norms 1, biases 0)
HF_CLASS = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
            "qwen2_vl": transformers.Qwen2VLForConditionalGeneration, "qwen3": transformers.Qwen3ForCausalLM}


def _config(arch: str, tie: bool) -> models.ModelConfig:
    """A tiny config of `arch` (Llama: no q/k/v bias, the only form its checkpoints hold; Qwen2 / Qwen2-VL:
    with it; Qwen3: no bias, q/k norms), non-default norm eps and RoPE base. Llama and Qwen2 get head_dim 8 != d_model / n_heads = 16;
    Qwen2-VL keeps 16: transformers' Qwen2VLAttention ignores config.head_dim (hidden_size // num_heads)."""
    if arch == "qwen2_vl":
        shape = {"rope_kind": "mrope", "mrope_sections": (2, 3, 3)}
    else:
        shape = {"head_dim": 8}
    return models.tiny(arch=arch, qkv_bias=arch not in ("llama", "qwen3"), qk_norm=arch == "qwen3",
                       tie_embeddings=tie, norm_eps=1e-5, rope_theta=50_000.0, **shape)


def _perturbed_params(cfg: models.ModelConfig, seed: int = 0) -> dict:
    """init_params + N(0, NOISE_STD) noise on every leaf."""
    rng = np.random.default_rng(seed)
    params = models.init_params(cfg, jax.random.key(seed))
    return jax.tree.map(lambda x: x + jnp.asarray(rng.normal(0.0, NOISE_STD, x.shape), x.dtype), params)


def _leaves(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(tree)}


CASES = [(arch, tie) for arch in ("llama", "qwen2", "qwen2_vl", "qwen3") for tie in (False, True)]


@pytest.mark.parametrize("arch, tie", CASES, ids=[f"{a}-{'tied' if t else 'untied'}" for a, t in CASES])
def test_save_hf_round_trip_every_leaf_and_transformers_logits(arch, tie, tmp_path):
    cfg = _config(arch, tie)
    params = _perturbed_params(cfg)
    leaves = _leaves(params)
    # the design check: nothing left at its init value
    assert ("lm_head" in params) == (not tie)
    for layer in params["layers"]:
        assert np.all(np.asarray(layer["attn_norm"]) != 1.0) and np.all(np.asarray(layer["mlp_norm"]) != 1.0)
        if cfg.qkv_bias:
            assert np.all(np.asarray(layer["qkv_bias"]) != 0.0)
    path = str(tmp_path / "ckpt")
    models.save_hf(cfg, params, path)

    cfg2, params2 = models.load_hf(path)
    # a config without a positions count is written with transformers' usual 32768, and reads back with it
    assert cfg2 == cfg.replace(max_positions=cfg.max_positions or models.hf.HF_DEFAULT_POSITIONS)
    leaves2 = _leaves(params2)
    assert sorted(leaves2) == sorted(leaves)
    for name, x in leaves.items():
        assert leaves2[name].dtype == x.dtype, name
        np.testing.assert_array_equal(leaves2[name], x, err_msg=name)

    hf = HF_CLASS[arch].from_pretrained(path).eval()
    tokens = np.random.RandomState(2).randint(0, cfg.vocab_size, (2, 10))
    pos = text_positions(np.ones_like(tokens))
    ours, _ = models.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(np.stack([pos] * 3) if arch == "qwen2_vl"
                                                                          else pos))
    ref = hf_logits(hf, tokens)
    # the same float32 function summed in two libraries' orders: rounding only, relative to the logits' magnitude
    diff, tol = np.abs(np.asarray(ours) - ref).max(), forward_tol(ref, cfg)
    print(f"\n{arch} tie={tie}: max |logit diff| = {diff:.2e}, tolerance {tol:.2e}, "
          f"logit std {float(jnp.std(ours)):.2f}")
    assert diff <= tol
