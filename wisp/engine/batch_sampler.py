"""`sample_batch`: a decode step's next tokens from its logits rows, on the device the rows are on, with one read
to the host for the whole batch.

A request's row is first adjusted by its own sampler (`Sampler.prepare`: logit bias, penalties, a grammar's mask;
most rows need none and are used as they are). Then, row by row but in one batch of tensor operations:
- temperature 0: the row's argmax (the first index of its largest value), as is any row whose largest value is not
  finite;
- otherwise the row is shifted by its largest value and divided by the temperature; top-k keeps the values at least
  its k-th largest, top-p the values at least the smallest of the fewest largest values whose probabilities
  (softmax of the kept values, summed largest first) reach p; ties at either edge are kept;
- then the token is drawn by the Gumbel-max rule: the argmax of the kept values plus -log(-log(u)), u uniform in
  [0, 1), one float64 per token of the vocabulary, from the request's own generator on the rows' device
  (`Sampler.noise`), which is drawn from exactly once per token the request samples (the caller draws it, row by
  row, so a request whose draw fails fails alone and takes no draw from another).

Invariants: a request's token depends only on its own row, parameters, seed and how many tokens it has sampled, never
on the other rows of the batch (every operation is row-wise, over rows of one length, and the noise is the request's
own); a greedy row's token is its argmax whatever else the batch holds. Nothing is read back to the host here: the
caller reads the tokens, once a batch (docs/decisions/sampling-draws-on-the-device.md says what that replaced).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from wisp.engine.sampling import SamplingParams


def sample_batch(rows: torch.Tensor, params: Sequence["SamplingParams"],
                 noise: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """rows [S, V] float32 (each request's row, already adjusted), with each request's parameters and its uniform
    draws [V] (`Sampler.noise`; None for a greedy row) -> the S tokens [S] int64 on the rows' device. Launched
    without waiting on the device where every drawn row shares its parameters (`_per_row`); the rows are selected
    only where some are greedy."""
    tokens = rows.argmax(-1)  # [S]: the greedy answer, kept where a row samples nothing
    drawn = [i for i, p in enumerate(params) if p.temperature > 0]
    if not drawn:
        return tokens
    kept = [params[i] for i in drawn]
    every = len(drawn) == len(params)
    index = None if every else torch.tensor(drawn, device=rows.device)
    sub = rows if every else rows.index_select(0, index)  # [R, V]
    top = sub.max(-1, keepdim=True).values  # [R, 1]
    scaled = (sub - top) / _per_row([p.temperature for p in kept], rows.device)  # the largest value 0 where finite
    scaled = _top_k(scaled, [p.top_k for p in kept])
    scaled = _top_p(scaled, [p.top_p for p in kept])
    gumbel = torch.stack([noise[i] for i in drawn]).log_().neg_().log_().neg_()  # [R, V] float64: -log(-log(u))
    choice = gumbel.add_(scaled).argmax(-1)  # [R]; in place: the noise takes one [R, V] float64, no more
    if every:
        return torch.where(torch.isfinite(top[:, 0]), choice, tokens)
    choice = torch.where(torch.isfinite(top[:, 0]), choice, tokens.index_select(0, index))
    return tokens.index_copy(0, index, choice)


def _per_row(values: list, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A parameter of each row as a device tensor: [1, 1] filled on the device where every row has one value (nothing
    copied, nothing waited for), else [R, 1] copied. Always a tensor: CUDA divides by a host scalar through its
    reciprocal, which rounds otherwise than dividing by a tensor, and a row's bits must not depend on its batch."""
    if all(v == values[0] for v in values):
        return torch.full((1, 1), values[0], dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, device=device)[:, None]


def _top_k(scaled: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Each row's values below its k-th largest set to -inf (k 0 or at least V: none)."""
    width = scaled.shape[1]
    ks = [k if 0 < k < width else 0 for k in ks]  # 0: no limit
    if not any(ks):
        return scaled
    most = max(ks)
    largest = scaled.topk(most, dim=-1).values  # [R, most], descending
    if all(k == most for k in ks):
        return scaled.masked_fill(scaled < largest[:, most - 1 :], float("-inf"))
    k = _per_row(ks, scaled.device, torch.int64)
    kth = largest.gather(1, k.clamp(min=1) - 1)  # [R, 1]; a row without top-k compares with its largest value
    return scaled.masked_fill((scaled < kth) & (k > 0), float("-inf"))


def _top_p(scaled: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Each row's values below the smallest of its nucleus set to -inf (p 1: none)."""
    if all(p >= 1.0 for p in ps):
        return scaled
    ordered = scaled.sort(dim=-1, descending=True).values  # [R, V]
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # the probability of the larger values
    p = _per_row([float(p) for p in ps], scaled.device)
    count = (before < p).sum(-1, keepdim=True)  # >= 1: nothing is larger than the largest
    smallest = ordered.gather(1, count - 1)  # [R, 1]
    return scaled.masked_fill((scaled < smallest) & (p < 1.0), float("-inf"))
