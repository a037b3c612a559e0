"""Plan files: a `Plan` written as JSON, and read back checked.

The file is `Plan.to_json()` with one-space indentation; reading it is JSON decoding plus
`Plan.from_json`, so every error (unreadable, not JSON, a missing or mistyped key) is one WispError
that names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from wisp.errors import WispError
from wisp.plan.plan import Plan


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
