"""Plan files (`wisp.plan.plan_file`): written as `wisp plan` writes them, read back checked."""

from __future__ import annotations

import json

import pytest

from wisp.errors import WispError
from wisp.plan.plan import Plan
from wisp.plan.plan_file import plan_text, read_plan, write_plan


def test_write_then_read(tmp_path):
    plan = Plan((4, 6), 80, 32)
    write_plan(plan, tmp_path / "p.json")
    assert (tmp_path / "p.json").read_text() == plan_text(plan) == json.dumps(plan.to_json(), indent=1)
    assert read_plan(tmp_path / "p.json") == plan


def test_unreadable_files_are_one_error_naming_the_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for path in (tmp_path / "bad.json", tmp_path / "missing.json"):
        with pytest.raises(WispError, match=f"could not read plan {path}"):
            read_plan(path)
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(WispError, match="is not a JSON object"):
        read_plan(tmp_path / "list.json")
