"""Settings for every test process: a persistent XLA compilation cache shared by the test processes and the
subprocesses they start (the suite compiles the same small programs many times), the CPU as the platform,
and the host allocator setting the launchers use (grpo_jax.perf.tune_host_allocator)."""

import os
import tempfile

_CACHE = os.path.join(tempfile.gettempdir(), "grpo-jax-test-xla-cache")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# the TPU compiler is installed for tests/test_aot.py, which compiles for described topologies; no TPU is
# attached, so every test process skips jax's TPU probe (~2 s and a page of libtpu warnings) and runs on the CPU
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from grpo_jax.perf import tune_host_allocator  # noqa: E402

tune_host_allocator()
