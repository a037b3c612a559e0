"""`TokenEmbedding`: the token embedding table, on the device or in pinned host memory (`--embedding`).

A step looks up one row per token: a decode step's few rows are kilobytes, a 2048-token prefill chunk's a
few megabytes. The table itself is vocab x hidden: 206 MB for OLMoE-1B-7B, 622 MB for Qwen3-30B-A3B,
1.2 GB for gpt-oss-120b in bf16, all of it VRAM that could hold experts or KV blocks. So where a GPU runs
the model and the LM head is a separate matrix, the table stays in pinned host memory (as llama.cpp keeps
its token embeddings on the CPU) and a Triton kernel reads each token's row in place over PCIe
(`wisp.core.kernels.uva`), inside CUDA graphs too. A tied table is the LM head as well, which reads all of it every
step: it stays on the device.

Invariants: the rows are copies, bit for bit, wherever the table lives; a host table is pinned (the kernel
reads it through unified virtual addressing) and is never on the device. Token ids are checked where requests
enter the engine: an id outside the table gives a row of zeros from a host table (the device's index raises).
"""

from __future__ import annotations

import torch


def embedding_on_host(choice: str, device: torch.device, tied: bool, pinned: bool = True) -> bool:
    """Whether the table goes to pinned host memory, for `choice` in `wisp.options.EMBEDDINGS` (auto: on
    CUDA when untied). Host memory is only worth it beside a GPU; a tied table (the LM head) stays, and so
    does every table where host memory is not pinned (`pinned`: the engine's pin_memory; the GPU reads
    only pinned memory in place). The loader places the table by this, and every byte count follows it."""
    return device.type == "cuda" and not tied and pinned and choice in ("auto", "host")


class TokenEmbedding:
    def __init__(self, table: torch.Tensor, device: torch.device):
        """`table` [V, D]: on `device`, or pinned in host memory (read in place by a kernel on `device`)."""
        self.table, self.device = table, torch.device(device)
        self.on_host = table.device.type == "cpu" and self.device.type != "cpu"
        if self.on_host and not table.is_pinned():
            raise ValueError("a host embedding table must be pinned: the GPU reads it in place")

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] (on the device) -> their rows [T, D] on the device."""
        if not self.on_host:
            return self.table[tokens]
        from wisp.models.host_rows import gather_host_rows

        return gather_host_rows(self.table, tokens)
