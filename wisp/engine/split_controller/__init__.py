"""The online split controller: the VRAM split between expert slots and KV blocks re-solved while serving.

- `controller`: `SplitController`, which decides resizes from recent stack distances (`ControllerConfig`,
  `Resize`, `problem_of_plan`);
- `decayed_histogram`: the exponentially forgotten miss curve it keeps on each side;
- `lru_stack` (KV blocks) and `expert_stacks` (every MoE layer's experts, steps one or many at a time): the live
  stack distances it is fed.

`wisp.engine.live_split.LiveSplit` drives it on a running engine; `wisp.sim.controller_sim` replays it
over recorded streams. It imports the planner (wisp.plan: miss-curve semantics and the split), never the
rest of the engine.
"""
