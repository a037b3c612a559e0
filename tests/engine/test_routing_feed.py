"""RoutingFeed (wisp.engine.routing_feed) on its own: each subscriber gets its own layers' rows with each row's owner, steps begun outside the
scheduler are handed over with no owners, a graph capture's warm-up steps are dropped, and a subscriber asking
for more layers makes the feed log them from then on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from wisp.engine.routing_feed import RoutingFeed

LAYERS, K = [0, 2, 3, 5], 2


@dataclass
class Seq:
    request_id: str
    output_ids: list[int] = field(default_factory=list)


@dataclass
class Batch:
    seqs: list[Seq]
    num_tokens: list[int]


def step(feed: RoutingFeed, batch, ids: np.ndarray) -> None:
    """One forward: begin, then every MoE layer records ids[:, i] ([T, L, K] int)."""
    feed.begin_step(batch)
    for i, layer in enumerate(LAYERS):
        feed.record(layer, torch.from_numpy(ids[:, i]))


def test_subscribers_get_their_layers_with_owners_and_warm_ups_are_dropped():
    feed = RoutingFeed(LAYERS, K, torch.device("cpu"), largest_step=8)
    every, some = [], []
    feed.subscribe(lambda rows, owners: every.append((rows, owners)))
    _, grew = feed.subscribe(lambda rows, owners: some.append(rows), layers=[2, 5])
    assert not grew  # every layer was logged already
    rng = np.random.default_rng(0)
    a, b = Seq("a", [1]), Seq("b")
    steps = [rng.integers(0, 8, (3, len(LAYERS), K)) for _ in range(3)]
    step(feed, Batch([a, b], [1, 2]), steps[0])  # a decodes, b prefills two tokens
    step(feed, None, steps[1])  # a forward outside the scheduler
    feed.reset()  # a capture: what was logged before it is handed over ...
    step(feed, Batch([b, a], [1, 1]), steps[2][:2])  # ... and a step after it
    for _ in range(2):  # warm-up steps: logged, never begun
        for i, layer in enumerate(LAYERS):
            feed.record(layer, torch.zeros((1, K), dtype=torch.int64))
    feed.drain()
    assert [owners for _, owners in every] == [[("a", True), ("b", False), ("b", False)], None,
                                                [("b", False), ("a", True)]]
    for (rows, _), want in zip(every, [steps[0], steps[1], steps[2][:2]]):
        assert np.array_equal(rows, want)
    assert all(np.array_equal(rows, want[:, [1, 3]]) for rows, want in zip(some, [steps[0], steps[1], steps[2][:2]]))
    assert feed.lost == 0


def test_a_subscriber_asking_for_more_layers_grows_the_log():
    feed = RoutingFeed(LAYERS, K, torch.device("cpu"), largest_step=8)
    seen = []
    stop, grew = feed.subscribe(lambda rows, owners: seen.append(rows.shape), layers=[3])
    assert grew and feed.logged == [3]
    _, grew = feed.subscribe(lambda rows, owners: seen.append(rows.shape), layers=[0, 3])
    assert grew and feed.logged == [0, 3]
    step(feed, Batch([Seq("a", [1])], [1]), np.ones((1, len(LAYERS), K), dtype=np.int64))
    feed.drain()
    assert seen == [(1, 1, K), (1, 2, K)]
    stop()
    assert len(feed.subscribers) == 1
