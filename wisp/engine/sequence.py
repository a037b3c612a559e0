"""A request as the scheduler sees it: tokens, block table, progress, its text so far, and how it ended."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from wisp.engine.detokenizer import IncrementalDetokenizer
from wisp.engine.request_failure import RequestFailure
from wisp.engine.sampling import Sampler, SamplingParams, TokenConstraint, TokenLogprobs


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_len: int  # prompt + output may not exceed this (the engine's max_model_len)
    keep_logits: bool = False
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_keys: list[int] = field(default_factory=list)  # chain keys of the full blocks registered so far
    num_computed: int = 0  # tokens whose KV is in the cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    failure: RequestFailure | None = None  # set when its own step failed (finish_reason "error")
    text: str = ""  # the output's text (cut before a stop string), kept by `detokenizer` if there is one
    detokenizer: IncrementalDetokenizer | None = None
    logits: list[torch.Tensor] | None = None
    constraint: TokenConstraint | None = None  # a grammar its tokens must follow (`wisp.engine.grammar`)
    output_logprobs: list[TokenLogprobs] | None = None  # per output token, when params.logprobs asks
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None  # when its latest token was sampled (load control's wait clock)
    finish_time: float | None = None

    def __post_init__(self) -> None:
        self.sampler = Sampler(self.params)
        if self.keep_logits:
            self.logits = []
        if self.params.logprobs is not None:
            self.output_logprobs = []

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
