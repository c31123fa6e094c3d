"""The runner as one source string. The sandboxed interpreter starts as `python -S -s [-P] -c SOURCE`
and cannot import this package (no site-packages; Landlock lets it read only the stdlib and the allowed
packages), so `sandbox.py` hands it the runner's modules concatenated in dependency order, each without
its imports of the others: in the bundle they share one namespace, as a single file's functions do.

For the package and the bundle to run the same code, the modules import each other only as
`from .module import name, ...` on lines of their own at their top level, from modules earlier in
MODULES, naming what that module defines; never the package by its absolute name; and no two modules
bind one name differently (the shared namespace would silently keep the later one). `bundle` checks all
of it and raises BundleError otherwise.
"""

from __future__ import annotations

import ast
from pathlib import Path

MODULES = ("job", "wire", "context", "confine", "solution", "judge", "entry")  # dependencies first; `entry` runs main()
_HERE = Path(__file__).parent
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_SCOPES = (*_DEFINITIONS, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)  # own namespaces


class BundleError(ValueError):
    """A runner module that cannot be bundled as it is written."""


def bundle(modules: tuple[str, ...] = MODULES, directory: Path = _HERE) -> str:
    """The modules' source in order, each under a `# ---- <name>.py` line, without its package imports."""
    bindings: dict[str, tuple[str, str]] = {}  # name -> (module, what binds it: "defined" or the import)
    parts = []
    for module in modules:
        text = (directory / f"{module}.py").read_text(encoding="utf-8")
        tree = ast.parse(text, f"{module}.py")
        lines = text.splitlines(keepends=True)
        package_imports = _package_imports(module, tree, lines, bindings)
        _bind(module, tree, bindings)
        dropped = {n for node in package_imports for n in range(node.lineno, node.end_lineno + 1)}
        kept = "".join(line for number, line in enumerate(lines, 1) if number not in dropped)
        parts.append(f"# ---- {module}.py\n{kept}")
    return "\n\n".join(parts)


def _package_imports(module: str, tree: ast.Module, lines: list[str], bindings: dict) -> list[ast.ImportFrom]:
    """The module's `from .other import ...` statements, checked against what earlier modules bound."""
    found = []
    for node in ast.walk(tree):
        where = f"{module}.py:{getattr(node, 'lineno', 0)}"
        refused = _refused_import(node)
        if refused:
            raise BundleError(f"{where}: {refused}")
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        if node not in tree.body or node.level != 1 or _shares_a_line(node, lines):
            raise BundleError(f"{where}: a package import must be `from .module import ...` on lines of its own")
        for alias in node.names:
            if alias.asname is not None or bindings.get(alias.name) != (node.module, "defined"):
                raise BundleError(f"{where}: {alias.name!r} as imported is no name that a module before it defines")
        found.append(node)
    return found


def _refused_import(node: ast.AST) -> str | None:
    """Why `node` cannot be bundled, if it is an absolute import of this package (the sandbox has no
    access to it) or from __future__ (only a file's first statement may be one)."""
    if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "grpo_jax" for a in node.names):
        return "imports the package by its name, which the sandbox cannot"
    if isinstance(node, ast.ImportFrom) and not node.level:
        top = (node.module or "").split(".")[0]
        if top == "grpo_jax":
            return "imports the package by its name, which the sandbox cannot"
        if top == "__future__":
            return "imports from __future__, which only the bundle's first statement could"
    return None


def _shares_a_line(node: ast.stmt, lines: list[str]) -> bool:
    rest = lines[node.end_lineno - 1].encode()[node.end_col_offset :].decode().strip()
    return node.col_offset != 0 or not (rest == "" or rest.startswith("#"))


def _bind(module: str, tree: ast.Module, bindings: dict) -> None:
    """Record the names the module binds at its top level; a name bound before to something else is an error."""
    for name, what in _top_level_bindings(tree):
        earlier = bindings.get(name)
        if earlier is not None and (what == "defined" or earlier[1] != what) and earlier[0] != module:
            raise BundleError(f"{module}.py binds {name!r}, as {earlier[0]}.py does: the bundle has one namespace")
        bindings[name] = (module, what)


def _top_level_bindings(tree: ast.Module) -> list[tuple[str, str]]:
    """(name, "defined" | "import <what>") for each name the module binds in its own namespace: its
    definitions, assignments and absolute imports (its package imports bind what the bundle already has),
    and the names a function declares `global`."""
    found, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found += [((a.asname or a.name).split(".")[0], f"import {a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found += [(a.asname or a.name, f"from {node.module} import {a.name}") for a in node.names]
        elif isinstance(node, _DEFINITIONS):
            found.append((node.name, "defined"))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.append((node.id, "defined"))
        elif not isinstance(node, (*_SCOPES, ast.ImportFrom)):
            stack.extend(ast.iter_child_nodes(node))
    found += [(name, "defined") for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names]
    return found
