"""Decode strategies: how a decode batch runs, one strategy chosen when the graphs are captured (`select`).

- `EagerDecode`: the model's eager forward (no graphs: CPU runs, `--enforce-eager`, or a backend that cannot be
  captured);
- `WholeGraph`: one CUDA graph per batch size for the whole step, paging included (`whole_graph`);
- `PiecesWithEagerExperts`: graphs of the pieces between MoE layers' experts, the experts run eagerly between
  them (hybrid: the CPU may serve misses, `pieces`);
- `PiecesWithCpuRanks`: the pieces, each layer's GPU pairs as a graph of its own, the CPU's share of ranks on the
  host between them (hybrid-zero-copy, `cpu_ranks`);
- `FasterOfTwo`: two strategies measured against each other per batch size, the faster run (`faster_of_two`).
Each strategy owns its capture (`capture(b, capture)`, graphs drawn into one shared pool, `graphs.GraphCapture`)
and its `run(batch)`, which returns the batch's sampled tokens.
"""
