"""The runner's modules and their bundle (grpo_jax/rewards/sandbox_runner/bundle.py): the sandboxed
interpreter gets one `python -c` source, the modules concatenated in dependency order without their
imports of each other. The package form and the bundle must be the same code: every global a module uses
is its own, imported from a module before it, or a builtin; the bundle refuses whatever would make the
two differ; and the bundle runs a program."""

import ast
import builtins
import os
import subprocess
import symtable
import sys
from pathlib import Path

import pytest

from grpo_jax.rewards import sandbox
from grpo_jax.rewards.sandbox_runner import bundle as bundler
from grpo_jax.rewards.sandbox_runner import job

PACKAGE = Path(bundler.__file__).parent
ARG_MAX_STRLEN = 32 * 4096  # Linux's limit on one command-line argument (4 KiB pages)


def test_the_bundle_is_every_module_in_order_without_package_imports():
    source = bundler.bundle()
    heads = [source.index(f"# ---- {name}.py\n") for name in bundler.MODULES]
    assert heads == sorted(heads) and heads[0] == 0
    assert "from ." not in source and "grpo_jax" not in source
    assert source.endswith('\n\nif __name__ == "__main__":\n    main()\n')  # the last module runs the harness
    assert sandbox._RUNNER_SOURCE == source
    compile(source, "<bundle>", "exec")
    assert len(source.encode()) < ARG_MAX_STRLEN  # it travels as one argument of `python -c`
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted([*bundler.MODULES, "__init__", "bundle"])


def test_the_bundle_defines_every_top_level_name_of_every_module():
    namespace = {"__name__": "bundle"}  # not "__main__": main() does not run
    exec(compile(bundler.bundle(), "<bundle>", "exec"), namespace)
    for name in bundler.MODULES:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert defined <= set(namespace), name


@pytest.mark.parametrize("name", bundler.MODULES)
def test_each_module_uses_only_its_own_names_earlier_modules_and_builtins(name):
    """So the package's modules (imported by the wire tests) are the code the bundle runs."""
    text = (PACKAGE / f"{name}.py").read_text()
    bound = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)

    def globals_used(table):
        module = table.get_type() == "module"
        used = {s.get_name() for s in table.get_symbols() if s.is_referenced() and (module or s.is_global())}
        return used.union(*(globals_used(child) for child in table.get_children()))

    used = globals_used(symtable.symtable(text, name, "exec"))
    assert sorted(n for n in used - bound if not hasattr(builtins, n) and n != "__name__") == []


def write(tmp_path, **modules):
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    return tuple(modules)


def test_package_imports_are_stripped_and_other_lines_kept(tmp_path):
    names = write(tmp_path, a="import os\nX = 1\n", b="import os\nfrom .a import (\n    X,\n)  # c\n\nY = X + 1\n")
    source = bundler.bundle(names, tmp_path)
    assert source == "# ---- a.py\nimport os\nX = 1\n\n\n# ---- b.py\nimport os\n\nY = X + 1\n"
    namespace = {}
    exec(source, namespace)
    assert namespace["Y"] == 2


BROKEN = {
    "imports a later module": ({"a": "from .b import X\n", "b": "X = 1\n"}, "no name that a module before it defines"),
    "imports an undefined name": ({"a": "X = 1\n", "b": "from .a import Y\n"}, "'Y' as imported"),
    "imports an import": ({"a": "import os\n", "b": "from .a import os\n"}, "'os' as imported"),
    "aliases": ({"a": "X = 1\n", "b": "from .a import X as Z\n"}, "'X' as imported"),
    "star": ({"a": "X = 1\n", "b": "from .a import *\n"}, "'\\*' as imported"),
    "the package": ({"a": "X = 1\n", "b": "from . import a\n"}, "no name that a module before it defines"),
    "nested import": ({"a": "X = 1\n", "b": "def f():\n    from .a import X\n"}, "lines of its own"),
    "two levels": ({"a": "X = 1\n", "b": "from ..a import X\n"}, "lines of its own"),
    "shared line": ({"a": "X = 1\n", "b": "from .a import X; Y = X\n"}, "lines of its own"),
    "absolute import": ({"a": "import grpo_jax.rewards\n"}, "by its name"),
    "absolute from": ({"a": "def f():\n    from grpo_jax.rewards import sandbox\n"}, "by its name"),
    "future": ({"a": "from __future__ import annotations\n"}, "__future__"),
    "two definitions": ({"a": "def f():\n    pass\n", "b": "f = 2\n"}, "binds 'f', as a.py does"),
    "import over a definition": ({"a": "os = 1\n", "b": "import os\n"}, "binds 'os', as a.py does"),
    "two imports": ({"a": "import os.path as p\n", "b": "import sys as p\n"}, "binds 'p', as a.py does"),
    "a global": ({"a": "X = 1\n", "b": "def f():\n    global X\n    X = 2\n"}, "binds 'X', as a.py does"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_what_would_make_the_bundle_differ_from_the_package_is_refused(tmp_path, case):
    modules, message = BROKEN[case]
    with pytest.raises(bundler.BundleError, match=message):
        bundler.bundle(write(tmp_path, **modules), tmp_path)


@pytest.mark.parametrize("dropped", bundler.MODULES[:-1])
def test_a_bundle_without_one_of_the_modules_is_refused(dropped):
    with pytest.raises(bundler.BundleError):
        bundler.bundle(tuple(m for m in bundler.MODULES if m != dropped))


def test_the_bundle_runs_a_program_in_a_bare_interpreter(tmp_path):
    """No sandbox layers: only that `python -S -s -c <bundle>` reads its job, sets limits and runs the role."""
    limits = {"cpu_s": 5, "memory_bytes": 1 << 30, "max_processes": 4096, "max_file_bytes": 1 << 20, "max_open_files": 64}
    request = {"role": "script", "program": "import sys\nprint(sys.argv, input()[::-1])\n", "layers": {}, "limits": limits,
               "read_paths": [], "packages": {}}  # fmt: skip
    job_file = tmp_path / "job"
    job_file.write_bytes(job.dump_job(request))
    with open(job_file, "rb") as f:
        args = [sys.executable, "-S", "-s", "-c", bundler.bundle(), str(f.fileno()), "-1", "-1", "-1"]
        result = subprocess.run(args, input=b"abc\n", capture_output=True, pass_fds=(f.fileno(),), cwd=tmp_path,
                                env={"PYTHONHASHSEED": "0"}, timeout=60)  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (0, b"['solution.py'] cba\n", b"")


def test_a_setup_failure_exits_121_with_the_layer_named(tmp_path):
    request = {"role": "script", "program": "print('ran')", "layers": {}, "limits": {"cpu_s": 1}}  # no other limit
    job_file = tmp_path / "job"
    job_file.write_bytes(job.dump_job(request))
    fd = os.open(job_file, os.O_RDONLY)
    try:
        args = [sys.executable, "-S", "-s", "-c", bundler.bundle(), str(fd), "-1", "-1", "-1"]
        result = subprocess.run(args, capture_output=True, pass_fds=(fd,), cwd=tmp_path, timeout=60)
    finally:
        os.close(fd)
    assert result.returncode == job.SETUP_FAILED and result.stdout == b""
    assert result.stderr.startswith(b"sandbox_setup_failed:unknown:KeyError('memory_bytes')")
