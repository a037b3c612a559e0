"""Planning: splitting a VRAM budget between the expert scratch and the KV pool, before serving.

One concept per module:
- `miss_curves`: exact LRU miss curves of the expert and KV streams (stack distances, one pass);
- `split`: one pageable budget split between expert slots and KV blocks (exact optimum, equimarginal
  cap); `per_layer`: per-layer curves from a routing trace and uneven per-layer caps;
- `sizes`: a model's byte sizes; `probes`: the measured costs; `cost_model`: seconds per miss;
  `hybrid_cost`: a cap's expected decode miss time when misses have two servers (`--mode hybrid`), from
  the per-step miss distribution (paged: exact LRU; hybrid: a replay of its policy), and the paged-or-hybrid
  advice (`wisp plan --hybrid-costs`); `hot_budget`: hybrid's hot experts sized from a budget;
- `planner`: `make_plan`, inputs -> `plan.Plan` (typed, with its JSON form); `plan_file`, `plots`;
- `args` (torch-free) and `commands`: `wisp plan`.

Elsewhere: the trace simulators behind `wisp sim` are wisp.sim; the online split controller and the
live stack distances it is fed are wisp.engine.split_controller.

Dependency rule: this package may import wisp.core, wisp.trace, wisp.models, wisp.config and
wisp.errors, never wisp.engine, wisp.sim, wisp.server, wisp.cli or wisp.bench (tests/test_layering.py);
the engine's warm-up and split controller, the simulators and the bench import it, not the other way round.

The paper's symbols and their names in code (the symbols are used nowhere else in code):

    symbol      name in code                                   meaning
    B           SplitProblem.budget_bytes, pageable_bytes      VRAM budget - non-expert weights - reserve
    M_e         expert_bytes (ModelSizes)                      bytes of one expert
    a           slot_bytes                                     one expert slot in every MoE layer
    b           block_bytes                                    one KV block across layers, K and V
    b_tok       block_size, kv_block_size                      tokens per KV block
    C           expert_cap (per_layer_caps: one per layer)     expert slots per MoE layer
    kappa       kv_blocks                                      blocks in the KV pool
    kappa_min   admission_floor_blocks, SplitProblem.kv_floor  W * ceil(L / b_tok)
    W, L        max_concurrency, max_model_len                 requests admitted at once, their length
    t_byte      seconds_per_byte                               host->device copy time per byte
    beta        recompute_seconds_per_token                    prefill time per token
    c_exp       expert_miss_seconds = M_e * t_byte             one expert miss
    c_kv        kv_miss_seconds = beta * b_tok                 one KV block miss
    m_exp, m_kv expert curve, kv curve (PlanCurves)            misses at each cap / pool size
    T(C, kappa) latency, predicted_latency_s                   seconds per request

Kept for compatibility: plan files' old cost-model keys t_byte_s, recompute_cost_s_per_token, c_exp_s
and c_kv_s (read, never written: `wisp.plan.plan`), and the flag --t-byte (a hidden alias of
--seconds-per-byte).
"""
