"""The dependency rule: wisp.core imports nothing from the engine, models, server, trace or CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import wisp.core

ALLOWED = ("wisp.core", "wisp.errors")


def test_core_imports_only_core():
    for path in Path(wisp.core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("wisp"):
                    assert name.startswith(ALLOWED), f"{path.name} imports {name}"
