"""The reusable core, in rooms that import only downwards (tests/test_layering.py):
- `bank_keys`: the names of an expert bank's tensors;
- `kernels/`: the fused-MoE torch reference (the oracle), the Triton and native kernels, weight formats;
- `learners/`: online estimates made while serving (each server's pace, probed costs, co-activation);
- `experts/`: where a MoE layer's experts live and how a routed step reaches them (the pager, the stores).

Dependency rule: nothing in `wisp.core` imports from `wisp.config`, `wisp.models`, `wisp.engine`, `wisp.server`
or `wisp.cli`, so other front ends (a vLLM plug-in, a transformers adapter) can reuse it alone.
"""

from wisp.core.experts.counters import ExpertCounters
from wisp.core.experts.pager import ExpertPager
from wisp.core.experts.presets import PRESETS, build_store
from wisp.core.experts.store import ExpertStore
from wisp.core.kernels.moe import fused_moe

__all__ = ["ExpertCounters", "ExpertPager", "ExpertStore", "PRESETS", "build_store", "fused_moe"]
