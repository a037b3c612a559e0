"""`WispPagedMoEMethod`: vLLM's unquantized MoE method with its experts paged through wisp (imports vLLM).

Registered in place of `UnquantizedFusedMoEMethod` (`register_oot`, see `wisp.integrations.vllm.register`), so
vLLM builds it for every unquantized MoE layer. Without wisp's settings it is vLLM's method, unchanged. With them:
- `process_weights_after_loading` runs vLLM's own (padding, the kernel's prepacked layout, the kernel itself), then
  hands the bank to `SlotPaging` (C slots per layer, host masters) and points the layer's weights at the slots;
- `apply` receives the ids vLLM's router chose and calls the opaque custom op `torch.ops.wisp.vllm_paged_moe`,
  which makes them resident and runs vLLM's kernel (`moe_kernel.apply`) on the slots with the ids remapped. The op
  is opaque because the step's decision reads the routing on the host: on the CPU vLLM traces the MoE layer into
  its compiled graph (no `moe_forward` op there), and the op keeps that graph whole around the decision.
Supported on this seam: unquantized experts without biases; anything else is refused with one line at load time.
A layer with shared experts calls the paging directly (eager only: the op cannot carry vLLM's SharedExperts object).
A `plan` setting is read when the method is built (`applied_plan`): its caps, and vLLM's KV cache sized to it.

Written for vLLM's CUDA build and never run on a GPU (vLLM's CUDA wheel cannot reach the machines this was
tested on), so unverified:
- with vLLM's Triton MoE backend, a paged layer's bank is created in pinned host memory (`create_weights` under
  the CPU device, `requires_device_loading` False), so loading never holds a whole bank on the GPU; its C slots
  live on the GPU, and small steps (decode) decide on the device (`SlotPaging`); other backends load on the GPU
  and then move the bank to pinned host masters;
- expert parallelism without all-to-all kernels and without EPLB: vLLM's global -> local `expert_map` is composed
  with the step's rows (`SlotPaging.step_expert_parallel`) and handed to the kernel. vLLM's CPU kernel ignores
  `expert_map`, so on the CPU expert parallelism is refused.
"""

from __future__ import annotations

import atexit
import logging
import weakref

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.utils import replace_parameter
from vllm.platforms import current_platform

from wisp.core.experts.counters import ExpertCounters, sum_counters
from wisp.integrations.vllm.applied_plan import apply_plan
from wisp.integrations.vllm.settings import WispVllmConfigError, checked_cap, layer_index_of, settings_from
from wisp.integrations.vllm.slot_paging import SlotPaging

BANK = ("w13_weight", "w2_weight")
logger = logging.getLogger("vllm.wisp")  # under vLLM's logger, so its handler and format apply
PROCESS_COUNTERS: dict[str, ExpertCounters] = {}  # op key -> counters of every layer this process paged (logged at exit)
METHODS: "weakref.WeakValueDictionary[str, WispPagedMoEMethod]" = weakref.WeakValueDictionary()  # op key -> method


class WispPagedMoEMethod(UnquantizedFusedMoEMethod):
    def __init__(self, moe):
        super().__init__(moe)
        config = get_current_vllm_config_or_none()
        self.wisp_settings = apply_plan(settings_from(config.additional_config if config is not None else None), config)
        self.wisp_paging: SlotPaging | None = None
        self.wisp_host_bank = False  # CUDA: the bank was created in pinned host memory (`create_weights`)
        self.wisp_global_to_local: torch.Tensor | None = None  # expert parallel: vLLM's expert_map
        if self.wisp_settings is not None and self.wisp_settings.expert_cap is not None:  # fail before loading
            self.wisp_settings.cap_for(None, moe.num_local_experts, moe.experts_per_token)

    @property
    def requires_device_loading(self) -> bool:
        """vLLM moves a layer's weights to the GPU for `process_weights_after_loading` unless this is False."""
        return not self.wisp_host_bank

    def create_weights(self, layer, num_experts: int, hidden_size: int, intermediate_size_per_partition: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        args = (layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype)
        self.wisp_host_bank = (current_platform.is_cuda() and self.unquantized_backend == UnquantizedMoeBackend.TRITON
                               and self._cap_of(layer, num_experts) is not None)
        if not self.wisp_host_bank:
            return super().create_weights(*args, **extra_weight_attrs)
        with torch.device("cpu"):  # unverified (module docstring): the bank never lands on the GPU whole
            super().create_weights(*args, **extra_weight_attrs)
        for b in BANK:
            getattr(layer, b).data = getattr(layer, b).data.pin_memory()

    def _cap_of(self, layer, num_experts: int) -> int | None:
        if self.wisp_settings is None:
            return None
        return self.wisp_settings.cap_for(layer_index_of(getattr(layer, "layer_name", "")), num_experts,
                                          self.moe.experts_per_token)

    def process_weights_after_loading(self, layer) -> None:
        super().process_weights_after_loading(layer)
        cap = self._cap_of(layer, layer.w13_weight.shape[0])
        if cap is None:
            return
        name = getattr(layer, "layer_name", "")
        if self.moe.has_bias:
            raise WispVllmConfigError(f"wisp paging inside vLLM does not page expert biases yet ({name}); "
                                      f'use mode "resident" for this model')
        if layer.expert_map is not None:
            self.wisp_global_to_local = self._expert_parallel_map(layer, name)
        device = torch.device("cuda", torch.cuda.current_device()) if self.wisp_host_bank else None
        paging = SlotPaging({b: getattr(layer, b).data for b in BANK}, cap, device)
        for b in BANK:
            replace_parameter(layer, b, paging.slots[b])
        self.wisp_paging = paging
        self.wisp_layer_args = (layer.activation, layer.apply_router_weight_on_input)  # not the layer: a module cycle
        self.wisp_key = f"{name}#{id(self)}"  # unique across the LLMs of one process
        METHODS[self.wisp_key] = self
        PROCESS_COUNTERS[self.wisp_key] = paging.counters
        logger.info("wisp: %s pages its %d experts through %d slots", name, paging.pager.num_experts, cap)

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, shared_experts,
              shared_experts_input):
        if self.wisp_paging is None:
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        if shared_experts is not None:
            return self.paged_apply(x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        return torch.ops.wisp.vllm_paged_moe(x, topk_weights, topk_ids, self.wisp_key)

    def paged_apply(self, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None) -> torch.Tensor:
        """One step: the routed experts made resident, vLLM's kernel run on the bank the step returns."""
        activation, weight_on_input = self.wisp_layer_args
        global_to_local, expert_map = self.wisp_global_to_local, None
        if global_to_local is None:
            bank, topk_ids = self.wisp_paging.step(topk_ids)
            num_experts = bank["w13_weight"].shape[0]
        else:  # unverified (module docstring): global ids, the composed map sends them to the bank's rows
            bank, expert_map = self.wisp_paging.step_expert_parallel(topk_ids, global_to_local)
            num_experts = global_to_local.shape[0]
        return self.moe_kernel.apply(
            hidden_states=x, w1=bank["w13_weight"], w2=bank["w2_weight"], topk_weights=topk_weights,
            topk_ids=topk_ids, activation=activation, global_num_experts=num_experts, expert_map=expert_map,
            apply_router_weight_on_input=weight_on_input, shared_experts=shared_experts,
            shared_experts_input=shared_experts_input)

    def _expert_parallel_map(self, layer, name: str) -> torch.Tensor:
        """vLLM's global -> local expert map of this rank, where paging can compose with it (else one error)."""
        parallel = self.moe.moe_parallel_config
        if current_platform.is_cpu():
            raise WispVllmConfigError(f"expert parallelism on the CPU: vLLM's CPU MoE kernel ignores expert_map "
                                      f"({name}); use tensor parallelism")
        if parallel.use_all2all_kernels or parallel.enable_eplb:
            raise WispVllmConfigError(f"wisp paging composes with expert parallelism only without all-to-all "
                                      f"kernels and without EPLB ({name}): data parallel attention and expert "
                                      f"rebalancing move experts under the pager")
        return layer.expert_map


@torch.library.custom_op("wisp::vllm_paged_moe", mutates_args=())
def paged_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, key: str) -> torch.Tensor:
    """The paged MoE step of the layer registered under `key`, opaque to torch.compile."""
    return METHODS[key].paged_apply(x, topk_weights, topk_ids)


@paged_moe.register_fake
def _(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, key: str) -> torch.Tensor:
    return torch.empty_like(x)


def layer_counters(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """A model's paged layers: module name -> wisp's counters (hits, misses, loads, bytes_h2d, ...), wide steps and
    the layer's expert slots."""
    found = {}
    for name, module in model.named_modules():
        paging = getattr(getattr(module, "quant_method", None), "wisp_paging", None)
        if paging is not None:
            found[name] = {**paging.counters.as_dict(), "wide_steps": paging.wide_steps, "slots": paging.pager.capacity}
    return found


def resize_slots(model: torch.nn.Module, expert_cap: int) -> dict[str, int]:
    """Give every paged layer of a vLLM model `expert_cap` slots (at most its experts; never below top_k), empty:
    experts page back in on demand, counters carry over. From the offline API, between requests:
    `llm.apply_model(functools.partial(resize_slots, expert_cap=C))` (one dict per worker). Returns layer name ->
    its slots now. The op stays the same, so compiled graphs stay valid."""
    paged = [(name, module, module.quant_method) for name, module in model.named_modules()
             if getattr(getattr(module, "quant_method", None), "wisp_paging", None) is not None]
    caps = {name: checked_cap(expert_cap, method.wisp_paging.pager.num_experts, method.moe.experts_per_token,
                              f" ({name})") for name, _, method in paged}  # all checked before any layer changes
    for name, module, method in paged:
        method.wisp_paging.resize(caps[name])
        for b in BANK:
            replace_parameter(module, b, method.wisp_paging.slots[b])
    return caps


@atexit.register
def _log_counters() -> None:
    if PROCESS_COUNTERS:
        total = sum_counters(PROCESS_COUNTERS.values())
        logger.info("wisp: %d paged MoE layers: %d steps, %d hits, %d misses, %d loads, %d bytes host->device",
                    len(PROCESS_COUNTERS), total.steps, total.hits, total.misses, total.loads, total.bytes_h2d)
