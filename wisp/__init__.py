"""wisp: serve Mixture-of-Experts models on GPUs too small to hold them.

    from wisp import LLM, SamplingParams
    llm = LLM("demo", mode="paged", expert_cap=8)
    print(llm.generate(["Hello"], SamplingParams(max_tokens=16))[0].text)

The public names are imported on first use (PEP 562), so `import wisp` (and `wisp --help`) does not
load torch; `from wisp import LLM` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wisp.engine.llm import LLM, RequestOutput
    from wisp.engine.sampling import SamplingParams
    from wisp.errors import WispError

_PUBLIC = {
    "LLM": "wisp.engine.llm",
    "RequestOutput": "wisp.engine.llm",
    "SamplingParams": "wisp.engine.sampling",
    "WispError": "wisp.errors",
}

__all__ = ["LLM", "RequestOutput", "SamplingParams", "WispError"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'wisp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
