"""The typed plan: what `make_plan` returns, `wisp plan` writes and `wisp serve --plan` applies.

A `Plan` is what the engine applies (`per_layer_caps` expert slots per MoE layer and `kv_blocks` KV
blocks of `kv_block_size` tokens) plus, for a plan the planner made, its `report` (the sizes, the
admission floor, the predictions and the cost model it chose by) and its `curves` (the miss curves and
split problem behind it, for the plots and the simulator; never written to a file).

JSON form: one flat object with the keys `wisp plan` has always written, in the same order (the cost
model keeps its historical keys t_byte_s, recompute_cost_s_per_token, c_exp_s and c_kv_s). `from_json`
is the one place a plan is validated, with errors naming the file and the key: per_layer_caps (a list
of integers) and kv_blocks (an integer) are required and kv_block_size defaults to 16, since a
hand-written file may carry only what the engine applies; the report is read when the object has every
one of its keys (otherwise it is None, as the engine never reads it), and then each must have its type.

Invariants: Plan.from_json(p.to_json()) == p (curves are not compared); the planner's to_json() is
key for key and value for value what earlier versions wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

import numpy as np

from wisp.errors import WispError
from wisp.plan.cost_model import CostModel
from wisp.plan.split import SplitProblem


@dataclass(frozen=True)
class SplitOption:
    """One split the plan reports besides its choice (the optimum without the admission floor)."""

    expert_cap: int
    kv_blocks: int
    predicted_latency_s: float


@dataclass(frozen=True)
class TraceSummary:
    tokens: int  # routing trace tokens
    layers: int  # routing trace layers
    kv_requests: int  # KV trace requests (0 without one)


@dataclass(frozen=True)
class PlanReport:
    """How the planner chose: budget arithmetic, floor, predictions, cost model. Fields in file order."""

    model: str
    expert_cap: int  # slots per layer of the best uniform split
    kv_bytes: int
    expert_bytes: int  # expert_cap slots in every MoE layer
    budget_bytes: int  # the VRAM budget planned for
    pageable_bytes: int  # budget - non-expert weights - reserve (>= 0)
    non_expert_bytes: int
    reserve_bytes: int
    slot_bytes: int
    block_bytes: int
    admission_floor_blocks: int
    max_concurrency: int
    max_model_len: int
    predicted_expert_misses_per_token: float  # with expert_cap in every layer
    predicted_expert_misses_per_token_per_layer_caps: float
    predicted_kv_block_misses_per_request: float
    predicted_latency_s: float  # seconds per request
    equimarginal_cap: int
    unconstrained: SplitOption
    cost_model: CostModel
    trace: TraceSummary


@dataclass(frozen=True)
class PlanCurves:
    """The planner's inputs to the split, kept for plots and the simulator (not written)."""

    expert: tuple[float, ...]  # expert misses per token, all MoE layers, by uniform cap 0..num_experts
    kv: tuple[float, ...]  # KV block misses per request, by pool size in blocks
    problem: SplitProblem

    @classmethod
    def of(cls, expert: np.ndarray, kv: np.ndarray, problem: SplitProblem) -> "PlanCurves":
        return cls(tuple(expert.tolist()), tuple(kv.tolist()), problem)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The expert and KV curves as float64 arrays (the values the planner computed, exactly)."""
        return np.array(self.expert, dtype=np.float64), np.array(self.kv, dtype=np.float64)


@dataclass(frozen=True)
class Plan:
    per_layer_caps: tuple[int, ...]
    kv_blocks: int
    kv_block_size: int = 16
    report: PlanReport | None = None
    curves: PlanCurves | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        """The JSON object of a plan file (curves left out)."""
        pools = {"per_layer_caps": list(self.per_layer_caps), "kv_blocks": self.kv_blocks,
                 "kv_block_size": self.kv_block_size}
        if self.report is None:
            return pools
        merged = {**_to_json(self.report), **pools}
        return {key: merged[key] for key in FILE_ORDER}

    @classmethod
    def from_json(cls, obj: object, source: str = "plan") -> "Plan":
        """A plan from a decoded JSON value, checked (see the module docstring); `source` names it in errors."""
        if not isinstance(obj, dict):
            raise WispError(f"{source} is not a JSON object")
        caps, blocks, block_size = _pools(obj, source)
        report = _read(PlanReport, obj, source, "") if all(k in obj for k in _keys(PlanReport)) else None
        return cls(tuple(caps), blocks, block_size, report)


# the file's key order: the report's fields with the pool sizes where `wisp plan` has always put them
FILE_ORDER = ("model", "expert_cap", "per_layer_caps", "kv_blocks", "kv_bytes", "kv_block_size", "expert_bytes",
              "budget_bytes", "pageable_bytes", "non_expert_bytes", "reserve_bytes", "slot_bytes", "block_bytes",
              "admission_floor_blocks", "max_concurrency", "max_model_len", "predicted_expert_misses_per_token",
              "predicted_expert_misses_per_token_per_layer_caps", "predicted_kv_block_misses_per_request",
              "predicted_latency_s", "equimarginal_cap", "unconstrained", "cost_model", "trace")

# field -> file key where they differ (the cost model's historical keys)
_RENAMED = {CostModel: {"seconds_per_byte": "t_byte_s", "recompute_seconds_per_token": "recompute_cost_s_per_token",
                        "expert_miss_seconds": "c_exp_s", "kv_miss_seconds": "c_kv_s"}}
_NESTED = {"SplitOption": SplitOption, "CostModel": CostModel, "TraceSummary": TraceSummary}
_SCALARS = {  # annotation -> (what it must be, check)
    "int": ("an integer", lambda v: type(v) is int),
    "float": ("a number", lambda v: type(v) in (int, float)),
    "str": ("a string", lambda v: type(v) is str),
}


def _keys(cls) -> list[str]:
    return [_RENAMED.get(cls, {}).get(f.name, f.name) for f in fields(cls)]


def _to_json(obj) -> dict:
    return {key: _to_json(v) if is_dataclass(v) else v
            for key, v in zip(_keys(type(obj)), (getattr(obj, f.name) for f in fields(obj)))}


def _pools(obj: dict, source: str) -> tuple[list[int], int, int]:
    """per_layer_caps, kv_blocks, kv_block_size: what the engine applies, checked."""
    missing = [k for k in ("per_layer_caps", "kv_blocks") if k not in obj]
    if missing:
        raise WispError(f"{source} has no {', '.join(missing)}")
    caps, blocks = obj["per_layer_caps"], obj["kv_blocks"]
    if not (isinstance(caps, list) and all(type(c) is int for c in caps) and type(blocks) is int):
        raise WispError(f"{source}: per_layer_caps must be a list of integers and kv_blocks an integer")
    block_size = obj.get("kv_block_size", 16)
    if type(block_size) is not int:
        raise WispError(f"{source}: kv_block_size must be an integer")
    return caps, blocks, block_size


def _read(cls, obj: dict, source: str, prefix: str):
    """A (nested) dataclass from a JSON object whose keys are present; every value type-checked."""
    values = []
    for f, key in zip(fields(cls), _keys(cls)):
        where = prefix + key
        if key not in obj:
            raise WispError(f"{source}: {prefix.rstrip('.')} has no {key}")
        value = obj[key]
        if f.type in _NESTED:
            if not isinstance(value, dict):
                raise WispError(f"{source}: {where} must be a JSON object")
            value = _read(_NESTED[f.type], value, source, where + ".")
        elif not _SCALARS[f.type][1](value):
            raise WispError(f"{source}: {where} must be {_SCALARS[f.type][0]}, got {value!r}")
        values.append(value)
    return cls(*values)
