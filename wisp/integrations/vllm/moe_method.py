"""`WispPagedMoEMethod`: vLLM's unquantized MoE method with its experts paged through wisp (imports vLLM).

Registered in place of `UnquantizedFusedMoEMethod` (`register_oot`, see `wisp.integrations.vllm.register`), so
vLLM builds it for every unquantized MoE layer. Without wisp's settings it is vLLM's method, unchanged. With them:
- `process_weights_after_loading` runs vLLM's own (padding, the kernel's prepacked layout, the kernel itself), then
  hands the bank to `SlotPaging` (C slots per layer, host masters) and points the layer's weights at the slots;
- `apply` receives the ids vLLM's router chose, makes them resident, and runs vLLM's kernel (`moe_kernel.apply`)
  on the slots with the ids remapped. vLLM already calls the MoE layer through an opaque custom op
  (`torch.ops.vllm.moe_forward`), so compiled graphs stay whole around the host-side decision.
Supported on this seam: unquantized experts without biases, no expert parallelism (vLLM's CPU kernel ignores
`expert_map`); anything else is refused with one line at load time.
"""

from __future__ import annotations

import atexit
import logging
import weakref

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.utils import replace_parameter

from wisp.core.experts.counters import sum_counters
from wisp.integrations.vllm.settings import WispVllmConfigError, layer_index_of, settings_from
from wisp.integrations.vllm.slot_paging import SlotPaging

BANK = ("w13_weight", "w2_weight")
logger = logging.getLogger("wisp.integrations.vllm")
PAGED_LAYERS: "weakref.WeakValueDictionary[str, SlotPaging]" = weakref.WeakValueDictionary()  # this process's


class WispPagedMoEMethod(UnquantizedFusedMoEMethod):
    def __init__(self, moe):
        super().__init__(moe)
        config = get_current_vllm_config_or_none()
        self.wisp_settings = settings_from(config.additional_config if config is not None else None)
        self.wisp_paging: SlotPaging | None = None
        if self.wisp_settings is not None and self.wisp_settings.expert_cap is not None:  # fail before loading
            self.wisp_settings.cap_for(None, moe.num_local_experts, moe.experts_per_token)

    def process_weights_after_loading(self, layer) -> None:
        super().process_weights_after_loading(layer)
        settings = self.wisp_settings
        if settings is None:
            return
        name = getattr(layer, "layer_name", "")
        cap = settings.cap_for(layer_index_of(name), layer.w13_weight.shape[0], self.moe.experts_per_token)
        if cap is None:
            return
        if self.moe.has_bias:
            raise WispVllmConfigError(f"wisp paging inside vLLM does not page expert biases yet ({name}); "
                                      f'use mode "resident" for this model')
        if layer.expert_map is not None:
            raise WispVllmConfigError(f"wisp paging inside vLLM does not compose with expert parallelism yet ({name})")
        paging = SlotPaging({b: getattr(layer, b).data for b in BANK}, cap)
        for b in BANK:
            replace_parameter(layer, b, paging.slots[b])
        self.wisp_paging = paging
        PAGED_LAYERS[name] = paging

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, shared_experts,
              shared_experts_input):
        if self.wisp_paging is None:
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        bank, rows = self.wisp_paging.step(topk_ids)
        return self.moe_kernel.apply(
            hidden_states=x, w1=bank["w13_weight"], w2=bank["w2_weight"], topk_weights=topk_weights, topk_ids=rows,
            activation=layer.activation, global_num_experts=bank["w13_weight"].shape[0], expert_map=None,
            apply_router_weight_on_input=layer.apply_router_weight_on_input, shared_experts=shared_experts,
            shared_experts_input=shared_experts_input)


def layer_counters(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """A model's paged layers: module name -> wisp's counters (hits, misses, loads, bytes_h2d, ...) and wide steps."""
    found = {}
    for name, module in model.named_modules():
        paging = getattr(getattr(module, "quant_method", None), "wisp_paging", None)
        if paging is not None:
            found[name] = {**paging.counters.as_dict(), "wide_steps": paging.wide_steps}
    return found


@atexit.register
def _log_counters() -> None:
    layers = dict(PAGED_LAYERS)
    if layers:
        total = sum_counters(p.counters for p in layers.values())
        logger.warning("wisp: %d paged MoE layers: %d hits, %d misses, %d loads, %d bytes host->device",
                       len(layers), total.hits, total.misses, total.loads, total.bytes_h2d)
