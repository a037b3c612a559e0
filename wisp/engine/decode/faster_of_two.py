"""`FasterOfTwo`: a hybrid decode step run as the faster of two strategies, measured per batch size: the one the
CPU may help (the graph's pieces with the experts, or the CPU's ranks, between them) and the whole graph (no CPU
help, no launch cost). `StepKindChooser` (`wisp.engine.decode.step_kinds`) keeps the times and decides.

A step the CPU could not help (`MoEDecoder.graph_step_ok`) is the whole graph, untimed; a step the chooser gives to
the helped kind but whose helper declines it (`prefers_whole_graph`: no rank worth the CPU's while) is the whole
graph too, timed as what it is. Each step's time includes its sampling (which waits for the device).

Invariant: the choice changes which steps use the CPU, never a token beyond the CPU's rounding.
"""

from __future__ import annotations

import time

from wisp.engine.decode.step_kinds import EAGER, GRAPH, StepKindChooser
from wisp.engine.decode.strategy import DecodeStrategy
from wisp.models.moe_decoder import MoEDecoder


class FasterOfTwo(DecodeStrategy):
    def __init__(self, helped: DecodeStrategy, whole: DecodeStrategy, model: MoEDecoder,
                 chooser: StepKindChooser | None = None):
        self.helped, self.whole, self.model = helped, whole, model
        self.chooser = chooser or StepKindChooser()  # per batch size, both kinds' times and the decision
        self.max_batch = min(helped.max_batch, whole.max_batch)
        self.name = f"faster of {helped.name} and {whole.name}"

    def capture(self, b, capture):
        self.whole.capture(b, capture)  # the whole step first, then its pieces, as one pool
        self.helped.capture(b, capture)

    def run(self, batch, runner):
        b = len(batch.seqs)
        if self.model.graph_step_ok(b):  # nothing the CPU could do better
            return self.whole.run(batch, runner)
        kind, start = self.chooser.pick(b), time.perf_counter()
        if kind == EAGER and self.helped.prefers_whole_graph(b):
            kind = GRAPH
        out = self.whole.run(batch, runner) if kind == GRAPH else self.helped.run(batch, runner)
        self.chooser.record(b, kind, time.perf_counter() - start)
        return out
