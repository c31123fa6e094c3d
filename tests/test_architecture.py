"""The module map in docs/architecture.md is the code's: every import of the package points down its floors
table (no circle, no arrow up or sideways), and every module is placed on a floor."""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# sub-packages that count as one module of the map
UNITS = ("grpo_jax.rewards", "grpo_jax.tasks")


def floors(text: str) -> dict[str, int]:
    """{unit: floor} from the doc's table rows `| N | `a`, `b` | ... |` (grpo_jax modules by short name)."""
    out = {}
    for number, modules in re.findall(r"^\| (\d+) \| ([^|]+) \|", text, flags=re.M):
        for name in re.findall(r"`([a-z_]+)`", modules):
            out[name if name == "models" else f"grpo_jax.{name}"] = int(number)
    return out


def unit(module: str) -> str:
    """The map's unit a dotted module name belongs to ("" for anything outside the package and models)."""
    if module == "models" or module.startswith("models."):
        return "models"
    for u in UNITS:
        if module == u or module.startswith(u + "."):
            return u
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "grpo_jax" else ""


def package_modules() -> dict[str, str]:
    """{dotted name: path} of every .py file in grpo_jax/ and models/."""
    out = {}
    for top in ("grpo_jax", "models"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel.removesuffix(".__init__")] = os.path.join(folder, f)
    return out


def imports(path: str, module: str) -> set[str]:
    """Dotted names a file imports (module level and inside functions; `from a import b` counts as a.b)."""
    out = set()
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def arrows(modules: dict[str, str]) -> set[tuple[str, str]]:
    """(importer unit, imported unit) pairs across units."""
    found = set()
    for module, path in modules.items():
        src = unit(module)
        for name in imports(path, module):
            dst = unit(name)
            if dst and dst != src:
                found.add((src, dst))
    return found


def test_floors_parser_and_unit_on_a_hand_written_table():
    table = "| floor | modules |\n|---|---|\n| 1 | `train` | the loop |\n| 2 | `update`, `build` | x |\n| 3 | `models` | y |\n"
    assert floors(table) == {"grpo_jax.train": 1, "grpo_jax.update": 2, "grpo_jax.build": 2, "models": 3}
    assert unit("grpo_jax.rewards.math") == "grpo_jax.rewards" and unit("models.lora") == "models"
    assert unit("grpo_jax.update") == "grpo_jax.update" and unit("numpy") == ""


def test_every_import_points_down_the_documented_floors():
    level = floors(open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read())
    modules = package_modules()
    unplaced = sorted({unit(m) for m in modules} - set(level) - {"grpo_jax"})
    assert not unplaced, f"modules missing from docs/architecture.md's floors table: {unplaced}"
    bad = sorted(f"{a} (floor {level[a]}) imports {b} (floor {level[b]})"
                 for a, b in arrows(modules) if a in level and b in level and level[b] <= level[a])
    assert not bad, "imports that do not point down docs/architecture.md's floors:\n" + "\n".join(bad)


@pytest.mark.parametrize("arrow", [("grpo_jax.update", "grpo_jax.train"), ("grpo_jax.export", "grpo_jax.train")])
def test_the_check_sees_an_upward_arrow(arrow, tmp_path):
    """An import added against the floors (the pure update reaching into the loop) is caught."""
    src, dst = arrow
    level = floors(open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read())
    fake = tmp_path / "m.py"
    fake.write_text(f"from {dst} import Trainer\n")
    found = {(src, unit(n)) for n in imports(str(fake), src)}
    assert any(level[b] <= level[a] for a, b in found)
