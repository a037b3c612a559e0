"""`HostExchange`: a hybrid layer's small trips between the device and the host, through pinned buffers.

A CPU-helped decode step crosses the link three times per MoE layer: the routing and the hidden rows go to
the host (the CPU assignment and the CPU's experts need them), and the CPU's pair outputs come back. Done
with `.cpu()` and `.to(device)` that is two blocking reads and two blocking pageable writes, each a host sync.
Here every trip goes through a pinned buffer kept for the purpose: `to_host` enqueues all its copies and
waits once; `to_device` enqueues its copies and does not wait
(why: docs/decisions/host-trips-through-pinned-buffers.md).

Invariants:
- `to_host` returns views of its buffers, valid until the next `to_host`; after it returns, every
  copy `to_device` enqueued before has landed (it waits on the current stream, where they were enqueued),
  and `to_device` also waits for its own previous copies before it refills its buffers, so a buffer is
  never rewritten while a copy still reads it;
- values are copied, never converted: what lands is bit for bit what was sent;
- on a CPU device both are the identity (the tensors already are on the host).
"""

from __future__ import annotations

import torch


class HostExchange:
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}  # (direction, index) -> pinned bytes
        self._sent: torch.cuda.Event | None = None  # the last `to_device`'s copies

    def _buffer(self, direction: str, index: int, like: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor shaped and typed as `like`, over a byte buffer that only grows."""
        nbytes = like.numel() * like.element_size()
        buf = self._buffers.get((direction, index))
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty((max(nbytes, 2 * (buf.numel() if buf is not None else 0)),), dtype=torch.uint8,
                              pin_memory=True)
            self._buffers[(direction, index)] = buf
        return buf[:nbytes].view(like.dtype).view(like.shape)

    def to_host(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """The device tensors' values on the host, read with one wait for all of them."""
        if not self.cuda:
            return list(tensors)
        outs = [self._buffer("to_host", i, t).copy_(t, non_blocking=True) for i, t in enumerate(tensors)]
        torch.cuda.current_stream(self.device).synchronize()
        return outs

    def to_device(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Device copies of the host tensors, enqueued on the current stream without waiting."""
        if not self.cuda:
            return list(tensors)
        if self._sent is not None:
            self._sent.synchronize()  # the previous copies have left the buffers
        staged = [self._buffer("to_device", i, t).copy_(t) for i, t in enumerate(tensors)]
        outs = [s.to(self.device, non_blocking=True) for s in staged]
        self._sent = torch.cuda.current_stream(self.device).record_event()
        return outs
