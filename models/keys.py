"""PRNG keys of both kinds: every public function that takes a `key` accepts a typed key (`jax.random.key(s)`)
and a legacy raw key (`jax.random.PRNGKey(s)`, uint32[2] under the default threefry implementation), and
turns it into a typed key at its entry with `as_typed_key`.

Why: a legacy key is an array with a trailing data axis, so code written for typed keys (scalar-shaped,
vmapped or reshaped by row) silently mixes that axis with the batch axes; the sampler's per-row keys were
`reshape(-1)`-ed into 2 * R scalars and the decode loop died with "invalid PRNG key data". Both kinds hold
the same bits, so `jax.random.key(s)` and `jax.random.PRNGKey(s)` give the same draws.

Lives in `models` (which never imports `grpo_jax`) so both packages can use it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_typed_key(key) -> bool:
    """True for a typed key array (dtype key<impl>), False for raw key data (uint32[..., n])."""
    return jnp.issubdtype(getattr(key, "dtype", jnp.uint32), jax.dtypes.prng_key)


def as_typed_key(key) -> jax.Array:
    """`key` as a typed key array: returned as is when already typed; raw key data (uint32[..., 2] for the
    default threefry implementation, any leading batch shape) wrapped with `jax.random.wrap_key_data` under
    the default implementation, which keeps its bits (so the draws are unchanged). Works under jit."""
    if is_typed_key(key):
        return key
    return jax.random.wrap_key_data(jnp.asarray(key))
