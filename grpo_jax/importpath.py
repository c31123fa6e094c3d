"""Objects named by an import path, `package.module:attribute`: how a config names a researcher's own reward
or task without editing this package. The path is stored in config.json, so a resumed run, a rollback or
an export imports it again in its own process, exactly as it looks up a built-in by name.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_import_path(name: str) -> bool:
    """Whether `name` is meant as an import path (it has a colon; built-in names never do)."""
    return isinstance(name, str) and ":" in name


def load(path: str) -> Any:
    """The object `package.module:attribute` names (the attribute may be dotted, `module:Class.factory`).

    Every failure is a one-line ValueError naming the path: a malformed path, a module that is not on the
    Python path, a module whose own import fails, an attribute the module does not have."""
    if not _PATH.match(path):
        raise ValueError(f"{path!r} is not an import path of the form package.module:function")
    module_name, attribute = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ValueError(f"{path!r}: no module named {e.name!r} on the Python path (put the folder holding "
                             "it on PYTHONPATH, or run from that folder)") from e
        raise ValueError(f"{path!r}: importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001 - the user's module: any error in it is reported as one line
        raise ValueError(f"{path!r}: importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    obj: Any = module
    for i, part in enumerate(attribute.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attribute.split('.')[:i])}"
            raise ValueError(f"{path!r}: {owner!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj
