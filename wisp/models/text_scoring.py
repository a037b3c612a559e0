"""How well a model predicts a text: bits per token, window by window.

Contract: the token ids are cut into consecutive windows of `window` tokens (the last one shorter); each window is
scored from scratch (no context from the window before), so its first token is never predicted and every other token
is predicted from the tokens before it in its window. `bits` is the sum of -log2 p(token) over the predicted
tokens, computed in float32 from each window's logits; `bits_per_token` divides by their count. Anything that gives
a window's logits (`logits_of(ids) -> [T, V]`) can be scored: the trainer's transformers model and wisp's engine
score the same tokens the same way, so their figures compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Score:
    bits: float
    predicted: int  # tokens predicted (each window's first is not)

    @property
    def bits_per_token(self) -> float:
        return self.bits / self.predicted


def windows(num_tokens: int, window: int) -> list[tuple[int, int]]:
    """[start, end) of each window; a trailing window of one token (nothing to predict) is dropped."""
    if window < 2:
        raise ValueError("a window must hold at least 2 tokens")
    return [(s, min(s + window, num_tokens)) for s in range(0, num_tokens, window) if min(s + window, num_tokens) - s >= 2]


def window_bits(logits: torch.Tensor, ids: Sequence[int]) -> float:
    """-log2 p of ids[1:] under logits[:-1] ([T, V] for the T tokens of `ids`)."""
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)  # [T-1, V]
    target = torch.as_tensor(list(ids[1:]), dtype=torch.long, device=logp.device)
    return -logp.gather(1, target[:, None]).sum().item() / math.log(2)


def score(ids: Sequence[int], logits_of: Callable[[list[int]], torch.Tensor], window: int) -> Score:
    bits, predicted = 0.0, 0
    for start, end in windows(len(ids), window):
        chunk = list(ids[start:end])
        bits += window_bits(logits_of(chunk), chunk)
        predicted += len(chunk) - 1
    return Score(bits, predicted)
