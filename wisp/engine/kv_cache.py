"""A plain contiguous KV cache for one sequence (the paged block pool replaces it later).

k, v: [num_layers, num_kv_heads, max_len, head_dim]; positions 0..length-1 are valid.
"""

from __future__ import annotations

import torch


class SequenceKV:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype, device):
        shape = (num_layers, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
