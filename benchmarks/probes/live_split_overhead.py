"""Question: how much host time does the live split controller (`wisp.engine.live_split`) add to each engine
step, and does vectorising its observation path (`ExpertStacks`) cut it? Then (asked again when the controller
arm lost to the static ones on the GPU with no resize): does holding the steps and feeding them in one batch
before each re-solve (`ExpertStacks.touch_steps`) cut it further? (CPU only.)

Asked: 2026-12-01; again later, with the "held" path, part 2's per-step baseline and part 3.

Answer (held): mean host time a step over the same stream, per-step `ExpertStacks` -> held, OLMoE-like
239-279 -> 75-76 us, Qwen3-like 599-669 -> 326-341 us (a step between re-solves 1-2 us; the re-solve step pays
the batch); `after_step` inside the OLMoE-shaped engine 415 -> 87 us; part 3 on the agentinfer log, the KV
stack bounded at 2,605 keys: 11.4 -> 0.85 ms a request. Histograms identical on every path. Record and
reading: docs/decisions/live-split-feeds-the-controller-in-bulk.md.

Answer (commit caf3d71, which added this probe with the vectorised path; a loaded 2-core CPU): host time a
step, the per-layer loop against `ExpertStacks`, decode 537 -> 162 us (OLMoE-like) and 4557 -> 563 us
(Qwen3-like), a 256-token prefill chunk 1352 -> 443 and 14697 -> 1497 us; `LiveSplit.after_step` inside an
OLMoE-shaped CPU engine 1355 -> 654 us a step. Both paths feed identical distances
(tests/plan/test_expert_stacks.py).

1. The observation path at model sizes, without an engine: a step's routed rows [T, L, K] become each
   layer's stack distances (`ExpertStacks`), go into the controller's decayed histogram, and the
   controller steps (a re-solve every `resolve_every` steps). OLMoE-like (16 MoE layers, 64 experts,
   top-8) and Qwen3-like (48 layers, 128 experts, top-8); decode steps of 4 tokens, a prefill chunk of
   256 tokens every 16th step; Zipf-like routing. The "per-layer loop" rows time the code this replaced
   (one `LruStack` per layer touched in `order_by_last_token` order, one `DecayedHistogram.add` per
   reference) on the same steps; both feed identical distances (tests/plan/test_expert_stacks.py).
   The "held" rows hold each step and feed the batch just before a re-solve, as `LiveSplit` does now.
2. `LLMEngine.step` with replayed routing (as `wisp bench agent` runs the controller arm), without the live
   split, with it feeding every step (`HELD_TOKENS` = 1) and holding steps, and the time inside
   `LiveSplit.after_step`: on the demo checkpoint, or on a
   tiny random one shaped like OLMoE's routing (16 MoE layers, 64 experts, top-8; `--engine olmoe-shaped`,
   about 2 minutes). Between engine steps the controller's numpy runs with cold caches, so each array
   operation costs several times what part 1 measures: fewer operations matter more than smaller ones.
3. (`--kv-sessions FILE`) the KV side of each request (`LiveSplit.observe_request`) on a session log, the
   KV stack unbounded and bounded at `--kv-capacity`.

    PYTHONPATH=. python benchmarks/probes/live_split_overhead.py [--steps 400] [--profile] [--engine olmoe-shaped]
        [--kv-sessions ../shared/data/agent_sessions/agentinfer_trace_requests.jsonl]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np

from wisp.core.experts.recency import order_by_last_token
from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.engine.split_controller.expert_stacks import ExpertStacks
from wisp.engine.split_controller.lru_stack import LruStack
from wisp.plan.split import SplitProblem

SHAPES = {"olmoe-like": (16, 64, 8), "qwen3-like": (48, 128, 8)}  # MoE layers, experts, top-k


def controller(num_experts: int, top_k: int) -> SplitController:
    """The bench's controller settings (wisp bench agent's defaults) on a made-up budget."""
    p = SplitProblem(budget_bytes=num_experts * 500 + 2000 * 100, slot_bytes=1000, block_bytes=100,
                     expert_cost=1e-3, kv_cost=1e-3, min_cap=top_k, max_cap=num_experts, kv_floor=100)
    config = ControllerConfig(p, resolve_every=32, min_gain=0.05, half_life=20000.0, min_observations=2000)
    return SplitController(config, expert_cap=num_experts // 4, kv_blocks=p.kv_blocks(num_experts // 4))


def routing_steps(layers: int, experts: int, top_k: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    log_weight = -0.8 * np.log(np.arange(1, experts + 1))
    popularity = np.stack([rng.permutation(experts) for _ in range(layers)])  # per layer: rank -> expert
    out = []
    for i in range(steps):
        t = 256 if i % 16 == 0 else 4
        ranks = np.argpartition(-(rng.gumbel(size=(t, layers, experts)) + log_weight), top_k, axis=2)[:, :, :top_k]
        routed = np.take_along_axis(np.broadcast_to(popularity, (t, layers, experts)), ranks, axis=2)
        out.append(routed.astype(np.int64))
    return out


class PerLayerLoop:
    """The observation path before ExpertStacks: Python per layer and per reference."""

    def __init__(self, layers: int, experts: int, ctl: SplitController):
        self.experts, self.stacks, self.controller = experts, [LruStack() for _ in range(layers)], ctl

    def observe(self, rows: np.ndarray) -> None:
        t, layers, k = rows.shape
        last = np.full((layers, self.experts + 1), -1, dtype=np.int64)
        flat = np.where(rows >= 0, rows, self.experts) + (self.experts + 1) * np.arange(layers)[None, :, None]
        np.maximum.at(last.reshape(-1), flat.reshape(-1), np.repeat(np.arange(t), layers * k))
        distances = []
        for stack, row in zip(self.stacks, last[:, : self.experts].tolist()):
            distances += stack.touch(order_by_last_token(row))
        for d in distances:
            self.controller._experts.add(d)
        self.controller._tokens.add(len(distances), t)


class Vectorised:
    def __init__(self, layers: int, experts: int, ctl: SplitController):
        self.stacks, self.controller = ExpertStacks(layers, experts), ctl

    def observe(self, rows: np.ndarray) -> None:
        self.controller.observe_experts(self.stacks.touch(rows), rows.shape[0])

    def flush(self) -> None:
        pass


class Held(Vectorised):
    """What `LiveSplit` does: each step's rows held, fed in one `touch_steps` just before a re-solve."""

    def __init__(self, layers: int, experts: int, ctl: SplitController):
        super().__init__(layers, experts, ctl)
        self.held: list[np.ndarray] = []

    def observe(self, rows: np.ndarray) -> None:
        self.held.append(rows)
        if (self.controller.steps + 1) % self.controller.config.resolve_every == 0:
            self.flush()

    def flush(self) -> None:
        if self.held:
            tokens = [len(r) for r in self.held]
            distances, refs = self.stacks.touch_steps(np.concatenate(self.held), tokens)
            self.controller.observe_expert_steps(distances, refs, tokens)
            self.held = []


def compare(shape: tuple[int, int, int], steps: list[np.ndarray]) -> tuple[dict[str, dict[str, float]], bool]:
    """Per path, the median host microseconds of a decode and of a prefill step and the mean over all steps
    (the paths take turns on each step, so all see the same machine load), and whether their histograms
    ended identical."""
    layers, experts, top_k = shape
    paths = {"per-layer loop": PerLayerLoop(layers, experts, controller(experts, top_k)),
             "vectorised": Vectorised(layers, experts, controller(experts, top_k)),
             "held": Held(layers, experts, controller(experts, top_k))}
    spent = {name: {"decode": [], "prefill": []} for name in paths}
    for rows in steps:
        kind = "prefill" if len(rows) > 4 else "decode"
        for name, path in paths.items():
            start = time.perf_counter()
            path.observe(rows)
            path.controller.step()
            spent[name][kind].append(time.perf_counter() - start)
    stats = {name: {**{kind: 1e6 * float(np.median(t)) for kind, t in by_kind.items()},
                    "mean": 1e6 * float(np.mean(by_kind["decode"] + by_kind["prefill"]))}
             for name, by_kind in spent.items()}
    paths["held"].flush()
    weights = [path.controller._experts.weights() for path in paths.values()]
    return stats, all(np.array_equal(weights[0], w) for w in weights[1:])


def olmoe_shaped_checkpoint(folder: Path) -> Path:
    """A tiny random checkpoint with OLMoE's routing shape (layers, experts, top-k), in `folder`."""
    from wisp.models.demo import DEMO_CONFIG
    from wisp.models.random_checkpoint import write_random_checkpoint

    shape = {"num_hidden_layers": 16, "num_experts": 64, "num_experts_per_tok": 8, "hidden_size": 32, "head_dim": 8,
             "intermediate_size": 32, "moe_intermediate_size": 8}
    write_random_checkpoint({**DEMO_CONFIG, **shape}, folder, seed=1)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 256}))
    return folder


def engine_steps(model: str, live: bool, requests: int = 12, held: bool = True) -> tuple[float, float, int]:
    """(mean LLMEngine.step seconds, mean after_step seconds, steps) on checkpoint `model`; `held` False feeds
    the controller after every step (the live split before it held steps for a bulk update)."""
    import wisp.engine.live_split as live_split

    from wisp.config import EngineConfig
    from wisp.engine.engine import LLMEngine
    from wisp.engine.sampling import SamplingParams
    from wisp.trace.format import RoutingTrace
    from wisp.trace.session_replay import SessionRoutingReplay

    engine = LLMEngine(EngineConfig(model=model, device="cpu", mode="paged", expert_cap=8, max_model_len=256,
                                    max_concurrency=4, kv_blocks=64, max_num_batched_tokens=64))
    cfg = engine.model_config
    rng = np.random.default_rng(0)
    ids = np.stack([[rng.permutation(cfg.num_experts)[: cfg.top_k] for _ in cfg.moe_layer_ids] for _ in range(997)])
    replay = SessionRoutingReplay(RoutingTrace(ids, layers=list(cfg.moe_layer_ids), num_experts=cfg.num_experts),
                                  list(cfg.moe_layer_ids), cfg.num_experts, cfg.top_k, engine.device, 68)
    engine.runner.set_routing_replay(replay)
    live_split.HELD_TOKENS = 8192 if held else 1
    inside = []
    if live:
        slot = len(cfg.moe_layer_ids) * cfg.expert_bytes
        p = SplitProblem(12 * slot + 64 * engine.block_bytes, slot, engine.block_bytes, 1e-3, 1e-3, cfg.top_k,
                         cfg.num_experts, engine.floor_blocks)
        ctl = SplitController(ControllerConfig(p, resolve_every=32, min_gain=0.05, half_life=20000.0,
                                               min_observations=2000), 8, p.kv_blocks(8))
        engine.set_live_split(ctl)
        after_step = engine.live_split.after_step

        def timed(tokens: int):
            start = time.perf_counter()
            out = after_step(tokens)
            inside.append(time.perf_counter() - start)
            return out

        engine.live_split.after_step = timed
    for j in range(requests):
        engine.add_request(f"r{j}", [(7 * i + j) % 250 for i in range(40 + 8 * j)],
                           SamplingParams(max_tokens=48, ignore_eos=True))
        replay.assign(f"r{j}", 83 * j)
    spent = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        spent.append(time.perf_counter() - start)
    return float(np.mean(spent)), float(np.mean(inside)) if inside else 0.0, len(spent)


def kv_observation(sessions_file: str, capacity: int) -> None:
    """What `LiveSplit.observe_request` does with each turn's prompt (chain keys of its full blocks, then
    the KV stack's distances), on a long session log, the stack unbounded and bounded at `capacity`."""
    from wisp.bench.agent_sessions import load_sessions
    from wisp.engine.block_pool import chain_hash

    sessions = load_sessions([sessions_file], None, 64, 1 << 20, 50_000)
    turns = sorted(((k, i, t) for i, s in enumerate(sessions) for k, t in enumerate(s.turns)), key=lambda x: x[:2])
    hashing, keys = [], []
    for *_, turn in turns:
        start, parent, chain = time.perf_counter(), None, []
        for i in range(len(turn.prompt_ids) // 16):
            parent = chain_hash(parent, turn.prompt_ids[i * 16 : (i + 1) * 16])
            chain.append(parent)
        hashing.append(time.perf_counter() - start)
        keys.append(chain)
    print(f"KV side, {len(turns)} requests of {Path(sessions_file).name}: chain keys {1e3 * np.mean(hashing):.2f} ms "
          f"a request")
    for bound in (None, capacity):
        stack, spent = LruStack(bound), []
        for chain in keys:
            start = time.perf_counter()
            stack.touch_blocks(chain)
            spent.append(time.perf_counter() - start)
        print(f"  stack {'unbounded' if bound is None else f'bounded at {bound}'}: {len(stack)} keys at the end, "
              f"{1e3 * np.mean(spent):.2f} ms a request (last 100: {1e3 * np.mean(spent[-100:]):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--profile", action="store_true", help="cProfile the vectorised path (qwen3-like)")
    ap.add_argument("--engine", choices=("demo", "olmoe-shaped", "none"), default="demo",
                    help="the checkpoint part 2 steps (none: skip it)")
    ap.add_argument("--kv-sessions", default=None, metavar="FILE",
                    help="also time the KV side on this session log (e.g. ../shared/data/agent_sessions/"
                         "agentinfer_trace_requests.jsonl)")
    ap.add_argument("--kv-capacity", type=int, default=2605,
                    help="the bound (OLMoE-1B-7B at 8 GiB: the KV blocks beside top_k slots)")
    args = ap.parse_args()
    if args.kv_sessions:
        kv_observation(args.kv_sessions, args.kv_capacity)
    for name, shape in SHAPES.items():
        stats, same = compare(shape, routing_steps(*shape, args.steps))
        for label, m in stats.items():
            print(f"{name:11s} {label:15s} median decode (4 tokens) {m['decode']:6.0f} us/step   "
                  f"prefill (256 tokens) {m['prefill']:6.0f} us/step   mean {m['mean']:6.0f} us/step")
        print(f"{name:11s} histograms identical: {same}")
    if args.profile:
        steps = routing_steps(*SHAPES["qwen3-like"], args.steps)
        profile = cProfile.Profile()
        layers, experts, top_k = SHAPES["qwen3-like"]
        path = Vectorised(layers, experts, controller(experts, top_k))
        profile.runcall(lambda: [(path.observe(rows), path.controller.step()) for rows in steps])
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    if args.engine != "none":
        import torch

        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory() as folder:
            model = "demo" if args.engine == "demo" else str(olmoe_shaped_checkpoint(Path(folder)))
            plain, _, n = engine_steps(model, live=False)
            every, every_inside, _ = engine_steps(model, live=True, held=False)
            live, inside, _ = engine_steps(model, live=True)
        print(f"{args.engine} engine ({n} steps): step {plain * 1e3:.2f} ms without the live split, "
              f"{every * 1e3:.2f} ms with it feeding every step (after_step {every_inside * 1e6:.0f} us/step), "
              f"{live * 1e3:.2f} ms with it holding steps for a re-solve (after_step {inside * 1e6:.0f} us/step)")


if __name__ == "__main__":
    main()
