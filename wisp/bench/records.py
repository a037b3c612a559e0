"""How a benchmark script ends: its record printed as JSON, and saved to `--out` when one was given."""

from __future__ import annotations

import json


def print_and_save(record: dict, out: str | None) -> None:
    print(json.dumps(record, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump(record, f, indent=1)
