"""Rotary position embeddings: 1D RoPE, 2D-RoPE and M-RoPE, all in the rotate-half convention.

Rotate-half (Hugging Face Llama/Qwen2/Qwen2-VL) pairs dimension j with j + H/2, not (2j, 2j+1):

    inv_freq[j] = theta^(-2j/d)            j = 0 .. d/2-1
    angle[..., j] = pos * inv_freq[j];  emb = concat([angle, angle]);  x' = x*cos(emb) + rotate_half(x)*sin(emb)

The three kinds differ only in how the per-frequency angle is built from the positions:
- ``rope``   positions [B, T]:    angle = pos * inv_freq(H)
- ``rope2d`` positions [2, B, T]: (row, col); angle = concat([row * inv_freq(H/2), col * inv_freq(H/2)])
  (the Qwen2-VL vision tower's axial layout: of each half, first quarter by row, second by column)
- ``mrope``  positions [3, B, T]: (t, h, w); frequency f takes its angle from the axis
  ``mrope_axis_of_freq(sections, interleaved)[f]`` (chunked sections of Qwen2-VL, interleaved of Qwen3-VL).
For text tokens t = h = w and M-RoPE reduces exactly to 1D RoPE.

Angles, cos and sin are float32 whatever the compute dtype. The position-id builders at the end are host
(NumPy) functions that reproduce transformers' Qwen2-VL `get_rope_index` and vision patch order.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig


def inv_freq(dim: int, theta: float) -> jnp.ndarray:
    """[dim // 2] float32 inverse frequencies theta^(-2j/dim)."""
    return 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def llama3_inv_freq(freqs: jnp.ndarray, scaling: dict) -> jnp.ndarray:
    """Llama-3.1 RoPE scaling of the inverse frequencies (transformers ``_compute_llama3_parameters``):
    with wavelength w = 2 pi / f and L = original_max_position_embeddings,

        w < L / high_freq_factor             f                                  (high frequencies kept)
        w > L / low_freq_factor              f / factor                         (low frequencies slowed)
        otherwise                            (1 - s) f / factor + s f,   s = (L / w - low) / (high - low)

    The cos/sin scale (attention_factor) is 1 for this type."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * np.pi / freqs
    scaled = jnp.where(wavelen > old_len / low, freqs / factor, freqs)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return jnp.where(medium, smoothed, scaled)


def mrope_axis_of_freq(sections: tuple[int, ...], interleaved: bool) -> np.ndarray:
    """[H/2] int array: which position axis (0=t, 1=h, 2=w) drives each rotary frequency.

    Chunked (Qwen2-VL): the first s_t frequencies take t, the next s_h take h, the last s_w take w.
    Interleaved (Qwen3-VL): f = 1 mod 3 takes h and f = 2 mod 3 takes w while f < 3*s_h (resp. 3*s_w);
    everything else takes t, so every axis spans the whole spectrum.
    """
    n = sum(sections)
    if not interleaved:
        return np.repeat(np.arange(3), sections).astype(np.int32)
    axis = np.zeros(n, np.int32)
    for dim, offset in ((1, 1), (2, 2)):
        axis[offset : sections[dim] * 3 : 3] = dim
    return axis


def rope_angles(cfg: ModelConfig, positions: jnp.ndarray) -> jnp.ndarray:
    """Per-frequency rotation angles [B, T, H/2] (float32) for the config's RoPE kind."""
    pos = positions.astype(jnp.float32)
    h = cfg.head_dim
    if cfg.rope_kind == "rope":
        _check_rank(positions, 2, "rope", "[B, T]")
        freqs = inv_freq(h, cfg.rope_theta)
        if cfg.rope_scaling:
            freqs = llama3_inv_freq(freqs, dict(cfg.rope_scaling))
        return pos[..., None] * freqs
    if cfg.rope_kind == "rope2d":
        _check_rank(positions, 3, "rope2d", "[2, B, T]")
        freqs = inv_freq(h // 2, cfg.rope_theta)  # [H/4]
        return jnp.concatenate([pos[0][..., None] * freqs, pos[1][..., None] * freqs], axis=-1)
    _check_rank(positions, 3, "mrope", "[3, B, T]")
    angles_3 = pos[..., None] * inv_freq(h, cfg.rope_theta)  # [3, B, T, H/2]
    axis = mrope_axis_of_freq(cfg.mrope_sections, cfg.mrope_interleaved)
    onehot = jnp.asarray(np.eye(3, dtype=np.float32)[axis].T)  # [3, H/2]: exact selection, no gather
    return jnp.einsum("abtf,af->btf", angles_3, onehot)


def _check_rank(positions, rank: int, kind: str, shape: str) -> None:
    if positions.ndim != rank or (rank == 3 and positions.shape[0] != {"rope2d": 2, "mrope": 3}[kind]):
        raise ValueError(f"positions for rope_kind={kind!r} must be {shape}, got shape {positions.shape}")


def rope_cos_sin(cfg: ModelConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos, sin [B, T, H] float32 in the rotate-half layout (angles duplicated over the two halves)."""
    angles = rope_angles(cfg, positions)
    emb = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: jnp.ndarray) -> jnp.ndarray:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x_BxTxNxH: jnp.ndarray, cos_BxTxH: jnp.ndarray, sin_BxTxH: jnp.ndarray) -> jnp.ndarray:
    """Rotate queries or keys; computed in float32, returned in x's dtype."""
    x = x_BxTxNxH.astype(jnp.float32)
    cos, sin = cos_BxTxH[:, :, None, :], sin_BxTxH[:, :, None, :]
    return (x * cos + rotate_half(x) * sin).astype(x_BxTxNxH.dtype)


# --------------------------------------------------------------------------------------------------
# Position-id builders
# --------------------------------------------------------------------------------------------------

def text_positions(mask_BxT) -> jnp.ndarray:
    """1D positions for a left- or right-padded batch: 0, 1, ... over real tokens, 0 on padding.
    Jittable; also takes NumPy masks."""
    mask = jnp.asarray(mask_BxT).astype(jnp.int32)
    return jnp.where(mask > 0, jnp.cumsum(mask, axis=-1) - 1, 0).astype(jnp.int32)


def rope_positions(cfg: ModelConfig, pos_BxT: jnp.ndarray) -> jnp.ndarray:
    """Text positions [B, T] in the layout the config's RoPE kind expects: [B, T] for rope, [2, B, T] for
    rope2d and [3, B, T] for mrope, every axis equal (text tokens sit on the diagonal)."""
    if cfg.rope_kind == "rope":
        return pos_BxT
    return jnp.stack([pos_BxT] * (2 if cfg.rope_kind == "rope2d" else 3))


def mrope_token_types(input_ids: np.ndarray, *, image_token_id: int, video_token_id: int) -> np.ndarray:
    """0 for text, 1 for image, 2 for video tokens (transformers' `mm_token_type_ids`)."""
    ids = np.asarray(input_ids)
    return np.where(ids == image_token_id, 1, np.where(ids == video_token_id, 2, 0)).astype(np.int32)


def _vision_block_positions(start: int, grid_thw, merge: int) -> np.ndarray:
    """[3, t*h*w/merge^2] positions of one image/video block, flattened t-major then h then w."""
    t, h, w = int(grid_thw[0]), int(grid_thw[1]) // merge, int(grid_thw[2]) // merge
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt, hh, ww]).reshape(3, -1) + start


def mrope_positions(
    token_types_BxT: np.ndarray,
    *,
    attention_mask: np.ndarray | None = None,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    spatial_merge_size: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """M-RoPE position ids [3, B, T] and decoding deltas [B, 1], as transformers' Qwen2-VL `get_rope_index`.

    Over the non-padding tokens of each row, in order: a text run of length L gets `arange(L) + cur` on all
    three axes and advances `cur` by L; a vision block with grid (t, h, w) gets (t_i, h_i, w_i) + cur
    (h, w after the spatial merge) and advances `cur` by max(h, w) // merge. Padding slots get 0.
    `delta = max(position) + 1 - n_tokens`; while decoding, the position of cache slot s is s + delta on
    all three axes. (This is transformers 5.x behaviour; releases before it started the next text run at
    max(vision position) + 1, which differs for videos with t > max(h, w), and gave padding position 1.)
    """
    types = np.asarray(token_types_BxT)
    b, t = types.shape
    mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    grids = {1: iter(_as_grid_list(image_grid_thw)), 2: iter(_as_grid_list(video_grid_thw))}
    positions = np.zeros((3, b, t), np.int64)
    deltas = np.zeros((b, 1), np.int64)
    for row in range(b):
        row_types = types[row][mask[row]]
        cur, pieces, start = 0, [], 0
        while start < len(row_types):
            kind = row_types[start]
            end = start + 1
            while end < len(row_types) and row_types[end] == kind:
                end += 1
            if kind == 0:
                pieces.append(np.broadcast_to(np.arange(end - start) + cur, (3, end - start)))
                cur += end - start
            else:
                grid = next(grids[int(kind)], None)
                if grid is None:
                    raise ValueError(f"row {row}: more {'image' if kind == 1 else 'video'} runs than grids")
                pieces.append(_vision_block_positions(cur, grid, spatial_merge_size))
                cur += max(int(grid[1]), int(grid[2])) // spatial_merge_size
            start = end
        row_pos = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
        if row_pos.shape[1] != len(row_types):
            raise ValueError(
                f"row {row}: {len(row_types)} tokens but the vision grids account for {row_pos.shape[1]} positions"
            )
        positions[:, row, mask[row]] = row_pos
        deltas[row, 0] = (row_pos.max() + 1 if row_pos.size else 0) - len(row_types)
    return positions, deltas


def _as_grid_list(grid_thw) -> list:
    return [] if grid_thw is None else [tuple(int(v) for v in g) for g in np.asarray(grid_thw)]


def vision_patch_positions(grid_thw: np.ndarray, spatial_merge_size: int = 2) -> np.ndarray:
    """[2, N] (row, col) 2D-RoPE positions of vision patches, in the Qwen2-VL ViT order.

    The (h, w) grid is walked in merge x merge windows so that each window's patches are contiguous (what
    the patch merger expects), and repeated over t.
    """
    out = []
    m = spatial_merge_size
    for t, h, w in _as_grid_list(grid_thw):
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // m, m, w // m, m)
        hh = hh.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
        ww = ww.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
        out.append(np.tile(np.stack([hh, ww]), (1, t)))
    return np.concatenate(out, axis=1).astype(np.int32)
