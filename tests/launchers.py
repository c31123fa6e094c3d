"""The experiment launchers (`experiments/*.py`, `experiments/bench/*.py`) as modules, for the tests that call
their functions: they are scripts, not a package, so each is loaded from its path."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def load_launcher(name: str):
    """experiments/<name>.py as a module, loaded once (name may hold a folder: "bench/peer_trl")."""
    path = os.path.join(ROOT, "experiments", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"experiments_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (and pickling) look a class's module up by name
    spec.loader.exec_module(module)
    return module
