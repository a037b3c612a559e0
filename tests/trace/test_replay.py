"""RoutingReplay: each request decodes with its own trace sequence, in order and wrapping; prompt tokens keep
the router's choice; a request's routing and tokens do not depend on what shares its steps; the real Mixtral
trace's four problems replay as four requests (skipped when ../shared/data is absent)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.demo import DEMO_CONFIG
from wisp.trace.format import RoutingTrace
from wisp.trace.readers import load_any
from wisp.trace.replay import RoutingReplay

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # tests/trace/x.py -> repo -> its parent
CFG = model_config(DEMO_CONFIG)
LENGTHS = [5, 3, 7, 4]  # every request decodes past its sequence's end
PROMPTS = {f"r{j}": [(7 * i + 3 * j) % 250 for i in range(9 + 2 * j)] for j in range(4)}
PARAMS = SamplingParams(max_tokens=9, ignore_eos=True)  # 8 decode steps


def _sequence(seed: int, tokens: int) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((tokens, len(CFG.moe_layer_ids), CFG.num_experts)), axis=2)[:, :, : CFG.top_k]
    return RoutingTrace(ids, layers=CFG.moe_layer_ids, num_experts=CFG.num_experts)


TRACE = RoutingTrace.concat([_sequence(s, n) for s, n in enumerate(LENGTHS)])


class _Recording(RoutingReplay):
    """The replay, remembering each step's batch: (request id, first position, tokens, prompt length)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.batches = []

    def advance(self, batch) -> None:
        self.batches.append([(s.request_id, s.num_computed, n, len(s.prompt_ids))
                             for s, n in zip(batch.seqs, batch.num_tokens)])
        super().advance(batch)


class _Routing:
    """A routing observer: each step's routed ids [T, L, K]."""

    def __init__(self):
        self.steps = []

    def begin_step(self):
        self.steps.append([])

    def record(self, layer, topk_ids, topk_weights):
        self.steps[-1].append(topk_ids.cpu().numpy())


def _serve(prompts: dict, device: str, attention_backend: str, active: bool = True, assign: dict | None = None):
    """Serve `prompts` together: ({request: output ids}, {request: (prompt rows, output rows)}), rows [n, L, K]
    in position order, as routed."""
    engine = LLMEngine(EngineConfig(model="demo", device=device, mode="resident", max_model_len=64, max_concurrency=4,
                                    max_num_batched_tokens=16, attention_backend=attention_backend))
    replay = _Recording(TRACE, CFG.moe_layer_ids, CFG.num_experts, CFG.top_k, engine.device, 16 + 4)
    replay.active = active
    for rid, sequence in (assign or {}).items():
        replay.assign(rid, sequence)
    engine.runner.set_routing_replay(replay)
    routing = _Routing()
    engine.runner.add_routing_observer(routing)
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, PARAMS)
    seqs = {rid: engine.requests[rid] for rid in prompts}
    while engine.has_unfinished():
        engine.step()
    rows = {rid: ([], []) for rid in prompts}
    for batch, step in zip(replay.batches, routing.steps):
        ids, at = np.stack(step, axis=1), 0  # [T, L, K]
        for rid, first, n, prompt_len in batch:
            for p in range(first, first + n):
                rows[rid][p >= prompt_len].append(ids[at + p - first])
            at += n
    return ({rid: s.output_ids for rid, s in seqs.items()},
            {rid: tuple(np.array(r) for r in both) for rid, both in rows.items()})


def _own_rows(sequence: int, tokens: int) -> np.ndarray:
    ids = TRACE.sequences()[sequence].ids.astype(np.int64)
    return ids[np.arange(tokens) % len(ids)]


def test_requests_decoding_together_route_their_own_sequences_and_prompts_by_the_router(device, attention_backend):
    _, together = _serve(PROMPTS, device, attention_backend)
    _, routed = _serve(PROMPTS, device, attention_backend, active=False)
    for j, rid in enumerate(PROMPTS):  # request j first appears j-th: sequence j
        prompt_rows, output_rows = together[rid]
        assert len(output_rows) == PARAMS.max_tokens - 1 > LENGTHS[j]  # wrapped around
        assert np.array_equal(output_rows, _own_rows(j, len(output_rows)))
        assert np.array_equal(prompt_rows, routed[rid][0])  # the router's choice, as without the replay
        assert not np.array_equal(routed[rid][1], output_rows)


def test_a_requests_routing_and_tokens_do_not_depend_on_what_shares_its_steps(device, attention_backend):
    tokens, together = _serve(PROMPTS, device, attention_backend)
    for j, rid in enumerate(PROMPTS):
        alone_tokens, alone = _serve({rid: PROMPTS[rid]}, device, attention_backend, assign={rid: j})
        assert alone_tokens[rid] == tokens[rid]
        for a, b in zip(alone[rid], together[rid]):
            assert np.array_equal(a, b)


def _batch(seqs, num_tokens):
    return SimpleNamespace(seqs=seqs, num_tokens=num_tokens)


def _seq(rid: str, prompt_len: int, computed: int):
    return SimpleNamespace(request_id=rid, prompt_ids=[0] * prompt_len, num_computed=computed)


def test_requests_take_sequences_in_arrival_order_and_a_one_sequence_trace_from_their_own_start():
    one = RoutingReplay(TRACE.sequences()[2], CFG.moe_layer_ids, CFG.num_experts, CFG.top_k, torch.device("cpu"), 8)
    one.active = True
    one.advance(_batch([_seq("a", 4, 6), _seq("b", 3, 3)], [1, 1]))  # outputs 2 and 0
    assert torch.equal(one.buf[:2], torch.from_numpy(_own_rows(2, 3)[[2, 0]]))
    many = RoutingReplay(TRACE, CFG.moe_layer_ids, CFG.num_experts, CFG.top_k, torch.device("cpu"), 8)
    many.assign("x", 6)
    many.advance(_batch([_seq("a", 4, 4)], [1]))  # inactive: the router's, nobody assigned
    assert (many.buf[:1] == -1).all() and many.sequence_of == {"x": 2}
    many.active = True
    many.advance(_batch([_seq(r, 2, 2) for r in "abcdx"], [1] * 5))
    assert many.sequence_of == {"x": 2, "a": 1, "b": 2, "c": 3, "d": 0}  # i-th seen: i mod S (x counted)
    with pytest.raises(WispError):
        many.advance(_batch([_seq("e", 9, 0)], [9]))  # 9 tokens > 8 rows


def test_the_mixtral_problems_replay_as_four_requests():
    paths = [DATA / f"routing_mixtral8x7b/{name}_2_decode_TxLxK.npz" for name in ("gsm8k", "humaneval")]
    if not all(p.exists() for p in paths):
        pytest.skip(f"shared data not present: {DATA}")
    trace = RoutingTrace.concat([load_any(p) for p in paths])
    assert trace.sequence_lengths == [168, 79, 83, 255]
    replay = RoutingReplay(trace, list(range(32)), 8, 2, torch.device("cpu"), 8)
    replay.active = True
    seqs = [_seq(f"p{j}", 5, 5) for j in range(4)]
    steps = []
    for _ in range(200):  # past the shorter problems' ends
        replay.advance(_batch(seqs, [1] * 4))
        steps.append(replay.buf[:4].numpy().copy())
        for s in seqs:
            s.num_computed += 1
    for j, sequence in enumerate(trace.sequences()):
        want = sequence.ids.astype(np.int64)[np.arange(200) % sequence.num_tokens]
        assert np.array_equal(np.stack([rows[j] for rows in steps]), want)  # missing cells stay -1: the router's


class _Seq(SimpleNamespace):
    def __len__(self) -> int:
        return self.length


class _Counting(RoutingReplay):
    def __init__(self, *args):
        super().__init__(*args)
        self.loads = 0

    def load(self, index) -> None:
        self.loads += 1
        super().load(index)


def test_the_next_decode_steps_rows_are_loaded_while_a_step_computes_and_kept_only_for_that_step():
    """`prefetch` (the runner calls it before sampling) queues the rows of the decode step that would follow;
    `advance` keeps them for exactly that step (the same sequences, a token each, at the prefetched positions) and
    loads afresh for any other, so every step routes by its own rows either way."""
    replay = _Counting(TRACE, CFG.moe_layer_ids, CFG.num_experts, CFG.top_k, torch.device("cpu"), 8)
    replay.active = True
    a = _Seq(request_id="a", prompt_ids=[0] * 4, num_computed=4, length=5)  # decoding output 0 now
    replay.advance(_batch([a], [1]))
    replay.prefetch([a])  # output 1 (position len(a) = 5) while this step computes
    assert replay.loads == 2 and torch.equal(replay.buf[:1], torch.from_numpy(_own_rows(0, 2)[[1]]))
    a.num_computed, a.length = 5, 6
    replay.advance(_batch([a], [1]))  # that step came: nothing loaded again
    assert replay.loads == 2 and torch.equal(replay.buf[:1], torch.from_numpy(_own_rows(0, 2)[[1]]))
    replay.prefetch([a])  # output 2, but a second request joins instead
    b = _Seq(request_id="b", prompt_ids=[0] * 3, num_computed=3, length=4)
    a.num_computed, a.length = 6, 7
    replay.advance(_batch([a, b], [1, 1]))
    assert replay.loads == 4 and torch.equal(replay.buf[:2], torch.from_numpy(np.stack([_own_rows(0, 3)[2],
                                                                                          _own_rows(1, 1)[0]])))
    replay.prefetch([a, b])
    replay.active = False  # now inactive: the prefetched rows are not this step's
    a.num_computed, b.num_computed = 7, 4
    replay.advance(_batch([a, b], [1, 1]))
    assert replay.loads == 6 and (replay.buf[:2] == -1).all()
