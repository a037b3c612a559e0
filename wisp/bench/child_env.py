"""The environment of a child Python process a benchmark starts (a server, a sampler): it imports this wisp."""

from __future__ import annotations

import os
from pathlib import Path

WISP_HOME = Path(__file__).resolve().parents[2]  # the folder holding this wisp package


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with WISP_HOME first on PYTHONPATH, so `python -m wisp ...` or
    `python -c "import wisp..."` runs the same code as the caller; `extra` set on top."""
    path = os.pathsep.join(filter(None, [str(WISP_HOME), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)
