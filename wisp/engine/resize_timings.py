"""How long each part of a live resize (`LLMEngine.apply_plan`) held the engine."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ResizeTimings:
    """Seconds each part of a live resize held the engine."""
    kv_s: float  # moving blocks, carrying the kept ones over, reallocating the KV tensors
    experts_s: float  # reallocating the expert scratches
    graphs_s: float  # re-capturing the decode graphs


class ResizeClock:
    """Laps of wall time, the device synchronised at each (a resize is rare; its parts are what is timed)."""

    def __init__(self, device: torch.device):
        self.device, self.last = device, time.perf_counter()

    def lap(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        lap, self.last = now - self.last, now
        return lap
