"""Whether the Triton kernels run under Triton's interpreter (CPU machines: tests/conftest.py sets
TRITON_INTERPRET=1 before any kernel module is imported), read once at import, as @triton.jit reads it.

Under the interpreter tl.dot misreads 16-bit float operands (Triton 3.9), so the kernels that multiply
16-bit tiles (`wisp.core.triton_moe`, `wisp.engine.triton_attention`) widen them to float32 there first:
exact products, IEEE sums. Compiled on a GPU they multiply the 16-bit tiles on tensor cores.
"""

from __future__ import annotations

import os

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
