"""`PiecesWithEagerExperts`: a decode step as graphs of the pieces between MoE layers' experts, the experts run
eagerly between them (hybrid: a step the CPU may help reads its routing on the host and computes some experts
there, which no graph can hold).

A piece (`MoEDecoder.forward_piece`) runs attention, norms, dense layers and the next MoE layer's routing; the
experts' output goes into a static buffer the next piece's graph reads, and a piece's outputs (the residual
stream, the rotation, the routing) stay where the next piece's graph was captured to read them.
`capture_pieces` is the capture both piece strategies share (`wisp.engine.decode.cpu_ranks` adds its hooks).

Invariant: a replay with the same experts between its pieces computes exactly what the eager engine would.
"""

from __future__ import annotations

from typing import Callable

import torch

from wisp.engine.decode.graphs import GraphCapture, GraphInputs
from wisp.engine.decode.strategy import DecodeRunner, DecodeStrategy
from wisp.engine.kv_cache import DecodeBatchKV, KVCache
from wisp.models.moe_decoder import MoEDecoder, Piece

PieceGraphs = list[tuple[torch.cuda.CUDAGraph, Piece, torch.Tensor | None]]  # (graph, its piece, logits at the end)


def capture_pieces(model: MoEDecoder, cache: KVCache, inputs: GraphInputs, routed: torch.Tensor, b: int,
                   capture: GraphCapture, send: Callable[[Piece], None] | None = None,
                   between: Callable[[Piece], Callable[[], None] | None] | None = None) -> tuple[PieceGraphs, DecodeBatchKV]:
    """One graph per piece of a b-sequence step, each replayed once after capture so that the next piece's warm-up
    reads real values (the experts' buffer `routed` between them stays zero). The first piece also computes the
    step's KV indices (`DecodeBatchKV`), which the later pieces read. `send(piece)` ends a MoE piece's graph;
    `between(piece)` captures what runs after a MoE piece and returns what the next piece's graph begins with.
    Returns the graphs and the step's KV view, whose index tensors live in the pool: keep it while they live."""
    tokens, positions, out = inputs.tokens[:b], inputs.positions[:b], routed[:b]
    pieces: PieceGraphs = []
    before, kv, head = None, None, None
    while before is None or before.layer is not None:
        def body(before=before, kv=kv, head=head):
            if head is not None:
                head()
            kv = kv or DecodeBatchKV(cache, inputs.tables[:b], positions)
            piece = model.forward_piece(tokens, positions, kv, before, None if before is None else out)
            if piece.layer is not None and send is not None:
                send(piece)
            return piece, (model.logits(piece.x) if piece.layer is None else None), kv

        graph, (piece, logits, kv) = capture.graph_of(body)
        graph.replay()
        pieces.append((graph, piece, logits))
        head = between(piece) if piece.layer is not None and between is not None else None
        before = piece
    return pieces, kv


class PieceStrategy(DecodeStrategy):
    """What both piece strategies hold: the model and KV, the static inputs, the experts' output buffer the
    pieces pass between them, and per batch size the piece graphs and their KV view."""

    def __init__(self, model: MoEDecoder, cache: KVCache, inputs: GraphInputs):
        self.model, self.cache, self.inputs = model, cache, inputs
        self.max_batch = inputs.max_batch
        self.routed = torch.zeros((inputs.max_batch, model.config.hidden_size), dtype=model.dtype,
                                  device=model.device)  # the experts' output between pieces
        self.pieces: dict[int, PieceGraphs] = {}
        self._kv: dict[int, DecodeBatchKV] = {}  # per b, the KV view the first piece writes and the others read


class PiecesWithEagerExperts(PieceStrategy):
    name = "pieces with eager experts"

    def capture(self, b: int, capture: GraphCapture) -> None:
        self.pieces[b], self._kv[b] = capture_pieces(self.model, self.cache, self.inputs, self.routed, b, capture)

    def replay(self, runner: DecodeRunner, seqs, routed_experts: Callable[[Piece], torch.Tensor]) -> torch.Tensor:
        """Replay the pieces of a len(seqs)-sequence step, `routed_experts(piece)` computing each MoE layer's
        experts between them; returns the logits [B, V] (valid until the next run)."""
        b = self.inputs.stage(*runner.graph_inputs(seqs))
        with torch.cuda.device(self.model.device):
            for graph, piece, logits in self.pieces[b]:
                graph.replay()
                if piece.layer is not None:
                    self.routed[:b].copy_(routed_experts(piece))
        return logits

    def prefers_whole_graph(self, b: int) -> bool:
        """Whether a b-sequence step would rather be the whole graph: never decided here (the runner's chooser does)."""
        return False

    def run(self, batch, runner):
        self.model.lru_state_on("host")  # the experts run on the host's LRU state, as in an eager step
        logits = self.replay(runner, batch.seqs, self.model.routed_experts)
        runner.count("pieces", len(batch.seqs))
        return runner.sample(batch.seqs, logits)
