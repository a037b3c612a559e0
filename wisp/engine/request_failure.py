"""RequestFailure: one request's own part of a step failed, and only that request ends.

A step has a shared part, the model's forward over the whole batch, and per-request parts: sampling a
request's next token (`ModelRunner._sample`) and its stop check, which detokenizes its text
(`Scheduler.postprocess`). An exception in a per-request part is caught there, logged with its traceback
and the request's id, and becomes a `RequestFailure` for that request alone.

Invariants:
- A failed request is finished with finish_reason "error" (`FINISH_REASON`) and its `failure` set; like
  any finish, its KV blocks go back to the pool (full ones stay cached). It gains no token in the failed
  step: a token sampled before a failing stop check is taken back.
- The step goes on for every other request, which computes and samples exactly what it would have
  without the failed one (a request's tokens never depend on its batch mates).
- A failure of the shared part (the forward) still raises from `LLMEngine.step`: it is no one request's.
- `message` is what a client is shown: the stage and the request, never the exception's text, which may
  reveal internals; the log has the whole exception.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("wisp.engine")

FINISH_REASON = "error"
SAMPLING = "sampling"
STOP_CHECK = "stop check"  # the stop tokens, lengths and stop strings, and the detokenization they need


@dataclass(frozen=True)
class RequestFailure:
    request_id: str
    stage: str  # SAMPLING or STOP_CHECK
    cause: str  # repr of the exception, for logs and tests; not shown to clients

    @classmethod
    def caught(cls, request_id: str, stage: str, exc: BaseException) -> "RequestFailure":
        """The failure of `exc`, just caught in `stage` of `request_id`'s step (call it in the except block:
        it logs the traceback)."""
        log.error("request %s failed in its %s; finishing it alone with an error", request_id, stage, exc_info=exc)
        return cls(request_id, stage, repr(exc))

    @property
    def message(self) -> str:
        return (f"request {self.request_id} failed in its {self.stage} and was stopped; the server log has the "
                "cause, and no other request was affected")
