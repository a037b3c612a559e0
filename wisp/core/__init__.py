"""The reusable core: expert pager, fused-MoE reference, row-invariant primitives.

Dependency rule: nothing in `wisp.core` imports from `wisp.models`, `wisp.engine` or `wisp.cli`, so
other front ends (a vLLM plug-in, a transformers adapter) can reuse it alone.
"""

from wisp.core.experts import ExpertCounters, ExpertStore, OffloadExperts, PagedExperts, ResidentExperts
from wisp.core.moe import fused_moe
from wisp.core.pager import ExpertPager

__all__ = [
    "ExpertCounters",
    "ExpertPager",
    "ExpertStore",
    "OffloadExperts",
    "PagedExperts",
    "ResidentExperts",
    "fused_moe",
]
