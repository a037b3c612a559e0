"""wisp's expert paging as a vLLM plug-in (vLLM 0.32.x): see README.md, "Running inside vLLM".

`register` is the `vllm.general_plugins` entry point (pyproject.toml). vLLM calls it in each of its processes,
possibly more than once. It checks the vLLM version first: outside the supported range it logs one error naming
the range and returns, leaving vLLM untouched. Otherwise it registers `WispPagedMoEMethod` in place of vLLM's
`UnquantizedFusedMoEMethod`; that method is vLLM's own unless `additional_config={"wisp": {...}}` asks for paging
(`wisp.integrations.vllm.settings`). This module imports vLLM only inside `register`, `layer_counters` and `resize_slots`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("wisp.integrations.vllm")


def register() -> None:
    import vllm

    from wisp.integrations.vllm.settings import UnsupportedVllmVersion, check_vllm_version

    try:
        check_vllm_version(vllm.__version__)
    except UnsupportedVllmVersion as exc:
        logger.error("wisp: %s", exc)
        return
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    from wisp.integrations.vllm.moe_method import WispPagedMoEMethod

    taken = op_registry_oot.get(UnquantizedFusedMoEMethod.__name__)
    if taken is WispPagedMoEMethod:
        return
    if taken is not None:
        logger.error("wisp: another plug-in (%s) already replaces vLLM's UnquantizedFusedMoEMethod; wisp's paging is "
                     "off", taken.__qualname__)
        return
    UnquantizedFusedMoEMethod.register_oot(WispPagedMoEMethod)


def layer_counters(model) -> dict[str, dict[str, int]]:
    """A vLLM model's paged layers: name -> wisp's counters; from the offline API, `llm.apply_model(layer_counters)`
    (one dict per worker)."""
    from wisp.integrations.vllm.moe_method import layer_counters as counters

    return counters(model)


def resize_slots(model, expert_cap: int) -> dict[str, int]:
    """Every paged layer of a vLLM model to `expert_cap` slots, between requests:
    `llm.apply_model(functools.partial(resize_slots, expert_cap=C))` (`wisp.integrations.vllm.moe_method.resize_slots`)."""
    from wisp.integrations.vllm.moe_method import resize_slots as resize

    return resize(model, expert_cap)
