"""The dependency rules: wisp.core imports nothing from the engine, models, server, trace, plan or CLI;
wisp.plan may import the core (and config, models, trace), never the engine, server, CLI or bench."""

from __future__ import annotations

import ast
from pathlib import Path

import wisp.core
import wisp.plan

ALLOWED = ("wisp.core", "wisp.errors")
PLAN_FORBIDDEN = ("wisp.engine", "wisp.server", "wisp.cli", "wisp.bench")
# imports in wisp/plan/commands.py that other refactors of issue 11 move away (parse_size to the
# argument helpers, model_source to wisp.models); drop an entry once its import is gone
PLAN_PENDING = {("commands.py", "wisp.cli")}


def wisp_imports(package) -> list[tuple[str, str]]:
    """(file name, imported wisp module) for every import statement in the package's own files."""
    found = []
    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [(path.name, name) for name in names if name.startswith("wisp")]
    return found


def test_core_imports_only_core():
    for file, name in wisp_imports(wisp.core):
        assert name.startswith(ALLOWED), f"{file} imports {name}"


def test_plan_imports_no_engine_server_cli_or_bench():
    for file, name in wisp_imports(wisp.plan):
        if (file, name) in PLAN_PENDING:
            continue
        assert not any(name == m or name.startswith(m + ".") for m in PLAN_FORBIDDEN), f"plan/{file} imports {name}"
