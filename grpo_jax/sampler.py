"""Group rollout: G completions per prompt, with the logprobs and entropies of what was sampled.

    rollout = sample(cfg, params, prompt_tokens, prompt_mask, key=key, group_size=8, max_new_tokens=128)

Shape of the work (B prompts, G completions each, T = max_new_tokens):
1. Prompts are re-packed to the left (real tokens flush right, whatever padding came in) and left-padded to
   a power-of-two bucket P, so varied prompt lengths compile a bounded number of times.
2. One jitted prefill over the B prompts writes a KV cache of P + T slots; the cache and the last logits
   are then repeated G times (prefill once per prompt, not once per row).
3. One jitted decode over all B*G rows: a few `lax.while_loop`s in sequence, chunk c covering steps
   [c*C, (c+1)*C) over a cache grown (padded) to P + (c+1)*C slots before it starts, so attention never
   reads the slots no step can have filled yet; it stops as soon as every row has emitted an EOS or T
   tokens; no host sync per token. Within a chunk the cache is loop state, updated in place.

Randomness: row (b, g) draws step t from `fold_in(fold_in(fold_in(key, prompt_index[b]), g), t)`, so the
same (params, prompts, key) gives the same rollout on one device, under `pmap` or on a sharded mesh. `key`
may be typed (`jax.random.key`) or legacy (`jax.random.PRNGKey`): the same seed gives the same rollout.

Logprobs and entropies are those of the distribution actually sampled from (temperature, then top-k, then
top-p). At temperature 0 (greedy) they are reported for the untempered, unfiltered distribution.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

import models
from jax.sharding import PartitionSpec as P

from models.config import ModelConfig
from models.keys import as_typed_key
from models.rope import rope_positions, text_positions

NEG_INF = -1e30
TOOL_STATS = ("calls", "errors", "timeouts", "truncations", "seconds")  # Rollout.tool_stats' last axis (ToolStats)


@flax.struct.dataclass
class Rollout:
    """G completions for each of B prompts; P = the prompt bucket width, T = max_new_tokens. The prompts
    travel with their completions, left-aligned once by `sample`, so nothing downstream re-aligns them."""

    prompt_tokens: jax.Array  # [B, P] int32 prompts, left-padded with pad_id (real tokens flush right)
    prompt_mask: jax.Array  # [B, P] bool, True on real prompt tokens
    tokens: jax.Array  # [B, G, T] int32 completion tokens (pad_id after the end)
    completion_mask: jax.Array  # [B, G, T] 1 up to and including the first EOS, else 0
    logprobs: jax.Array  # [B, G, T] float32 log p(token) under the sampling distribution
    entropies: jax.Array  # [B, G, T] float32 entropy of that distribution (nats)
    policy_entropies: jax.Array  # [B, G, T] float32 entropy of the policy itself, softmax(logits) at T = 1
    lengths: jax.Array  # [B, G] int32 completion lengths (EOS included)
    truncated: jax.Array  # [B, G] bool: reached max_new_tokens without EOS
    temperatures: jax.Array  # [B, G, T] float32 temperature each token was drawn at (0 = greedy)
    # [B, G, T] bool: True where the policy drew the token, False where the host inserted it (a tool's output);
    # a single-turn decode draws every token, so it is all True. Only `policy_tokens` enter training.
    policy_mask: jax.Array
    # [B, G, len(TOOL_STATS)] float32 per row: its tool calls, failed calls, calls out of time, calls whose output
    # was cut, seconds in the sandbox (grpo_jax.multiturn); None for a rollout without a tool
    tool_stats: jax.Array | None = None

    @property
    def policy_tokens(self) -> jax.Array:
        """[B, G, T] bool: the completion's tokens the policy sampled (completion_mask & policy_mask), the one
        mask the update's loss and the per-token diagnostics read; lengths still count every completion token."""
        return self.completion_mask.astype(bool) & jnp.asarray(self.policy_mask, bool)


# --------------------------------------------------------------------------------------------------
# logit processing (pure functions on [..., V] logits)
# --------------------------------------------------------------------------------------------------

def apply_temperature(logits: jax.Array, temperature) -> jax.Array:
    """logits / T; T = 0 (greedy) leaves logits as they are (the argmax is taken elsewhere)."""
    t = jnp.asarray(temperature, jnp.float32)
    return logits / jnp.where(t > 0, t, 1.0)


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
    """Keep the k largest logits (ties at the k-th value are all kept); k <= 0 keeps everything."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits >= kth, logits, NEG_INF)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches p (the top token is
    always kept); p >= 1 keeps everything."""
    if p >= 1.0:
        return logits
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = mass_before < p
    threshold = jnp.min(jnp.where(kept, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, NEG_INF)


def process_logits(logits: jax.Array, *, temperature, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """The sampling distribution's logits, float32: temperature, then top-k, then top-p."""
    out = apply_temperature(logits.astype(jnp.float32), temperature)
    return top_p_filter(top_k_filter(out, top_k), top_p)


def argmax_last(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (first index of the maximum), as two plain reductions: XLA:CPU runs
    argmax as one variadic (value, index) reduce that does not vectorise (~0.4 ms per decode step for
    32 x 512 logits, 8% of the step; experiments/PERF.md #14). A row with a NaN gives its last index."""
    top = jnp.max(x, axis=-1, keepdims=True)
    idx = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.minimum(jnp.min(jnp.where(x == top, idx, x.shape[-1]), axis=-1), x.shape[-1] - 1)


def sample_categorical(keys_R, logits_RxV: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits), row r using keys_R[r]: the Gumbel-max draw of
    `jax.random.categorical` (same noise, hence the same tokens) with `argmax_last`."""
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logits_RxV.shape[-1:], jnp.float32))(keys_R)
    return argmax_last(gumbel + logits_RxV)


def per_token_temperature(logits_RxV: jax.Array, *, base_temperature, entropy_floor, boost,
                          max_temperature) -> jax.Array:
    """Per-row sampling temperature [R], float32: min(base * boost, max) where the entropy of
    softmax(logits / base) is under the floor, else base. Jittable; the arguments may be traced.

    Why: a row about to collapse onto one token gets a hotter distribution. The sampler divides the logits by
    this temperature and must report logprobs/entropies of that same tempered distribution. base <= 0
    (greedy) gives 0 on every row. Masked logits (-inf) are allowed.
    """
    base = jnp.asarray(base_temperature, jnp.float32)
    safe_base = jnp.where(base > 0, base, 1.0)
    logp = jax.nn.log_softmax(logits_RxV.astype(jnp.float32) / safe_base, axis=-1)
    entropy_R = -jnp.sum(jnp.where(logp > -jnp.inf, jnp.exp(logp) * logp, 0.0), axis=-1)
    hot = jnp.minimum(base * jnp.asarray(boost, jnp.float32), jnp.asarray(max_temperature, jnp.float32))
    return jnp.where(entropy_R < entropy_floor, hot, base)


def logprobs_and_entropy(logits_NxV: jax.Array, tokens_N: jax.Array):
    """log p(token) and the entropy of softmax(logits), float32."""
    logp = jax.nn.log_softmax(logits_NxV.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tokens_N[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.where(logp > NEG_INF / 2, jnp.exp(logp) * logp, 0.0), axis=-1)
    return picked, entropy


# --------------------------------------------------------------------------------------------------
# prompt preparation
# --------------------------------------------------------------------------------------------------

def bucket_length(n: int, minimum: int = 8) -> int:
    """Next power of two >= n (at least `minimum`): the prompt widths the sampler compiles for."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("width", "pad_id"))
def left_align(tokens_BxP: jax.Array, mask_BxP: jax.Array, *, width: int, pad_id: int):
    """Move each row's real tokens flush right in a [B, width] buffer (left padding), keeping their order."""
    mask = mask_BxP.astype(bool)
    b, p = tokens_BxP.shape
    # stable sort putting padding first gives, per row, the source column of each output column
    order = jnp.argsort(mask.astype(jnp.int32), axis=-1, stable=True)
    toks = jnp.take_along_axis(tokens_BxP, order, axis=-1)
    msk = jnp.take_along_axis(mask, order, axis=-1)
    pad = width - p
    toks = jnp.concatenate([jnp.full((b, pad), pad_id, toks.dtype), toks], axis=-1)
    msk = jnp.concatenate([jnp.zeros((b, pad), bool), msk], axis=-1)
    return jnp.where(msk, toks, pad_id).astype(jnp.int32), msk


# --------------------------------------------------------------------------------------------------
# prefill and decode
# --------------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("cfg", "group_size", "max_new_tokens"))
def _prefill(cfg: ModelConfig, params, prompt_BxP, mask_BxP, *, group_size: int, max_new_tokens: int):
    """Prefill each prompt once, then repeat for its G rows: (cache [B*G, P slots; decode grows it], last
    logits [B*G, V], prompt lengths [B*G])."""
    b, p = prompt_BxP.shape
    lengths = jnp.sum(mask_BxP, axis=-1).astype(jnp.int32)
    pos = text_positions(mask_BxP)
    cache = models.init_cache(cfg, b, p, aligned=True)  # left-aligned rows share one write index
    logits, cache = models.forward(cfg, params, prompt_BxP, rope_positions(cfg, pos), attn_mask=mask_BxP,
                                   cache=cache)
    repeat = lambda x: jnp.repeat(x, group_size, axis=0) if x.ndim else x  # noqa: E731
    return jax.tree.map(repeat, (cache, logits[:, -1], lengths))


def row_keys(key: jax.Array, prompt_ids_B: jax.Array, group_size: int) -> jax.Array:
    """[B*G] typed keys: fold_in(fold_in(key, prompt_id), g), row-major over (b, g); `key` typed or legacy."""
    key = as_typed_key(key)
    per_prompt = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, prompt_ids_B)
    per_row = jax.vmap(lambda k: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(k, jnp.arange(group_size)))(per_prompt)
    return per_row.reshape(-1)


@flax.struct.dataclass
class DecodeState:
    """The decode loop's carry for R = B*G rows; T = max_new_tokens, S = cache slots."""

    t: jax.Array  # [] int32: the step about to be taken
    done: jax.Array  # [R] bool: the row has emitted an EOS (it then writes pad / zeros)
    logits: jax.Array  # [R, V] float32 logits of the next token
    cache: dict  # the KV cache (models.init_cache layout), grown per chunk
    tokens: jax.Array  # [R, T] int32 sampled tokens, pad_id where not reached
    logprobs: jax.Array  # [R, T] float32 log p(token) under the distribution sampled from
    entropies: jax.Array  # [R, T] float32 entropy of that distribution
    policy_entropies: jax.Array  # [R, T] float32 entropy of softmax(logits) at T = 1, whatever was sampled
    temperatures: jax.Array  # [R, T] float32 temperature each token was drawn at


@functools.partial(
    jax.jit,
    static_argnames=("cfg", "max_new_tokens", "top_k", "top_p", "eos_ids", "pad_id", "token_temperature",
                     "chunk_ends"),
)
def _decode(cfg: ModelConfig, params, cache, logits0_RxV, start_pos_R, keys_R, temperature, *,
            max_new_tokens: int, top_k: int, top_p: float, eos_ids: tuple, pad_id: int, token_temperature: tuple,
            chunk_ends: tuple | None = None):
    """The decode loops (one per chunk, `decode_chunks`) for R = B*G rows: {tokens, completion_mask,
    logprobs, entropies, policy_entropies, temperatures, policy_mask: [R, T]; lengths, truncated: [R]}
    (`_finish`). The prompt cache comes in with P slots and is grown before each chunk; inside a loop it is
    carried state that XLA updates in place."""
    r, t_max = logits0_RxV.shape[0], max_new_tokens
    if cfg.tie_embeddings:  # a [D, V] copy of the tied head, made once: the per-step logits matmul then
        # reads it row-major instead of through a transpose (242 -> 155 us per step here, experiments/PERF.md #15)
        params = dict(params, lm_head=params["embed"].T)
        cfg = cfg.replace(tie_embeddings=False)
    eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)

    def row_temperatures(logits):
        if not token_temperature:
            return jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (r,))
        floor, boost, t_hi = token_temperature
        return per_token_temperature(logits, base_temperature=temperature, entropy_floor=floor, boost=boost,
                                     max_temperature=t_hi)

    def body(s: DecodeState) -> DecodeState:
        t, done = s.t, s.done
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_R, t)
        temp_R = row_temperatures(s.logits)
        greedy = (temp_R <= 0)[:, None]
        dist = process_logits(s.logits, temperature=temp_R[:, None], top_k=top_k, top_p=top_p)
        sampled = sample_categorical(step_keys, dist)
        token = jnp.where(greedy[:, 0], argmax_last(s.logits), sampled).astype(jnp.int32)
        lp, ent = logprobs_and_entropy(jnp.where(greedy, s.logits.astype(jnp.float32), dist), token)
        policy_ent = models.token_entropy(s.logits.astype(jnp.float32))  # the policy's own, at T = 1
        token = jnp.where(done, pad_id, token)
        pos = rope_positions(cfg, (start_pos_R + t)[:, None])
        logits, cache = models.forward(cfg, params, token[:, None], pos, attn_mask=~done[:, None], cache=s.cache)
        return DecodeState(
            t=t + 1, done=done | jnp.isin(token, eos), logits=logits[:, 0], cache=cache,
            tokens=s.tokens.at[:, t].set(token), logprobs=s.logprobs.at[:, t].set(jnp.where(done, 0.0, lp)),
            entropies=s.entropies.at[:, t].set(jnp.where(done, 0.0, ent)),
            policy_entropies=s.policy_entropies.at[:, t].set(jnp.where(done, 0.0, policy_ent)),
            temperatures=s.temperatures.at[:, t].set(temp_R))

    state = DecodeState(
        t=jnp.int32(0), done=jnp.zeros((r,), bool), logits=logits0_RxV, cache=cache,
        tokens=jnp.full((r, t_max), pad_id, jnp.int32), logprobs=jnp.zeros((r, t_max), jnp.float32),
        entropies=jnp.zeros((r, t_max), jnp.float32), policy_entropies=jnp.zeros((r, t_max), jnp.float32),
        temperatures=jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (r, t_max)))
    prompt_slots = cache["mask"].shape[1]
    # each chunk's cache holds the slots it can fill, no more; chunk_ends=(T,) is one loop over the full cache, the
    # largest of them, which is what grpo_jax.aot compiles to size a rollout without compiling every chunk
    for end in chunk_ends or decode_chunks(t_max):
        state = state.replace(cache=models.grow_cache(state.cache, prompt_slots + end))
        cond = lambda s, end=end: (s.t < end) & ~jnp.all(s.done)  # noqa: E731
        state = jax.lax.while_loop(cond, body, state)
    return _finish(state, eos)


def decode_chunks(max_new_tokens: int, max_chunks: int = 8, min_chunk: int = 32) -> list[int]:
    """End step of each decode chunk: up to `max_chunks` equal chunks of at least `min_chunk` steps. More
    chunks skip more empty cache slots (attention reads (1 + 1/n) / 2 of the full cache on average over n
    chunks) but compile more loop bodies (experiments/PERF.md: 4 x 32 for T = 128, 8 x 64 for T = 512)."""
    n = max(1, min(max_chunks, max_new_tokens // min_chunk))
    size = -(-max_new_tokens // n)
    return [min(max_new_tokens, size * (i + 1)) for i in range(n)]


def _finish(state: DecodeState, eos) -> dict[str, jax.Array]:
    """The decoded rows by name: masks, lengths and truncation flags from the token buffer, and the
    per-token figures masked to the completion."""
    is_eos = jnp.isin(state.tokens, eos)
    t_max = state.tokens.shape[1]
    first_eos = jnp.where(is_eos.any(-1), jnp.argmax(is_eos, axis=-1), t_max)
    lengths = jnp.minimum(first_eos + 1, t_max).astype(jnp.int32)
    mask = (jnp.arange(t_max)[None, :] < lengths[:, None]).astype(jnp.int32)
    return {"tokens": state.tokens, "completion_mask": mask, "logprobs": state.logprobs * mask,
            "entropies": state.entropies * mask, "policy_entropies": state.policy_entropies * mask,
            "lengths": lengths, "truncated": ~is_eos.any(-1), "temperatures": state.temperatures,
            "policy_mask": jnp.ones(state.tokens.shape, bool)}  # one turn: the policy drew every token


def sample_core(cfg: ModelConfig, params, prompt_tokens, prompt_mask, prompt_ids, *, key, group_size: int,
                max_new_tokens: int, temperature=1.0, top_k: int = 0, top_p: float = 1.0, eos_ids=(),
                pad_id: int = 0, token_temperature=None, chunk_ends: tuple | None = None) -> Rollout:
    """`sample` for already left-aligned, bucketed prompts and explicit global prompt indices [B]; chunk_ends:
    `_decode`'s (None: `decode_chunks`)."""
    key = as_typed_key(key)
    cache, last_logits, lengths = _prefill(cfg, params, prompt_tokens, prompt_mask, group_size=group_size,
                                           max_new_tokens=max_new_tokens)
    keys = row_keys(key, prompt_ids, group_size)
    outs = _decode(cfg, params, cache, last_logits, lengths, keys, jnp.asarray(temperature, jnp.float32),
                   max_new_tokens=max_new_tokens, top_k=int(top_k), top_p=float(top_p),
                   eos_ids=tuple(int(e) for e in eos_ids), pad_id=int(pad_id),
                   token_temperature=tuple(float(x) for x in token_temperature or ()), chunk_ends=chunk_ends)
    b = prompt_tokens.shape[0]
    rows = {name: x.reshape((b, group_size) + x.shape[1:]) for name, x in outs.items()}
    return Rollout(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, **rows)


def _check_args(prompt_tokens, prompt_mask, group_size, max_new_tokens, temperature, top_k, top_p):
    if prompt_tokens.ndim != 2 or prompt_tokens.shape != prompt_mask.shape:
        raise ValueError(f"prompt_tokens and prompt_mask must both be [B, P], got {prompt_tokens.shape} "
                         f"and {prompt_mask.shape}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not isinstance(temperature, jax.Array) and temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def prepare_prompts(prompt_tokens, prompt_mask, *, pad_id: int = 0):
    """Left-align and bucket prompts: ([B, P_bucket] int32 tokens, [B, P_bucket] bool mask)."""
    width = bucket_length(prompt_tokens.shape[1])
    return left_align(jnp.asarray(prompt_tokens), jnp.asarray(prompt_mask), width=width, pad_id=pad_id)


def row_shard_axes(prompt_tokens, params):
    """The mesh and the axes that split the prompt rows, when `sample` can give each device its own
    decode loop: prompts are a committed array sharded on dim 0 over axes of total size > 1 and every param
    is fully replicated. Else None (one device, or params sharded over fsdp/tensor: the SPMD path)."""
    shard = getattr(prompt_tokens, "sharding", None) if not isinstance(prompt_tokens, jax.core.Tracer) else None
    if not isinstance(shard, jax.sharding.NamedSharding) or not shard.spec or shard.spec[0] is None:
        return None
    axes = shard.spec[0] if isinstance(shard.spec[0], tuple) else (shard.spec[0],)
    size = 1
    for a in axes:
        size *= shard.mesh.shape[a]
    if size == 1 or prompt_tokens.shape[0] % size:
        return None
    for leaf in jax.tree.leaves(params):
        if isinstance(leaf, jax.core.Tracer) or not getattr(leaf, "sharding", None) or \
                not leaf.sharding.is_fully_replicated:
            return None
    return shard.mesh, axes


@functools.lru_cache(maxsize=64)
def _row_sharded(cfg: ModelConfig, mesh, axes: tuple, static: tuple):
    """`sample_core` under shard_map over `axes`: each device decodes its own rows in its own loops, so
    the early-stop test (all rows done?) is local and the devices never wait for each other per token
    (the SPMD path all-reduces it every step; experiments/PERF.md #12). Cached: one compile per (shapes,
    statics)."""
    kw = dict(static)

    def local(params, tokens, mask, ids, key, temperature):
        return sample_core(cfg, params, tokens, mask, ids, key=key, temperature=temperature, **kw)

    rows = P(axes)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), rows, rows, rows, P(), P()), out_specs=rows,
                                 check_vma=False))


def sample(cfg: ModelConfig, params, prompt_tokens, prompt_mask, *, key, group_size: int, max_new_tokens: int,
           temperature=1.0, top_k: int = 0, top_p: float = 1.0, eos_ids=(), pad_id: int = 0,
           token_temperature: tuple[float, float, float] | None = None) -> Rollout:
    """G completions for each of the B prompts (any padding side). Runs wherever `params` live: on one
    device; with prompts sharded over a mesh's data axes and params replicated, one decode loop per device
    (`shard_map`); with params sharded over other axes, under jit as one SPMD program (computation follows
    the input shardings). All three give the same tokens for the same key.

    temperature may be a traced scalar (adaptive temperature never recompiles). token_temperature =
    (entropy_floor, boost, max_temperature) turns on the per-token variant: a position whose distribution
    at `temperature` has entropy under the floor is sampled at min(temperature * boost, max) instead; the
    logprobs are those of the distribution actually used and `Rollout.temperatures` records it."""
    _check_args(prompt_tokens, prompt_mask, group_size, max_new_tokens, temperature, top_k, top_p)
    key = as_typed_key(key)
    split = row_shard_axes(prompt_tokens, params)
    tokens, mask = prepare_prompts(prompt_tokens, prompt_mask, pad_id=pad_id)
    ids = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    static = dict(group_size=group_size, max_new_tokens=max_new_tokens, top_k=int(top_k), top_p=float(top_p),
                  eos_ids=tuple(int(e) for e in eos_ids), pad_id=int(pad_id),
                  token_temperature=tuple(float(x) for x in token_temperature or ()) or None)
    if split is None:
        return sample_core(cfg, params, tokens, mask, ids, key=key, temperature=temperature, **static)
    mesh, axes = split
    fn = _row_sharded(cfg, mesh, axes, tuple(sorted(static.items())))
    return fn(params, tokens, mask, ids, key, jnp.asarray(temperature, jnp.float32))


def sample_pmap(cfg: ModelConfig, params, prompt_tokens, prompt_mask, *, key, group_size: int,
                max_new_tokens: int, temperature=1.0, top_k: int = 0, top_p: float = 1.0, eos_ids=(),
                pad_id: int = 0, devices=None) -> Rollout:
    """`sample` with the prompts split over local devices by `pmap` (each group whole on one device).

    B must be a multiple of the device count. Keys use global prompt indices, so the tokens equal
    the single-device sampler's for the same key.
    """
    _check_args(prompt_tokens, prompt_mask, group_size, max_new_tokens, temperature, top_k, top_p)
    key = as_typed_key(key)
    devices = jax.local_devices() if devices is None else devices
    n = len(devices)
    tokens, mask = prepare_prompts(prompt_tokens, prompt_mask, pad_id=pad_id)
    b = tokens.shape[0]
    if b % n:
        raise ValueError(f"sample_pmap: {b} prompts do not split over {n} devices")
    ids = jnp.arange(b, dtype=jnp.int32)
    static = dict(group_size=group_size, max_new_tokens=max_new_tokens, top_k=int(top_k), top_p=float(top_p),
                  eos_ids=tuple(int(e) for e in eos_ids), pad_id=int(pad_id))
    split = lambda x: x.reshape((n, b // n) + x.shape[1:])  # noqa: E731
    fn = _pmapped(cfg, tuple(devices), tuple(sorted(static.items())))
    out = fn(params, split(tokens), split(mask), split(ids), key, jnp.asarray(temperature, jnp.float32))
    return jax.tree.map(lambda x: x.reshape((b,) + x.shape[2:]), out)


@functools.lru_cache(maxsize=64)
def _pmapped(cfg: ModelConfig, devices: tuple, static: tuple):
    """`sample_core` pmapped over `devices`, built once per (config, devices, statics): a fresh closure per
    call would miss pmap's cache and recompile every rollout (5.3 s instead of 0.6 s, experiments/PERF.md #13)."""
    kw = dict(static)

    def per_device(p, tok, msk, pid, key, temperature):
        return sample_core(cfg, p, tok, msk, pid, key=key, temperature=temperature, **kw)

    return jax.pmap(per_device, in_axes=(None, 0, 0, 0, None, None), devices=devices)
