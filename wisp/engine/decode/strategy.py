"""The contract of a decode strategy, and what it may ask of the runner that drives it.

Strategies hold no reference to the runner (it is passed to `run`): a cycle between them would leave a dropped
engine's graphs and events to the garbage collector, which may run in the middle of the next engine's capture.

Invariants: `run` gets only decode batches of at most `max_batch` sequences, one token each, with no routing
observer registered; it computes exactly what the eager engine would for them (tested with torch.equal, the
CPU's rounding in hybrid modes aside) and returns each sequence's sampled token (or its `RequestFailure`);
`capture(b, capture)` is called for b from `max_batch` down to 1, while the KV pool holds the capture's scratch
block, and draws its graphs from `capture`'s shared pool.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import Protocol

import torch

from wisp.engine.decode.graphs import GraphCapture
from wisp.engine.scheduler import Batch


class DecodeRunner(Protocol):
    """What a strategy may ask of the model runner."""

    def eager_step(self, batch: Batch) -> list: ...  # the eager forward and its sampling

    def sample(self, seqs: list, logits: torch.Tensor) -> list: ...

    def graph_inputs(self, seqs: list) -> tuple[list[int], list[int], list[list[int]]]: ...

    def count(self, kind: str, batch_size: int) -> None: ...  # a "graph" or "pieces" step was run


class DecodeStrategy(ABC):
    name: str
    max_batch: int  # the largest decode batch it runs (the runner runs wider ones eagerly)
    captured = True  # it replays graphs (the LRU state lives on the device between its steps)
    chooser = None  # a `StepKindChooser` where it measures two kinds of step against each other

    def capture(self, b: int, capture: GraphCapture) -> None:
        """Capture the graphs of a b-sequence step (nothing for an eager strategy)."""

    @abstractmethod
    def run(self, batch: Batch, runner: DecodeRunner) -> list:
        """The batch's sampled tokens, one per sequence."""


class EagerDecode(DecodeStrategy):
    name = "eager"
    max_batch = sys.maxsize
    captured = False

    def run(self, batch, runner):
        return runner.eager_step(batch)
