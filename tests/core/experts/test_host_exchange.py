"""HostExchange: hybrid's trips to the host and back, bit for bit, without a buffer rewritten under a copy."""

import torch

from wisp.core.experts.host_exchange import HostExchange


def test_a_round_trip_is_bit_exact_for_every_dtype_and_shape(device):
    exchange = HostExchange(torch.device(device))
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 2048), (3, 5), (0, 4), (64, 8)]:
        hidden = torch.randn(shape, generator=g).to(torch.bfloat16).to(device)
        ids = torch.randint(0, 64, shape, generator=g).to(device)
        hidden_host, ids_host = exchange.to_host(hidden, ids)
        assert hidden_host.device.type == "cpu" and hidden_host.dtype == torch.bfloat16 and hidden_host.shape == shape
        assert torch.equal(hidden_host, hidden.cpu()) and torch.equal(ids_host, ids.cpu())
        rows = torch.randn(shape, generator=g)
        (rows_dev,) = exchange.to_device(rows)
        assert rows_dev.device == hidden.device and torch.equal(rows_dev.cpu(), rows)


def test_a_second_send_does_not_rewrite_the_first_in_flight(device):
    """Two sends back to back reuse one pinned buffer: the second waits for the first's copy."""
    exchange = HostExchange(torch.device(device))
    first = torch.arange(1 << 20, dtype=torch.float32)
    second = -first
    if device == "cuda":
        torch.cuda._sleep(100_000_000)  # the stream busy: the first copy waits while the host goes on
    (a,) = exchange.to_device(first)
    (b,) = exchange.to_device(second)
    assert torch.equal(a.cpu(), first) and torch.equal(b.cpu(), second)


def test_host_views_hold_the_latest_read_and_grow_with_it(device):
    exchange = HostExchange(torch.device(device))
    (small,) = exchange.to_host(torch.ones(4, device=device))
    (big,) = exchange.to_host(torch.full((1 << 16,), 7.0, device=device))
    assert big.shape == (1 << 16,) and bool((big == 7).all())
    if device == "cuda":
        assert big.is_pinned()
    else:  # on the CPU nothing moves: the tensors themselves come back
        assert bool((small == 1).all())
