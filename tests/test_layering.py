"""The import rules of docs/architecture.md, checked on every import statement under wisp/.

1. Layers: a package imports only from its own layer and the layers below it
   (0 errors, options, cli_args; 1 core; 2 config, models, trace; 3 plan; 4 engine; 5 server, bench, sim,
   integrations; 6 cli).
   So the core (pager, kernels) never reaches the engine, server or CLI, planning never the engine, and the
   research simulators (sim, which replay the engine's split controller) are reached by nothing below them.
2. The core imports nothing but itself and `wisp.errors`, so other front ends can reuse it alone. Inside it
   the rooms go down too: bank keys; kernels; learners (online estimates); experts (residency, miss policies,
   the pager and the stores), so the kernels never reach a store and a learner never a policy.
3. The modules that define the command line's arguments import neither torch nor the engine at module
   level, so `wisp --help` stays instant (tests/test_cli_args.py checks the whole import closure).
4. Through everything it imports, at any depth: `wisp.config` reaches no `wisp.models` module (families
   parse checkpoint configs, the config only holds them), and no `wisp.models` module reaches the engine,
   the server or the CLI.
5. Other engines' front ends (`wisp.integrations`) are imported by nothing else in wisp, and only the vLLM
   plug-in's package imports vllm (its entry point loads it; wisp proper never does).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WISP = Path(__file__).resolve().parent.parent / "wisp"
LAYERS = {
    "wisp.errors": 0, "wisp.options": 0, "wisp.cli_args": 0,
    "wisp.core": 1,
    "wisp.config": 2, "wisp.models": 2, "wisp.trace": 2,
    "wisp.plan": 3,
    "wisp.engine": 4,
    "wisp.server": 5, "wisp.bench": 5, "wisp.sim": 5, "wisp.integrations": 5,
    "wisp.cli": 6, "wisp.__main__": 6, "wisp": 6,  # wisp/__init__.py re-exports the engine's API lazily
}
# module file -> the only wisp modules (and their submodules) it may import at module level
ARGUMENT_MODULES = {
    "cli_args.py": ("wisp.options",),
    "plan/args.py": ("wisp.cli_args", "wisp.models.presets"),
    "sim/args.py": ("wisp.cli_args", "wisp.plan.args"),
    "bench/args.py": ("wisp.cli_args",),
    "cli.py": ("wisp.cli_args", "wisp.plan.args", "wisp.sim.args", "wisp.bench.args", "wisp.errors", "wisp.options"),
}
HEAVY = ("torch", "numpy", "triton", "transformers", "fastapi", "uvicorn", "wisp.engine", "wisp.core", "wisp.config")


def module_of(path: Path) -> str:
    parts = path.relative_to(WISP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer of a wisp module: its longest listed prefix."""
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


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
    return imported_names(ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))],
                                     type_ignores=[]))


SOURCES = sorted(WISP.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_of(path))  # raises if no listed package owns it


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(WISP)))
def test_imports_go_down_the_layers(path):
    here = layer_of(module_of(path))
    for name in imported_names(ast.parse(path.read_text())):
        if name == "wisp" or name.startswith("wisp."):
            assert layer_of(name) <= here, f"{module_of(path)} (layer {here}) imports {name} (layer {layer_of(name)})"


CORE_ROOMS = {"wisp.core.bank_keys": 0, "wisp.core.kernels": 1, "wisp.core.learners": 2, "wisp.core.experts": 3}


def room_of(module: str) -> int:
    """A core module's room (wisp.core itself and its __init__ re-exports: above them all)."""
    return next((r for p, r in CORE_ROOMS.items() if module == p or module.startswith(p + ".")), len(CORE_ROOMS))


def test_core_imports_only_core_and_errors():
    for path in (WISP / "core").rglob("*.py"):
        for name in imported_names(ast.parse(path.read_text())):
            if name.startswith("wisp"):
                assert name.startswith(("wisp.core", "wisp.errors")), f"{module_of(path)} imports {name}"


@pytest.mark.parametrize("path", sorted((WISP / "core").rglob("*.py")), ids=lambda p: str(p.relative_to(WISP)))
def test_core_rooms_import_downwards(path):
    here = room_of(module_of(path))
    for name in imported_names(ast.parse(path.read_text())):
        if name.startswith("wisp.core"):
            assert room_of(name) <= here, f"{module_of(path)} (room {here}) imports {name} (room {room_of(name)})"


def test_every_core_module_sits_in_a_room():
    for path in (WISP / "core").rglob("*.py"):
        module = module_of(path)
        assert module == "wisp.core" or room_of(module) < len(CORE_ROOMS), f"{module} is in no room of wisp.core"


@pytest.mark.parametrize("file, allowed", ARGUMENT_MODULES.items())
def test_argument_modules_import_no_torch(file, allowed):
    for name in module_level_imports(ast.parse((WISP / file).read_text())):
        assert not name.startswith(HEAVY), f"wisp/{file} imports {name}"
        if name.startswith("wisp"):
            assert name.startswith(allowed), f"wisp/{file} imports {name}"


def _expert_classes() -> set[str]:
    """Every class defined in wisp/core/experts (stores, residencies, policies, servers)."""
    return {node.name for path in (WISP / "core" / "experts").glob("*.py")
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}


@pytest.mark.parametrize("path", [p for p in SOURCES if "core/experts" not in p.as_posix()], ids=lambda p: str(p.relative_to(WISP)))
def test_no_front_end_asks_a_store_for_its_type(path):
    """Outside wisp/core/experts a store is asked for capabilities (slots, hot, cpu, rank_share), never its class."""
    classes = _expert_classes()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass") and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            assert not named & classes, f"{module_of(path)} asks for the type of {sorted(named & classes)}"


def module_file(module: str) -> Path | None:
    """The file of a wisp module (a package's __init__.py), or None when the name is no module."""
    base = WISP.parent.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def runtime_imports(path: Path) -> set[str]:
    """The wisp modules a file imports anywhere (inside functions too), not under `if TYPE_CHECKING:`;
    `from wisp.a import b` names wisp.a and, when b is a module, wisp.a.b."""
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}"))
        todo += ast.iter_child_nodes(node)
    return {name for name in found if name == "wisp" or name.startswith("wisp.")}


def import_closure(module: str) -> set[str]:
    """Every wisp module that importing `module` can run: its imports, theirs, and the packages above each."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or (path := module_file(name)) is None:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(runtime_imports(path))
    return seen


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_config_reaches_no_model_module():
    closure = import_closure("wisp.config")
    assert "wisp.errors" in closure and "wisp.options" in closure  # the walk follows the config's imports
    assert not [m for m in closure if within(m, "wisp.models")]


@pytest.mark.parametrize("path", sorted((WISP / "models").rglob("*.py")), ids=lambda p: str(p.relative_to(WISP)))
def test_models_reach_no_engine_server_or_cli(path):
    module = module_of(path)
    above = [m for m in import_closure(module) if within(m, "wisp.engine") or within(m, "wisp.server")
             or within(m, "wisp.cli")]
    assert not above, f"{module} reaches {sorted(above)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(WISP)))
def test_integrations_stay_outside_wisp_proper(path):
    module = module_of(path)
    for name in imported_names(ast.parse(path.read_text())):
        if not within(module, "wisp.integrations"):
            assert not within(name, "wisp.integrations"), f"{module} imports {name}"
        if not within(module, "wisp.integrations.vllm"):
            assert not within(name, "vllm"), f"{module} imports {name}"


@pytest.mark.slow
def test_the_demo_runs_where_triton_is_not_installed():
    """Triton is a test extra on CPU machines, not a dependency: the README's demo command runs before it is
    installed, so nothing on the CPU path may import it at module level."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['triton'] = None\n"  # any `import triton` now raises ImportError
            "from wisp.engine.llm import LLM\n"
            "from wisp.engine.sampling import SamplingParams\n"
            "out = LLM('demo', device='cpu').generate([[1, 2, 3]], SamplingParams(max_tokens=2))\n"
            "print(len(out[0].token_ids))")
    run = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.split()[-1] == "2", run.stderr[-3000:]
