"""`sample_sequences`: a step's tokens, one per sequence that samples, from the step's logits rows.

Each request's row is prepared by its own sampler, one by one (`Sampler.prepare`: bias, penalties, a grammar's mask;
a row nothing changes is used as the model gave it) and its uniforms drawn (`Sampler.noise`); the tokens are then
drawn together on the device (`wisp.engine.batch_sampler.sample_batch`) and read to the host at once; then each
request's logprobs and grammar. A request whose own part raises gets a `RequestFailure` in place of its token, and
the others sample as they would have without it: its draws are its own, and a batch draw that raises is retried row
by row, from the same draws.
"""

from __future__ import annotations

import torch

from wisp.engine.batch_sampler import sample_batch
from wisp.engine.grammar import GrammarConstraint, prepare_masks
from wisp.engine.request_failure import SAMPLING, RequestFailure
from wisp.engine.sequence import Sequence


def sample_sequences(seqs: list[Sequence], logits) -> list[int | RequestFailure]:
    """Each sequence's next token from its logits row (`logits` [S, V]), or its RequestFailure if its sampling
    raised."""
    if not seqs:
        return []
    try:  # the grammars' masks on the CPU while the device may still be computing the logits
        prepare_masks([s.constraint for s in seqs if isinstance(s.constraint, GrammarConstraint)])
    except Exception:  # noqa: BLE001 (each constraint computes its own mask in `mask`, and fails alone there)
        pass
    out: list[int | RequestFailure | None] = [None] * len(seqs)
    rows: dict[int, torch.Tensor] = {}
    noise: dict[int, torch.Tensor | None] = {}
    plain = True  # every row as the model gave it
    for i, (seq, row) in enumerate(zip(seqs, logits)):
        try:
            rows[i] = seq.sampler.prepare(row, seq.output_ids, seq.constraint)
            noise[i] = seq.sampler.noise(row.shape[-1], row.device)
            plain = plain and rows[i] is row
        except Exception as exc:
            rows.pop(i, None)
            out[i] = RequestFailure.caught(seq.request_id, SAMPLING, exc)
    for i, token in _draw(seqs, logits if plain and len(rows) == len(seqs) else None, rows, noise).items():
        seq = seqs[i]
        if isinstance(token, RequestFailure):
            out[i] = token
            continue
        try:
            sampled = seq.sampler.finish(rows[i], token)
            if seq.constraint is not None:
                seq.constraint.accept(sampled.token)
        except Exception as exc:
            out[i] = RequestFailure.caught(seq.request_id, SAMPLING, exc)
            continue
        out[i] = sampled.token
        if sampled.logprobs is not None:
            seq.output_logprobs.append(sampled.logprobs)
        if seq.logits is not None:
            seq.logits.append(logits[i].cpu())
    return out

def _draw(seqs: list[Sequence], logits: torch.Tensor | None, rows: dict[int, torch.Tensor],
          noise: dict[int, torch.Tensor | None]) -> dict[int, int | RequestFailure]:
    """The tokens of the prepared `rows` (by index into `seqs`) from their `noise`, drawn in one batch (`logits`,
    where it holds them all as they are); should that raise, each row alone, so that only a row that fails by
    itself fails (the noise is drawn already: a row's token is the same either way)."""
    index = list(rows)
    if not index:
        return {}
    params = [seqs[i].sampler.params for i in index]
    try:
        batch = logits if logits is not None else torch.stack([rows[i] for i in index])
        return dict(zip(index, sample_batch(batch.float(), params, [noise[i] for i in index]).tolist()))
    except Exception:  # noqa: BLE001 (found below, row by row)
        pass
    out: dict[int, int | RequestFailure] = {}
    for i, p in zip(index, params):
        try:
            out[i] = int(sample_batch(rows[i].float()[None], [p], [noise[i]])[0])
        except Exception as exc:
            out[i] = RequestFailure.caught(seqs[i].request_id, SAMPLING, exc)
    return out
