"""/metrics exports what the online split controller decides from (marginal values, per-layer hit rates,
the admission floor) and every recent resize."""

from __future__ import annotations

from tests.engine.test_live_split import PARAMS, PROMPTS, _controller, _engine
from wisp.server.metrics import ServerMetrics


def test_metrics_show_the_controller_and_each_layer(device):
    engine = _engine(device, "torch")
    engine.set_live_split(_controller(engine))
    for j, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{j}", prompt, PARAMS)
    while engine.has_unfinished():
        engine.step()
    body = ServerMetrics(engine.stats).render()[0].decode()
    assert f"wisp_kv_admission_floor_blocks {float(engine.floor_blocks)}" in body
    assert 'wisp_split_marginal_value_seconds_per_byte{side="expert_slots"}' in body
    assert 'wisp_split_marginal_value_seconds_per_byte{side="kv_blocks"}' in body
    assert all(f'wisp_expert_layer_hit_rate{{layer="{li}"}}' in body for li in engine.model.experts)
    event = engine.live_split.events[-1]
    assert f"wisp_split_resizes_total {float(len(engine.live_split.events))}" in body
    assert f'to_cap="{event.resize.to_cap}"' in body and "wisp_split_last_resize_stall_seconds{" in body
    assert f"wisp_split_last_resize_at_seconds {event.at_s}" in body
