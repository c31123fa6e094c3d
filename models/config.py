"""Model configuration: one frozen dataclass, validated on construction, plus named presets."""

from __future__ import annotations

import dataclasses

ROPE_KINDS = ("rope", "rope2d", "mrope")
ARCHS = ("llama", "qwen2", "qwen2_vl", "qwen3")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
DTYPES = ("float32", "bfloat16", "float16")
# Option lists grpo_jax.config validates against: it imports them from here, so this module imports no jax at
# import time (the dtype properties import it when asked).
REMAT_MODES = ("none", "full", "dots")  # per-layer gradient checkpointing, see models.modules.remat_policy
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # models.lora projections; the index seeds each init


def _jnp_dtype(name: str):
    # jax is imported here, not at the top, so that grpo_jax.config can read this module's lists without jax
    import jax.numpy as jnp

    return jnp.dtype(name)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a decoder-only LM (Llama / Qwen2 / Qwen2-VL text decoder / Qwen3 family)."""

    vocab_size: int  # V: rows of the embedding table
    d_model: int  # D: residual stream width
    n_layers: int  # number of decoder blocks
    n_heads: int  # N: query heads
    n_kv_heads: int  # K: key/value heads (GQA: n_heads % n_kv_heads == 0)
    head_dim: int  # H: width of one head (even: RoPE rotates pairs)
    mlp_dim: int  # F: SwiGLU hidden width
    norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_kind: str = "rope"  # "rope" (positions [B,T]) | "rope2d" ([2,B,T]) | "mrope" ([3,B,T])
    rope_theta: float = 10_000.0  # RoPE base
    mrope_sections: tuple[int, ...] = ()  # M-RoPE frequencies per (t, h, w); sums to head_dim // 2
    mrope_interleaved: bool = False  # Qwen3-VL layout (t,h,w,t,h,w,...) instead of Qwen2-VL chunks
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2 has it, Llama not)
    qk_norm: bool = False  # RMSNorm over each head's q and k (weights [H] shared by the heads) before RoPE: Qwen3
    # Llama-3 RoPE scaling, ((key, value), ...) over LLAMA3_ROPE_KEYS; () = none (models.rope.llama3_inv_freq)
    rope_scaling: tuple = ()
    tie_embeddings: bool = False  # lm_head = embed^T
    attn_output_gate: bool = False  # gated attention: SDPA(Q,K,V) * sigmoid(X W_g) before o_proj
    param_dtype: str = "float32"  # storage dtype of the weights
    dtype: str = "float32"  # matmul dtype; norms, softmax, logits always float32
    arch: str = "llama"  # Hugging Face family used by models.hf when writing a checkpoint
    remat: str = "none"  # recompute each decoder layer in the backward pass: "none" | "full" | "dots" (not in HF)
    # the cache-free (training, logprob) forward runs the layers as one lax.scan over their stacked weights:
    # one compiled layer body instead of n_layers copies (compile time); the same numbers (not in HF)
    scan_layers: bool = False
    # completion logprobs in the update: the head applied `logits_chunk` tokens at a time under a checkpoint, so
    # only [rows, logits_chunk, V] float32 logits live at once, forward and backward; 0 = all positions at once
    logits_chunk: int = 0
    # a Flax linen Module class of your own, "package.module:Class", built as Class(cfg) (the model protocol,
    # models.transformer); "" = the built-in models.modules.Decoder
    module: str = ""
    # positions the model was trained for, prompt + completion (HF max_position_embeddings); 0 = none known (a
    # randomly initialised preset): the forward computes any position, this is what a run may ask of it
    max_positions: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.norm_eps > 0:
            raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if self.rope_kind not in ROPE_KINDS:
            raise ValueError(f"ModelConfig.rope_kind must be one of {ROPE_KINDS}, got {self.rope_kind!r}")
        if self.rope_kind == "rope2d" and self.head_dim % 4:
            raise ValueError(f"ModelConfig.head_dim must be a multiple of 4 for rope2d, got {self.head_dim}")
        if self.rope_kind == "mrope":
            if len(self.mrope_sections) != 3 or sum(self.mrope_sections) != self.head_dim // 2:
                raise ValueError(
                    "ModelConfig.mrope_sections must be 3 ints (t, h, w) summing to head_dim // 2 = "
                    f"{self.head_dim // 2}, got {self.mrope_sections!r}"
                )
        elif self.mrope_sections or self.mrope_interleaved:
            raise ValueError("ModelConfig.mrope_sections / mrope_interleaved need rope_kind='mrope'")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"ModelConfig.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.rope_scaling:
            keys = tuple(sorted(k for k, _ in self.rope_scaling))
            if keys != tuple(sorted(LLAMA3_ROPE_KEYS)) or self.rope_kind != "rope":
                raise ValueError(f"ModelConfig.rope_scaling must give exactly {LLAMA3_ROPE_KEYS} (Llama-3 scaling, "
                                 f"rope_kind='rope'), got {self.rope_scaling!r} with rope_kind={self.rope_kind!r}")
            scaling = dict(self.rope_scaling)
            if not (scaling["factor"] > 0 and scaling["original_max_position_embeddings"] > 0
                    and scaling["high_freq_factor"] > scaling["low_freq_factor"] > 0):
                raise ValueError("ModelConfig.rope_scaling needs factor > 0, original_max_position_embeddings > 0 "
                                 f"and high_freq_factor > low_freq_factor > 0, got {scaling}")
        if self.remat not in REMAT_MODES:
            raise ValueError(f"ModelConfig.remat must be one of {REMAT_MODES}, got {self.remat!r}")
        if not isinstance(self.max_positions, int) or self.max_positions < 0:
            raise ValueError(f"ModelConfig.max_positions must be an int >= 0 (0 = none known), "
                             f"got {self.max_positions!r}")
        if not isinstance(self.logits_chunk, int) or self.logits_chunk < 0:
            raise ValueError(f"ModelConfig.logits_chunk must be an int >= 0 (0 = off), got {self.logits_chunk!r}")
        if not isinstance(self.module, str) or (self.module and ":" not in self.module):
            raise ValueError(f"ModelConfig.module must be \"\" or an import path package.module:Class, got {self.module!r}")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def jnp_dtype(self):
        return _jnp_dtype(self.dtype)

    @property
    def jnp_param_dtype(self):
        return _jnp_dtype(self.param_dtype)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count (embeddings included once when tied)."""
        d, f = self.d_model, self.mlp_dim
        qkv = d * (self.q_dim + 2 * self.kv_dim) + (self.q_dim + 2 * self.kv_dim) * self.qkv_bias
        gate = d * self.q_dim if self.attn_output_gate else 0
        layer = qkv + gate + self.q_dim * d + 3 * d * f + 2 * d + 2 * self.head_dim * self.qk_norm
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.n_layers * layer + d + head


def tiny(**overrides) -> ModelConfig:
    """A few-hundred-thousand-parameter model for tests and CPU experiments."""
    base = dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128)
    return ModelConfig(**{**base, **overrides})


def bench_qwen2_tiny(**overrides) -> ModelConfig:
    """The benchmark model (docs/measurements.md §1): vocab 512, hidden 256, MLP 688, 4 layers, 8/2 heads, tied (2.9M)."""
    base = dict(
        vocab_size=512, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32, mlp_dim=688,
        qkv_bias=True, tie_embeddings=True, rope_theta=1_000_000.0, arch="qwen2",
    )
    return ModelConfig(**{**base, **overrides})


def qwen2_5_0_5b(**overrides) -> ModelConfig:
    """Shapes of Qwen2.5-0.5B (494M parameters)."""
    base = dict(
        vocab_size=151_936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, mlp_dim=4864,
        qkv_bias=True, tie_embeddings=True, rope_theta=1_000_000.0, arch="qwen2",
    )
    return ModelConfig(**{**base, **overrides})


def llama_1b(**overrides) -> ModelConfig:
    """Shapes of a Llama-3.2-1B-style model (without its rope scaling)."""
    base = dict(
        vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, mlp_dim=8192,
        norm_eps=1e-5, rope_theta=500_000.0, tie_embeddings=True, arch="llama",
    )
    return ModelConfig(**{**base, **overrides})


def qwen3_0_6b(**overrides) -> ModelConfig:
    """Shapes of Qwen3-0.6B (596M parameters; head_dim 128 > d_model / n_heads, q/k norms)."""
    base = dict(
        vocab_size=151_936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, mlp_dim=3072,
        qk_norm=True, tie_embeddings=True, rope_theta=1_000_000.0, arch="qwen3",
    )
    return ModelConfig(**{**base, **overrides})


def _qwen2_5(d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, mlp_dim: int, *, vocab_size: int,
             tie: bool):
    """A Qwen2.5 shape (config.json of the released checkpoints): head_dim 128, q/k/v biases, theta 1e6."""
    def make(**overrides) -> ModelConfig:
        base = dict(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                    head_dim=128, mlp_dim=mlp_dim, qkv_bias=True, tie_embeddings=tie, rope_theta=1_000_000.0,
                    arch="qwen2")
        return ModelConfig(**{**base, **overrides})
    return make


def _qwen3(d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, mlp_dim: int, *, tie: bool):
    """A Qwen3 shape (config.json of the released checkpoints): head_dim 128, q/k norms, theta 1e6."""
    def make(**overrides) -> ModelConfig:
        base = dict(vocab_size=151_936, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                    head_dim=128, mlp_dim=mlp_dim, qk_norm=True, tie_embeddings=tie, rope_theta=1_000_000.0,
                    arch="qwen3")
        return ModelConfig(**{**base, **overrides})
    return make


PRESETS = {"tiny": tiny, "bench_qwen2_tiny": bench_qwen2_tiny, "qwen2.5-0.5b": qwen2_5_0_5b, "llama-1b": llama_1b,
           "qwen3-0.6b": qwen3_0_6b,
           # shapes only (no weights): what `python -m grpo_jax.aot` compiles at real sizes
           "qwen2.5-1.5b": _qwen2_5(1536, 28, 12, 2, 8960, vocab_size=151_936, tie=True),
           "qwen2.5-7b": _qwen2_5(3584, 28, 28, 4, 18_944, vocab_size=152_064, tie=False),
           "qwen2.5-14b": _qwen2_5(5120, 48, 40, 8, 13_824, vocab_size=152_064, tie=False),
           "qwen3-8b": _qwen3(4096, 36, 32, 8, 12_288, tie=False),
           "qwen3-14b": _qwen3(5120, 40, 40, 8, 17_408, tie=False)}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name](**overrides)
