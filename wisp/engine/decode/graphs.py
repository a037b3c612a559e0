"""What every captured decode strategy shares: the static input buffers a graph reads (`GraphInputs`) and the
warm-up stream and memory pool its graphs are captured with (`GraphCapture`).

Invariants: inputs are staged through one pinned buffer, rewritten only after the previous step's copy out of
it has been made (no host sync otherwise); every graph of one capture shares one pool, captured largest batch
first, so the smaller ones reuse its memory; warm-ups run on the caller's stream, one for every re-capture
(torch keeps a cuBLAS workspace per stream used, so a new stream per capture would leak one each time).
"""

from __future__ import annotations

from typing import Callable

import torch


class GraphInputs:
    def __init__(self, device: torch.device, max_batch: int, max_blocks: int, scratch_block: int):
        """Static buffers for up to `max_batch` sequences of up to `max_blocks` KV blocks; every table entry starts
        as `scratch_block`, a block the capturer holds meanwhile, so a capture never touches another request's KV."""
        self.device, self.max_batch = device, max_batch
        self.tokens = torch.zeros((max_batch,), dtype=torch.int64, device=device)
        self.positions = torch.zeros((max_batch,), dtype=torch.int64, device=device)
        self.tables = torch.full((max_batch, max_blocks), scratch_block, dtype=torch.int32, device=device)
        self._staging = torch.zeros((max_batch * (2 + max_blocks),), dtype=torch.int64, pin_memory=True)
        self._staged = torch.cuda.Event()  # the last copy out of the staging buffer

    def stage(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> int:
        """Copy a step's inputs into the static buffers (through pinned staging, no sync); returns B."""
        b, width = len(tokens), self.tables.shape[1]
        flat = list(tokens) + list(positions)
        for table in tables:
            flat += table + [0] * (width - len(table))
        self._staged.synchronize()  # the previous step's copy has left the staging buffer
        staged = self._staging[: len(flat)]
        staged.copy_(torch.tensor(flat, dtype=torch.int64))
        with torch.cuda.device(self.device):
            dev = staged.to(self.device, non_blocking=True)
            self._staged.record()
            self.tokens[:b].copy_(dev[:b])
            self.positions[:b].copy_(dev[b : 2 * b])
            self.tables[:b].copy_(dev[2 * b :].view(b, width))
        return b


class GraphCapture:
    def __init__(self, warm_up_stream: torch.cuda.Stream):
        self.stream = warm_up_stream
        self.pool = None  # the memory pool every graph of this capture shares

    def graph_of(self, body: Callable):
        """(graph, its outputs): `body` warmed up on the warm-up stream, then captured into the shared pool."""
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: compiles kernels, creates cuBLAS handles, device state
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = body()
        self.pool = graph.pool()
        return graph, out
