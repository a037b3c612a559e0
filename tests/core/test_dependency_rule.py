"""The dependency rules: wisp.core imports nothing from the engine, models, server, trace or CLI; the
modules that define the command line's arguments import neither torch nor the engine (so `wisp --help`
stays instant: tests/test_cli_args.py checks the whole import closure in a fresh interpreter)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import wisp.core

ALLOWED = ("wisp.core", "wisp.errors")

WISP = Path(wisp.core.__file__).parent.parent
# module file -> the only modules (and their submodules) it may import, besides the standard library
ARGUMENT_MODULES = {
    "cli_args.py": (),
    "plan_args.py": ("wisp.cli_args", "wisp.models.presets"),
    "bench/args.py": ("wisp.cli_args",),
    "cli.py": ("wisp.cli_args", "wisp.plan_args", "wisp.bench.args", "wisp.errors"),
}
# what a module-level import in those files must never name
HEAVY = ("torch", "numpy", "triton", "transformers", "fastapi", "uvicorn", "wisp.engine", "wisp.core", "wisp.planner",
         "wisp.config")


def imported_names(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def module_level_imports(tree: ast.Module) -> list[str]:
    """Imports run when the module is imported (not those inside functions, which run on use)."""
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return imported_names(ast.Module(body=top, type_ignores=[]))


def test_core_imports_only_core():
    for path in Path(wisp.core.__file__).parent.glob("*.py"):
        for name in imported_names(ast.parse(path.read_text())):
            if name.startswith("wisp"):
                assert name.startswith(ALLOWED), f"{path.name} imports {name}"


@pytest.mark.parametrize("file, allowed", ARGUMENT_MODULES.items())
def test_argument_modules_import_no_torch(file, allowed):
    for name in module_level_imports(ast.parse((WISP / file).read_text())):
        assert not name.startswith(HEAVY), f"wisp/{file} imports {name}"
        if name.startswith("wisp"):
            assert name.startswith(allowed), f"wisp/{file} imports {name}"
