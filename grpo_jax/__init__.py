"""grpo-jax: GRPO post-training in JAX (verifiable rewards, advantages, losses, diagnostics)."""
