"""The typed plan: what `make_plan` returns, `wisp plan` writes and `wisp serve --plan` applies.

A `Plan` is what the engine applies (`per_layer_caps` expert slots per MoE layer and `kv_blocks` KV
blocks of `kv_block_size` tokens) plus, for a plan the planner made, its `report` (the sizes, the
admission floor, the predictions and the cost model it chose by) and its `curves` (the miss curves and
split problem behind it, for the plots and the simulator; never written to a file).

JSON form: one flat object with the keys `wisp plan` has always written, in the same order; the cost
model's keys are its field names (seconds_per_byte, recompute_seconds_per_token, expert_miss_seconds,
kv_miss_seconds). Files written before those keys were renamed spell them t_byte_s,
recompute_cost_s_per_token, c_exp_s and c_kv_s: they are still read (`_OLD_KEYS`), never written. `from_json`
is the one place a plan is validated, with errors naming the file and the key: per_layer_caps (a list
of integers) and kv_blocks (an integer) are required and kv_block_size defaults to 16, since a
hand-written file may carry only what the engine applies; the report is read when the object has every
one of its keys (otherwise it is None, as the engine never reads it), and then each must have its type.
A plan made with `--hybrid-costs` carries one more key, last: "hybrid", the `HybridAdvice` (read and checked
when present; the engine does not apply it). `read_fields` checks other small JSON objects the same way
(the `--hybrid-costs` file).

Invariants: Plan.from_json(p.to_json()) == p (curves are not compared); a file in the old spelling loads
to the same Plan as its rewrite with the new keys; without a hybrid advice the planner's to_json() is key
for key and value for value what earlier versions wrote, but for the cost model's renamed keys.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass

import numpy as np

from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.errors import WispError
from wisp.plan.cost_model import CostModel
from wisp.plan.hybrid_cost import HybridAdvice, HybridCapCost
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
    hybrid: HybridAdvice | None = None  # with `wisp plan --hybrid-costs`: paged against hybrid by cap

    def to_json(self) -> dict:
        """The JSON object of a plan file (curves left out; the hybrid advice last, when there is one)."""
        pools = {"per_layer_caps": list(self.per_layer_caps), "kv_blocks": self.kv_blocks,
                 "kv_block_size": self.kv_block_size}
        hybrid = {} if self.hybrid is None else {"hybrid": _to_json(self.hybrid)}
        if self.report is None:
            return {**pools, **hybrid}
        merged = {**_to_json(self.report), **pools}
        return {**{key: merged[key] for key in FILE_ORDER}, **hybrid}

    @classmethod
    def from_json(cls, obj: object, source: str = "plan") -> "Plan":
        """A plan from a decoded JSON value, checked (see the module docstring); `source` names it in errors."""
        if not isinstance(obj, dict):
            raise WispError(f"{source} is not a JSON object")
        caps, blocks, block_size = _pools(obj, source)
        report = _read(PlanReport, obj, source, "") if all(k in obj for k in _keys(PlanReport)) else None
        hybrid = _nested(HybridAdvice, obj["hybrid"], source, "hybrid") if "hybrid" in obj else None
        return cls(tuple(caps), blocks, block_size, report, hybrid=hybrid)


def read_fields(cls, obj: object, source: str):
    """A dataclass (e.g. `HybridCosts`) from a decoded JSON object with exactly its fields' keys (those with
    a default may be left out), every value type-checked; WispError naming `source` otherwise."""
    if not isinstance(obj, dict):
        raise WispError(f"{source} is not a JSON object")
    unknown = [k for k in obj if k not in _keys(cls) and k not in _OLD_KEYS.get(cls, {}).values()]
    if unknown:
        raise WispError(f"{source}: unknown key {unknown[0]!r}; the keys are {', '.join(_keys(cls))}")
    return _read(cls, obj, source, "")


# the file's key order: the report's fields with the pool sizes where `wisp plan` has always put them
FILE_ORDER = ("model", "expert_cap", "per_layer_caps", "kv_blocks", "kv_bytes", "kv_block_size", "expert_bytes",
              "budget_bytes", "pageable_bytes", "non_expert_bytes", "reserve_bytes", "slot_bytes", "block_bytes",
              "admission_floor_blocks", "max_concurrency", "max_model_len", "predicted_expert_misses_per_token",
              "predicted_expert_misses_per_token_per_layer_caps", "predicted_kv_block_misses_per_request",
              "predicted_latency_s", "equimarginal_cap", "unconstrained", "cost_model", "trace")

# field -> the key earlier plan files gave it, read when the field's own key is absent (never written)
_OLD_KEYS = {CostModel: {"seconds_per_byte": "t_byte_s", "recompute_seconds_per_token": "recompute_cost_s_per_token",
                         "expert_miss_seconds": "c_exp_s", "kv_miss_seconds": "c_kv_s"}}
_NESTED = {"SplitOption": SplitOption, "CostModel": CostModel, "TraceSummary": TraceSummary,
           "HybridCosts": HybridCosts, "HybridCapCost": HybridCapCost}
_SCALARS = {  # annotation -> (what it must be, check)
    "int": ("an integer", lambda v: type(v) is int),
    "float": ("a number", lambda v: type(v) in (int, float)),
    "str": ("a string", lambda v: type(v) is str),
}
_TUPLE = "tuple[{}, ...]"  # a tuple field: a JSON list of its element type


def _keys(cls) -> list[str]:
    return [f.name for f in fields(cls)]


def _key_in(cls, name: str, obj: dict) -> str | None:
    """The key `obj` holds field `name` under: its own, else its old one (`_OLD_KEYS`); None if neither."""
    if name in obj:
        return name
    old = _OLD_KEYS.get(cls, {}).get(name)
    return old if old is not None and old in obj else None


def _to_json(obj) -> dict:
    return {f.name: _json_value(getattr(obj, f.name)) for f in fields(obj)}


def _json_value(v):
    if is_dataclass(v):
        return _to_json(v)
    return [_json_value(x) for x in v] if isinstance(v, tuple) else v


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
    values = {}
    for f in fields(cls):
        key = _key_in(cls, f.name, obj)
        if key is not None:
            values[f.name] = _value(f.type, obj[key], source, prefix + key)
        elif f.default is MISSING:
            where = f"{source}: {prefix.rstrip('.')}" if prefix else source
            raise WispError(f"{where} has no {f.name}")
    try:
        return cls(**values)
    except ValueError as exc:  # the dataclass's own checks (HybridCosts, HybridAdvice)
        raise WispError(f"{source}: {prefix.rstrip('.') + ': ' if prefix else ''}{exc}") from None


def _nested(cls, value, source: str, where: str):
    if not isinstance(value, dict):
        raise WispError(f"{source}: {where} must be a JSON object")
    return _read(cls, value, source, where + ".")


def _value(annotation: str, value, source: str, where: str):
    """One field's value, checked against its annotation (a scalar, a nested dataclass, or a tuple of either)."""
    if annotation in _NESTED:
        return _nested(_NESTED[annotation], value, source, where)
    element = next((a for a in (*_SCALARS, *_NESTED) if annotation == _TUPLE.format(a)), None)
    if element is not None:
        if not isinstance(value, list):
            raise WispError(f"{source}: {where} must be a JSON list")
        return tuple(_value(element, v, source, f"{where}[{i}]") for i, v in enumerate(value))
    if not _SCALARS[annotation][1](value):
        raise WispError(f"{source}: {where} must be {_SCALARS[annotation][0]}, got {value!r}")
    return value
