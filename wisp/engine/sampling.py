"""Sampling parameters and the per-request sampler.

Each request samples with its own torch.Generator on the logits' device (seeded from `seed`, or from a random seed
drawn at submission), so its tokens never depend on the other requests in a batch; a step draws every request's token
at once on the device (`wisp.engine.batch_sampler`). temperature 0 is greedy.

Before it samples, the sampler adjusts its request's logits row, in this order (OpenAI's semantics): `logit_bias`
adds to the listed tokens; `presence_penalty` subtracts from every token the request has generated, and
`frequency_penalty` that much per time generated; a `TokenConstraint` (a grammar, `wisp.engine.grammar`) sets the
tokens it forbids to -inf. With `logprobs` it reports log_softmax of that adjusted row (before temperature, top-k
and top-p): the sampled token's log-probability and the `logprobs` most likely tokens'. A request that asks for none
of these samples from its row exactly as before, so its tokens are unchanged.

The sampler computes in float32, so `SamplingParams` rejects (never clamps) a temperature or top_p that
float32 cannot hold: above 0 but rounding to 0 there (below about 7e-46, half of FLOAT32_MIN_POSITIVE =
2**-149; a temperature of 1e-50 divided the logits by 0 and made NaN, a top_p of 1e-50 kept no token),
or a temperature rounding to inf (above 3.4e38). Rejected rather than clamped, because a substituted
value would silently answer a different request than the one sent; temperature 0 (greedy) or top_k 1
is what a vanishing value means, and any value float32 holds, subnormals included, samples correctly.
Every invalid value raises `InvalidParameter` naming its field, so the HTTP API answers 400 with
`param` set. Should a sampler raise anyway, only its request fails (`wisp.engine.request_failure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

import torch

from wisp.engine.batch_sampler import sample_batch
from wisp.errors import InvalidParameter

FLOAT32_MIN_POSITIVE = 2.0**-149  # the smallest positive (subnormal) float32
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def in_float32(value: float) -> float:
    """`value` rounded to float32, as the sampler computes with it (0 below ~7e-46, inf above ~3.4e38)."""
    return float(torch.tensor(value, dtype=torch.float32))


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()  # generation ends before the first occurrence of any of these strings
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; n: the sampled token's log-probability and the n most likely
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), ids distinct
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    skip_special_tokens: bool = True  # the output text leaves special tokens out (False: a format that reads them)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidParameter("max_tokens", f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidParameter("temperature", f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature > 0 and in_float32(self.temperature) in (0.0, math.inf):
            raise InvalidParameter(
                "temperature", f"temperature {self.temperature} rounds to {in_float32(self.temperature)} in float32, "
                f"which the sampler computes in: use 0 (greedy) or a value in [{FLOAT32_MIN_POSITIVE:.4g}, "
                f"{FLOAT32_MAX:.4g}]")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidParameter("seed", f"seed must be in [0, 2**63), got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise InvalidParameter("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if in_float32(self.top_p) == 0:
            raise InvalidParameter(
                "top_p", f"top_p {self.top_p} rounds to 0 in float32, which the sampler computes in: use a value in "
                f"[{FLOAT32_MIN_POSITIVE:.4g}, 1] (or top_k 1 to keep only the most likely token)")
        if self.top_k < 0:
            raise InvalidParameter("top_k", f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidParameter("logprobs", f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2 <= value <= 2):
                raise InvalidParameter(name, f"{name} must be in [-2, 2], got {value}")
        for token, bias in self.logit_bias:
            if token < 0:
                raise InvalidParameter("logit_bias", f"logit_bias: token id {token} is negative")
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                raise InvalidParameter("logit_bias", f"logit_bias for token {token} must be in [-100, 100], got {bias}")
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise InvalidParameter("logit_bias", "logit_bias names a token twice")

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.logit_bias) or bool(self.presence_penalty) or bool(self.frequency_penalty)


MAX_LOGPROBS = 20  # OpenAI's bound on top_logprobs


class TokenLogprobs(NamedTuple):
    """One sampled token's log-probability and the most likely tokens' (id, log-probability), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Sampled(NamedTuple):
    token: int
    logprobs: TokenLogprobs | None  # when the request asked for them


class TokenConstraint(Protocol):
    """What the sampler asks of a grammar: forbid tokens in a logits row (in place, -inf), and take the token chosen;
    what the stop check asks: whether the grammar allows no further token (`wisp.engine.stopping`)."""

    def mask(self, logits: torch.Tensor) -> None: ...

    def accept(self, token: int) -> None: ...

    @property
    def finished(self) -> bool: ...


def adjusted(logits: torch.Tensor, params: SamplingParams, history: Sequence[int]) -> torch.Tensor:
    """logits [V] float32 with `params`' bias and penalties applied (a new tensor; `logits` when there are none)."""
    if not params.adjusts_logits:
        return logits
    row = logits.float().clone()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=row.device)
        keep = ids < row.numel()
        row[ids[keep]] += torch.tensor([b for _, b in params.logit_bias], device=row.device)[keep]
    if history and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(list(history), device=row.device), minlength=row.numel())[: row.numel()]
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return row


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> TokenLogprobs:
    """The log-probabilities under `logits` [V] of `token` and of the `top` most likely tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = torch.topk(logprobs, min(top, logprobs.numel())) if top else (logprobs[:0], logprobs[:0].long())
    return TokenLogprobs(token, float(logprobs[token]), tuple(zip(ids.tolist(), values.tolist())))


class Sampler:
    """One request's sampling: its parameters, its seed (`seed`, or one drawn at submission) and, per device, the
    generator its draws come from. `prepare` adjusts its logits row, `noise` draws its uniforms, `sample_batch`
    (`wisp.engine.batch_sampler`) picks its token beside the batch's others, `finish` adds its logprobs."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        self._generators: dict[torch.device, torch.Generator] = {}

    def noise(self, width: int, device: torch.device) -> torch.Tensor | None:
        """The next `width` uniform draws in [0, 1) (float64) of this request's generator on `device` (None for a
        greedy request, which draws nothing)."""
        if self.params.temperature == 0:
            return None
        device = torch.device(device)
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return torch.rand(width, generator=generator, device=device, dtype=torch.float64)

    def prepare(self, logits: torch.Tensor, history: Sequence[int] = (),
                constraint: TokenConstraint | None = None) -> torch.Tensor:
        """The row [V] this request samples from: `logits` after its bias and penalties given `history` (its output
        so far), within `constraint` (a new tensor; `logits` itself when nothing changes it)."""
        row = adjusted(logits, self.params, history)
        if constraint is not None:
            row = logits.float().clone() if row is logits else row  # the caller's row stays as it was
            constraint.mask(row)
        return row

    def finish(self, row: torch.Tensor, token: int) -> Sampled:
        """`token`, drawn from `row` (`prepare`'s), with its logprobs where the request asked for them."""
        if self.params.logprobs is None:
            return Sampled(token, None)
        return Sampled(token, token_logprobs(row, token, self.params.logprobs))

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = (),
                 constraint: TokenConstraint | None = None) -> Sampled:
        """The next token from `logits` [V] alone (as `sample_batch` draws it in any batch)."""
        row = self.prepare(logits, history, constraint)
        noise = self.noise(row.shape[-1], row.device)
        return self.finish(row, int(sample_batch(row.float()[None], [self.params], [noise])[0]))
