"""Plan files (`wisp.plan.plan_file`): written as `wisp plan` writes them, read back checked; and the
`--hybrid-costs` file."""

from __future__ import annotations

import json

import pytest

from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.errors import WispError
from wisp.plan.plan import Plan
from wisp.plan.plan_file import plan_text, read_hybrid_costs, read_plan, write_plan


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


def test_hybrid_costs_files_are_read_checked(tmp_path):
    costs = {"copy_s": 0.0064, "cpu_rows": [1, 4], "cpu_s_at_rows": [0.0055, 0.006]}
    (tmp_path / "costs.json").write_text(json.dumps(costs))
    costs = read_hybrid_costs(tmp_path / "costs.json")
    assert costs == HybridCosts(0.0064, (1, 4), (0.0055, 0.006)) and costs.cpu_overhead_s == 0.0


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "could not read --hybrid-costs"),
    ("[0.0064]", "is not a JSON object"),
    ('{"cpu_rows": [1], "cpu_s_at_rows": [0.005]}', "has no copy_s"),
    ('{"copy_s": 0.006, "cpu_rows": [1], "cpu_s_at_rows": [0.005], "overhead_s": 0}', "unknown key 'overhead_s'"),
    ('{"copy_s": "6.4ms", "cpu_rows": [1], "cpu_s_at_rows": [0.005]}', "copy_s must be a number"),
    ('{"copy_s": 0.006, "cpu_rows": 1, "cpu_s_at_rows": [0.005]}', "cpu_rows must be a JSON list"),
    ('{"copy_s": 0.006, "cpu_rows": [1.5], "cpu_s_at_rows": [0.005]}', r"cpu_rows\[0\] must be an integer"),
    ('{"copy_s": 0.006, "cpu_rows": [4, 1], "cpu_s_at_rows": [0.005, 0.006]}', "must be ascending distinct"),
    ('{"copy_s": -1, "cpu_rows": [1], "cpu_s_at_rows": [0.005]}', "costs must be non-negative"),
])
def test_bad_hybrid_costs_are_one_error_naming_the_file(tmp_path, text, fragment):
    path = tmp_path / "costs.json"
    path.write_text(text)
    with pytest.raises(WispError, match=fragment) as err:
        read_hybrid_costs(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(WispError, match="could not read --hybrid-costs"):
        read_hybrid_costs(tmp_path / "missing.json")
