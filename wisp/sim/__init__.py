"""Simulation: the research behind `wisp sim`, replaying traces under policies and splits the product
does not run. Apart from the planner (wisp.plan), which keeps only what `wisp plan` and the engine need.

One concept per module:
- `policies`: one MoE layer's expert cache replayed under other replacement policies (LRU, OPT, LFU, LRFU,
  static; ARC in `adaptive_replacement`); `policy_table`: their misses summed over a trace's layers;
- `arms`: four ways to spend one pageable budget (the plan's split, 50-50, KV-blind, layer offload),
  priced by a plan's cost model;
- `controller_sim`: the online split controller (`wisp.engine.split_controller`) replayed over a request
  stream against fixed splits and a per-workflow oracle; `session_sim`: agent sessions as such streams;
  `session_arms`: the comparison `wisp sim --sessions` prints;
- `plots`: `wisp sim --plot`; `args` (torch-free) and `commands`: `wisp sim` itself.

Dependency rule (tests/test_layering.py): this package sits above the engine (its controller simulation
drives the engine's `SplitController`), beside wisp.server and wisp.bench; nothing below it imports it,
and wisp.plan never does.
"""
