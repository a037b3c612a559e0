"""`gather_host_rows`: rows of a pinned host table copied to the GPU by a Triton kernel that reads them in place.

One program per token copies its row, BLOCK columns at a time, from the table's host memory (a
`wisp.core.kernels.uva.HostPointer`) into a device tensor: no host sync and no staging copy, so a CUDA graph can
capture it. Under Triton's interpreter (a CPU-only machine) the table and the rows are CPU tensors.

Invariant: each row is a copy of the table's row, bit for bit; an index outside the table is not read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.kernels.uva import device_view

BLOCK = 1024


@triton.jit
def _gather_rows(table_ptr, tokens_ptr, out_ptr, vocab, width, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    row = tl.load(tokens_ptr + t).to(tl.int64)
    valid = (row >= 0) & (row < vocab)
    readable = tl.where(valid, width, 0)  # columns to read: none for a token outside the table
    row = tl.where(valid, row, 0)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        values = tl.load(table_ptr + row * width + cols, mask=cols < readable, other=0)
        tl.store(out_ptr + t * width + cols, values, mask=cols < width)


def gather_host_rows(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """table [V, D] pinned in host memory (or any CPU tensor under the interpreter), tokens [T] on the device
    -> table[tokens] [T, D] on the device. A token outside [0, V) gets a row of zeros."""
    vocab, width = table.shape
    out = torch.empty((tokens.numel(), width), dtype=table.dtype, device=tokens.device)
    if tokens.numel():
        _gather_rows[(tokens.numel(),)](device_view(table, tokens.device), tokens.contiguous(), out, vocab, width,
                                        BLOCK=BLOCK)
    return out
