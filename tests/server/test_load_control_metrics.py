"""/metrics exports what load control chose: the decode width, the requests held back, the decoding set's
predicted joint working set, and how often it changed the set; an engine without load control exports none."""

from __future__ import annotations

from tests.engine.load_control.test_engine_load_control import engine as load_controlled_engine
from tests.engine.load_control.test_engine_load_control import run
from wisp.engine.load_control.step_costs import DecodeStepCosts
from wisp.server.metrics import ServerMetrics


def test_metrics_show_what_load_control_chose(device):
    eng = load_controlled_engine(device, "torch", cap=4, wait_ms=200.0)
    eng.load_control.controller.costs = DecodeStepCosts(copy_s=5e-3)
    run(eng, [0, 0, 0, 0], max_tokens=16)
    state = eng.stats()["load_control"]
    body = ServerMetrics(eng.stats).render()[0].decode()
    assert f"wisp_decode_width {float(state['decode_width'])}" in body
    assert f"wisp_decode_held_back {float(state['held_back'])}" in body
    assert f"wisp_decode_joint_working_set {float(state['joint_working_set'])}" in body
    assert f"wisp_decode_set_switches_total {float(state['switches'])}" in body and state["switches"] > 0


def test_no_load_control_metrics_without_it(device):
    eng = load_controlled_engine(device, "torch", cap=4, control="off")
    assert "wisp_decode_width" not in ServerMetrics(eng.stats).render()[0].decode()
