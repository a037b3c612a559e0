"""Plan files: a `Plan` written as JSON, and read back checked; and the `--hybrid-costs` file.

The file is `Plan.to_json()` with one-space indentation; reading it is JSON decoding plus
`Plan.from_json`, so every error (unreadable, not JSON, a missing or mistyped key) is one WispError
that names the file. A hybrid costs file is one JSON object of `HybridCosts`' fields, read the same way
(`read_hybrid_costs`; unknown keys are refused, so a misspelt optional key is not silently dropped).
"""

from __future__ import annotations

import json
from pathlib import Path

from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.errors import WispError
from wisp.plan.plan import Plan, read_fields


def plan_text(plan: Plan) -> str:
    """The JSON text of a plan file (what `wisp plan` prints without --out)."""
    return json.dumps(plan.to_json(), indent=1)


def write_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(plan_text(plan))


def read_plan(path: str | Path) -> Plan:
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WispError(f"could not read plan {path}: {exc}") from None
    return Plan.from_json(obj, f"plan {path}")


def read_hybrid_costs(path: str | Path) -> HybridCosts:
    """`HybridCosts` from a JSON file; every error is one WispError naming the file."""
    source = f"--hybrid-costs {path}"
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WispError(f"could not read {source}: {exc}") from None
    return read_fields(HybridCosts, obj, source)
