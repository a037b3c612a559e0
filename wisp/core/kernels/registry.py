"""The MoE kernel families by backend name: the torch reference (`wisp.core.kernels.moe`) and Triton.

A family is four functions with one contract (`wisp.core.kernels.moe` states it; the Triton ones follow it bit
for bit, tested against it):
- `fused(hidden, w_gate_up, w_down, topk_ids, topk_weights, expert_map) -> [T, D]`, a whole MoE step; with
  `count=` (a `wisp.core.kernels.step_count.StepCount`) it also adds the step to a store's device counts;
- `pairs_by_map(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map)`: every (token, k) pair whose
  expert has a slot writes its float32 output row into per_k [T*K, D]; other pairs are left as they are;
- `pairs_of_one_expert(per_k, hidden, w_gate_up, w_down, pairs, top_k)`: the same for the listed pairs,
  all routed to the one expert whose weights are given (a slot or a staging buffer);
- `combine(per_k [T, K, D], topk_weights, dtype) -> [T, D]`: the sum over k in routing order.
An expert-major step is `pairs_by_map` + `pairs_of_one_expert` per streamed expert + `combine`, and
gives the bits `fused` gives. The first three also take `extras=` (`wisp.core.kernels.expert_extras`: scales, biases)
and `activation=`; a model's family is bound to its activation once (`with_activation`), so the stores call
every family alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from wisp.core.kernels import moe
from wisp.core.kernels.expert_extras import SILU, Activation

MOE_BACKEND_NAMES = ("torch", "triton")


@dataclass(frozen=True)
class MoEKernels:
    name: str
    fused: Callable
    pairs_by_map: Callable
    pairs_of_one_expert: Callable
    combine: Callable
    activation: Activation = SILU

    def with_activation(self, activation: Activation) -> "MoEKernels":
        """This family with every expert computed under `activation` (itself when it is the default)."""
        if activation == self.activation:
            return self
        return replace(self, fused=partial(self.fused, activation=activation),
                       pairs_by_map=partial(self.pairs_by_map, activation=activation),
                       pairs_of_one_expert=partial(self.pairs_of_one_expert, activation=activation),
                       activation=activation)


TORCH_KERNELS = MoEKernels("torch", moe.fused_moe, moe.pairs_by_map, moe.pairs_of_one_expert,
                           moe.combine_in_routing_order)


def moe_kernels(backend: str) -> MoEKernels:
    """The kernel family of a backend name (Triton is imported only when asked for)."""
    if backend == "torch":
        return TORCH_KERNELS
    if backend == "triton":
        from wisp.core.kernels import triton_moe as t

        return MoEKernels("triton", t.triton_fused_moe, t.triton_pairs_by_map, t.triton_pairs_of_one_expert,
                          t.triton_combine)
    raise ValueError(f"unknown MoE backend {backend!r}; supported: {', '.join(MOE_BACKEND_NAMES)}")
