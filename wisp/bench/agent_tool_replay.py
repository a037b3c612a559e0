"""Forced tool calls in the replay of `wisp bench agent --tools`: every turn's reply held to one call of its workflow's
tools, as `tool_choice: "required"` (parallel_tool_calls false) holds a real agent's request, and each reply judged.

`ToolGrammarSource` is what the bench's parent process hands each arm's process: the sessions' tokenizer (the text of
its tokenizer.json: the checkpoint's, or the BPE trained on the sessions), the token ids a finished call ends with
(the model's EOS ids, or the trained BPE's END_OF_TEXT) and the model's vocabulary size. `ToolReplay` builds, in the
arm's process, the engine's `Grammars` over that tokenizer (written to a temporary tokenizer.json), compiles each
workflow's hermes grammar (`HermesFormat.grammar(tools, "required", False)`) once and hands out a fresh copy of its
matcher per request (`constraint`), whose mask calls are timed (`mask_s`: what the sampler spends applying the
grammar; a bitmask the runner computed beforehand for the whole batch, `wisp.engine.grammar.prepare_masks`, is not
in it).

Judging a reply (`judge`): its ids, less a trailing end id, decoded with the sessions' tokenizer, then parsed by
`HermesFormat.parse`:
- "complete": exactly one call, to one of the workflow's tools, and no content beside it (a block cut at max_tokens
  after its JSON, before `</tool_call>`, counts: the parser, like the server, reads it as a call);
- "cut": anything else, when the reply stopped at its max_tokens (finish_reason "length": a random-weight model's
  string arguments rarely end within the dataset's reply length);
- "other": anything else (a grammar-held reply that stopped without a whole call, or a failed request): none is
  expected, a count above zero is a bug.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from wisp.bench.agent_tools import workflow_tools
from wisp.engine.grammar import GrammarConstraint, Grammars, lark_grammar
from wisp.server.tool_calls import HermesFormat

VERDICTS = ("complete", "cut", "other")


@dataclass(frozen=True)
class ToolGrammarSource:
    tokenizer_json: str  # the sessions' tokenizer, as tokenizer.json text
    end_ids: tuple[int, ...]  # the ids the grammar ends a call with (EOS)
    vocab_size: int  # the model's logits width


class TimedConstraint(GrammarConstraint):
    """A request's grammar that adds the seconds of its `mask` calls to its replay's `mask_s`. On a GPU the device is
    synchronized before (the copy of the bitmask would otherwise wait inside the timed span for the step's forward
    to finish) and after (the masked fill's own device time); the sampler synchronizes at both points anyway (the
    copy from pageable memory, then reading the chosen token back)."""

    def __init__(self, matcher, vocab_size: int, replay: "ToolReplay"):
        super().__init__(matcher, vocab_size)
        self._replay = replay

    def mask(self, logits) -> None:
        sync = torch.cuda.synchronize if logits.is_cuda else (lambda device: None)
        sync(logits.device)
        start = time.perf_counter()
        try:
            super().mask(logits)
            sync(logits.device)
        finally:
            self._replay.mask_s += time.perf_counter() - start


class ToolReplay:
    """The forced calls of one arm (see the module docstring); `workflows`: those whose grammars to compile now."""

    def __init__(self, source: ToolGrammarSource, workflows: list[str]):
        from tokenizers import Tokenizer

        with tempfile.TemporaryDirectory(prefix="wisp-tools-") as folder:
            path = Path(folder) / "tokenizer.json"
            path.write_text(source.tokenizer_json)
            self.grammars = Grammars(path, source.vocab_size, list(source.end_ids))
            self.grammars.tokenizer  # read the file now, while it exists
        self.format, self.decoder = HermesFormat(), Tokenizer.from_str(source.tokenizer_json)
        self.end_ids, self.vocab_size = frozenset(source.end_ids), source.vocab_size
        self.mask_s = 0.0
        self._names: dict[str, set[str]] = {}
        self._templates: dict[str, GrammarConstraint] = {}
        for workflow in dict.fromkeys(workflows):
            self._template(workflow)

    def constraint(self, workflow: str) -> TimedConstraint:
        """A fresh grammar for one reply of `workflow` (its tools, a call required, one call)."""
        return TimedConstraint(self._template(workflow).matcher.deep_copy(), self.vocab_size, self)

    def text(self, output_ids: list[int]) -> str:
        ids = list(output_ids)
        if ids and ids[-1] in self.end_ids:
            ids.pop()
        return self.decoder.decode(ids, skip_special_tokens=False)

    def judge(self, workflow: str, output_ids: list[int], finish_reason: str | None) -> tuple[str, str]:
        """(the reply's text, its verdict: one of VERDICTS, see the module docstring)."""
        text = self.text(output_ids)
        parsed = self.format.parse(text)
        self._template(workflow)
        if (len(parsed.tool_calls) == 1 and parsed.content is None
                and parsed.tool_calls[0].name in self._names[workflow]):
            return text, "complete"
        return text, "cut" if finish_reason == "length" else "other"

    def _template(self, workflow: str) -> GrammarConstraint:
        """The workflow's compiled grammar, its first mask computed (what deep copies start from)."""
        if workflow not in self._templates:
            tools = workflow_tools(workflow)
            grammar = lark_grammar(self.format.grammar(tools, "required", False))
            template = self.grammars.constraint(grammar, param="tools")
            template.matcher.compute_bitmask()
            self._templates[workflow] = template
            self._names[workflow] = {t["function"]["name"] for t in tools}
        return self._templates[workflow]


def call_counts(verdicts) -> dict[str, int]:
    """How many turns got each verdict (every verdict named, zeros included)."""
    counts = Counter(verdicts)
    return {v: counts.get(v, 0) for v in VERDICTS}
