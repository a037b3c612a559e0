"""LoadControl: the load controller wired to a running engine (`wisp.engine.engine.LLMEngine`).

It is built at load when it can matter (`load_control_for`): `--load-control on`, more than one request may run,
and some MoE layer pages its experts through fewer slots than it has experts; or `--load-control width:N` (the
fixed-width baseline) with more than one request. Then:
- the scheduler asks `gate(ready)` which ready requests decode each step (`LoadController.choose`);
- the engine's `RoutingFeed` hands it each step's routing, and its decode rows go to each request's working set
  (drained every `drain_every` steps, and before every choice that reads the working sets);
- after each decode-only step the engine reports its width and seconds (`after_step`), from which the step's
  compute is learned; a finished request is forgotten (`forget`);
- a miss is priced at one expert's copy, or with hybrid's CPU beside the link at the two servers' joint rate.

Invariant: with load control off, or where it cannot matter, the engine has none and schedules as before.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from wisp.engine.load_control.controller import LoadController, LoadControlState
from wisp.engine.routing_feed import Owners
from wisp.engine.load_control.step_costs import DecodeStepCosts
from wisp.engine.load_control.working_sets import WorkingSets

NOMINAL_SECONDS_PER_BYTE = 1e-10  # 10 GB/s: the copy cost assumed where there is no host-device link to probe


SAMPLED_LAYERS = 8  # MoE layers whose routing the working sets are read from (evenly spaced; all if fewer)


class LoadControl:
    def __init__(self, controller: LoadController, engine, layers: list[int], drain_every: int = 4):
        self.controller, self.drain_every, self.layers = controller, drain_every, layers
        self._steps = 0
        engine.subscribe_routing(self._observe, layers)  # for the engine's life
        self.feed = engine.feed

    def gate(self, ready: list) -> list:
        """The scheduler's question: which of `ready` decode this step."""
        if len(ready) > 1 and self._steps % self.drain_every == 0:
            self.feed.drain()
        self._steps += 1
        return self.controller.choose(ready, time.perf_counter())

    def set_caps(self, caps: dict[int, int]) -> None:
        """The slots of each MoE layer changed (a plan applied while serving): predict with the new ones."""
        self.controller.caps = np.asarray([caps[li] for li in self.layers], dtype=np.float64)

    def after_step(self, width: int, seconds: float) -> None:
        self.controller.observe_step(width, seconds)

    def forget(self, request_id: str) -> None:
        self.controller.forget(request_id)

    def state(self) -> LoadControlState:
        return self.controller.state()

    def _observe(self, rows: np.ndarray, owners: Owners) -> None:
        if owners is None:
            return
        by_request: dict[str, list[int]] = {}
        for i, (request_id, decode) in enumerate(owners):
            if decode:
                by_request.setdefault(request_id, []).append(i)
        for request_id, where in by_request.items():
            self.controller.ws.observe(request_id, rows[where])


def miss_seconds(store, device: torch.device) -> float:
    """What one miss costs a decode step: one expert's copy seconds, probed on CUDA (64 MiB, pinned), nominal
    elsewhere; with hybrid's CPU beside the link (`store.cpu`), its probed costs, the two serving misses at once
    (1 / (1 / copy + 1 / one expert's one row on the CPU))."""
    if store.cpu is not None:
        costs = store.cpu.costs
        return 1 / (1 / max(costs.copy_s, 1e-9) + 1 / max(costs.cpu_s(1), 1e-9))
    return copy_seconds(store.expert_bytes, device)


def copy_seconds(expert_bytes: int, device: torch.device) -> float:
    """One expert's host -> device copy seconds: probed on CUDA (64 MiB, pinned), nominal elsewhere."""
    if device.type != "cuda":
        return expert_bytes * NOMINAL_SECONDS_PER_BYTE
    from wisp.plan.probes import probe_seconds_per_byte

    return expert_bytes * probe_seconds_per_byte(device, 64 << 20)


def load_control_for(engine) -> LoadControl | None:
    """The engine's load control, or None where it cannot matter (see the module docstring). Its working sets
    are read at `SAMPLED_LAYERS` evenly spaced MoE layers (the log costs a launch a layer inside every decode
    graph), and the predicted misses scaled to every layer."""
    config, cfg = engine.config, engine.model_config
    stores = {li: engine.model.experts[li] for li in cfg.moe_layer_ids}
    caps = {li: s.slots if s.slots is not None else cfg.num_experts for li, s in stores.items()}
    fixed = int(config.load_control.split(":")[1]) if config.load_control.startswith("width:") else None
    if config.load_control == "off" or config.max_concurrency < 2:
        return None
    if fixed is None and min(caps.values(), default=cfg.num_experts) >= cfg.num_experts:
        return None  # every joint working set fits
    layers = cfg.moe_layer_ids[:: -(-len(stores) // SAMPLED_LAYERS)]
    sets = WorkingSets(len(layers), cfg.num_experts, cfg.top_k)
    costs = DecodeStepCosts(copy_s=miss_seconds(next(iter(stores.values())), engine.device))
    controller = LoadController(sets, costs, [caps[li] for li in layers], config.max_decode_wait_ms / 1e3,
                                layer_scale=len(stores) / len(layers), fixed_width=fixed)
    return LoadControl(controller, engine, layers)
