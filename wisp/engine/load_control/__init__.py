"""Load control over expert working sets: never decode more running requests at once than their experts fit.

Paging serves one request's expert working set well, but requests decoding together route to the union of their
working sets; once that union outgrows a layer's C slots, every step reloads most of it (thrashing). Load control
is the classical cure (admit to the processor only as many processes as have working sets that fit):

- `working_sets.WorkingSets`: each running request's experts per MoE layer, from the routing of its recent decode
  tokens, and what a candidate decode set needs jointly (the per-layer union);
- `wisp.engine.routing_feed.RoutingFeed` (the engine's, shared with the live split): the step's routing logged on
  the device (CUDA graphs included) and attributed to requests on the host from the batches the engine ran;
- `step_costs.DecodeStepCosts`: a decode step's predicted seconds: compute for b rows (learned from the steps
  that ran) plus predicted misses times one expert's copy seconds (probed at load);
- `controller.LoadController`: each step, which ready requests decode (the scheduler asks it);
- `attach.LoadControl`: the controller wired to an engine (built at load where it can matter).
"""
