"""What `LLMEngine.stats()` reports: expert traffic (totals and per layer), decode step kinds, the KV pool, the
scheduler, the live split controller, and in the hybrid modes the CPU's costs and pace and the hot experts.

Invariant: the expert counters are read after one host read folds every layer's device counts in
(`sync_all_counters`), so graph steps and eager steps are counted alike.
"""

from __future__ import annotations

from dataclasses import asdict

from wisp.core.experts.counters import sum_counters
from wisp.core.experts.store import sync_all_counters


def engine_stats(engine) -> dict:
    stores = engine.model.experts
    sync_all_counters(stores.values())  # one host read for every layer's device counts
    runner = engine.runner
    return {
        **_expert_stats(engine),
        "tokens_prefilled": runner.tokens_prefilled,
        "tokens_decoded": runner.tokens_decoded,
        "graph_steps": runner.graph_steps,
        "piece_steps": runner.piece_steps,  # hybrid decode steps replayed as pieces, the CPU helping between
        "expert_device_bytes": sum(s.device_bytes for s in stores.values()),
        "expert_staging_bytes": _staging_bytes(stores.values()),  # wide steps' two buffers, shared by layers
        **_kv_stats(engine),
        "admission_floor_blocks": engine.floor_blocks,
        "split_controller": _split_stats(engine),
        "load_control": _load_control_stats(engine),
        "num_running": len(engine.scheduler.running),
        "num_waiting": len(engine.scheduler.waiting),
        "per_layer": {str(li): s.counters.as_dict() for li, s in stores.items()},
    }


def _load_control_stats(engine) -> dict | None:
    """What load control chose lately (None without it: off, or it cannot matter for this engine)."""
    if engine.load_control is None:
        return None
    return {**asdict(engine.load_control.state()), "max_decode_wait_ms": engine.config.max_decode_wait_ms}


def _split_stats(engine) -> dict | None:
    """The live split controller's state and its recent resizes (None without one)."""
    if engine.live_split is None:
        return None
    state = engine.live_split.state()
    recent = [{"step": e.resize.step, "at_s": e.at_s, "stall_s": e.stall_s, "from_cap": e.resize.from_cap,
               "to_cap": e.resize.to_cap, "from_kv_blocks": e.resize.from_kv_blocks,
               "to_kv_blocks": e.resize.to_kv_blocks, "reason": e.resize.reason} for e in engine.live_split.events[-8:]]
    return {"expert_slot_value": state.expert_slot_value, "kv_block_value": state.kv_block_value,
            "kv_floor_blocks": state.admission_floor_blocks, "admission_limit": state.admission_limit,
            "resizes": state.resizes, "recent_resizes": recent}


def _expert_stats(engine) -> dict:
    stores = engine.model.experts
    total = sum_counters(s.counters for s in stores.values())
    routed = total.hits + total.misses
    return {
        "mode": engine.config.mode,
        "expert_cap": engine.expert_cap,
        "embedding": "host" if engine.model.embed.on_host else "device",
        "expert_caps": {str(li): s.slots for li, s in stores.items() if s.slots is not None},
        "expert_hits": total.hits,
        "expert_misses": total.misses,
        "expert_evictions": total.evictions,
        "expert_loads": total.loads,
        "expert_cpu_computed": total.cpu_computed,
        "expert_prefetched": total.prefetched,
        "bytes_h2d": total.bytes_h2d,
        "moe_steps": total.steps,
        "hit_rate": total.hits / routed if routed else 0.0,
        **_hybrid_stats(engine),
    }


def _hybrid_stats(engine) -> dict:
    """The hybrid modes only: the costs their layers assign misses by, as probed at load (what `wisp plan
    --hybrid-costs` reads), the factor the CPU's costs are multiplied by now (`CpuPace`), and the median decode
    step time of each kind the runner chose between, per batch size, and the times behind it (`StepKindChooser`)."""
    cpu = next((s.cpu for s in engine.model.experts.values() if s.cpu is not None), None)
    if cpu is None:
        return {}
    kinds = engine.runner.step_kinds
    return {"hybrid_costs": asdict(cpu.costs), "hybrid_cpu_factor": round(cpu.pace.factor, 4),
            "hybrid_link_factor": round(cpu.pace.link_factor, 4),
            "hybrid_cpu_steps": asdict(cpu.pace.totals), "hybrid_step_kinds": kinds.medians(),
            "hybrid_step_windows": kinds.windows(), **_hot_stats(engine)}


def _hot_stats(engine) -> dict:
    """With hot experts only: how many a layer holds, the banks' bytes, the copies into them so far."""
    hot = [s.hot for s in engine.model.experts.values() if s.hot is not None]
    if not hot:
        return {}
    return {"hot_experts": hot[0].capacity, "hot_bytes": sum(h.bytes for h in hot), "hot_copies": sum(h.copies for h in hot)}


def _kv_stats(engine) -> dict:
    pool, kvc = engine.pool, engine.pool.counters
    return {
        "kv_block_size": pool.block_size,
        "kv_block_bytes": engine.block_bytes,
        "kv_blocks_total": pool.num_blocks,
        "kv_blocks_used": pool.num_used,
        "kv_blocks_cached": pool.num_cached,
        "kv_blocks_free": pool.num_free,
        "kv_peak_blocks_used": kvc.peak_blocks_used,
        "prefix_hit_tokens": kvc.prefix_hit_tokens,
        "prefix_miss_tokens": kvc.prefix_miss_tokens,
        "preemptions": kvc.preemptions,
    }


def _staging_bytes(stores) -> int:
    staging = {id(s.staging): s.staging for s in stores if s.staging is not None}
    return sum(b.device_bytes for b in staging.values())
