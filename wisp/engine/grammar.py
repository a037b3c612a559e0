"""Constrained decoding: a request's tokens held to a grammar (JSON schema, Lark, regex) by llguidance.

`Grammars` is built once per engine over the checkpoint's tokenizer.json (llguidance's `LLTokenizer`, made on first
use: about a second at a 150k vocabulary). `Grammars.constraint(grammar)` compiles one request's grammar into a
`GrammarConstraint`, the `TokenConstraint` the sampler applies (`wisp.engine.sampling`): before each token it sets
the logits of every token the grammar forbids to -inf on the row's own device, and after it takes the sampled token.
Only the requests that carry a constraint pay for it; the decode step itself (its CUDA graph) is the same for all.

Invariants:
- A grammar that does not compile is a `WispError` (InvalidParameter naming the request field) before the request
  reaches the engine; model output can never raise here except through a matcher error, which fails that request
  alone (the sampler's failures are per request).
- Tokens past the tokenizer's vocabulary (a model's padded rows) are always forbidden; EOS is allowed exactly when the
  grammar accepts, so a constrained request ends with "stop" when its text is complete.
- JSON is compact (no whitespace between tokens of the JSON grammar), so a sampled walk through it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from wisp.errors import InvalidParameter, WispError

JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: ", " and ": " are not emitted either


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of JSON text valid under `schema` (OpenAI's response_format json_schema)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's response_format json_object)."""
    return json_schema_grammar({"type": "object"})


def lark_grammar(text: str) -> str:
    """A Lark grammar in llguidance's dialect (it may embed `%json {schema}`)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(text)


def regex_grammar(pattern: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_regex(pattern)


class Grammars:
    """Compiles grammars for one tokenizer and vocabulary (`vocab_size`: the model's logits width)."""

    def __init__(self, tokenizer_file: Path, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer_file, self.vocab_size, self.eos_token_ids = tokenizer_file, vocab_size, list(eos_token_ids)
        self._tokenizer = None
        self._problem: str | None = None  # why llguidance could not take this tokenizer, once it failed

    @property
    def tokenizer(self):
        """llguidance's view of the tokenizer (built on first use); WispError, the same every time, if llguidance
        cannot read this tokenizer.json: only constrained requests need it, so only they fail."""
        if self._tokenizer is None and self._problem is None:
            try:
                import llguidance

                self._tokenizer = llguidance.LLTokenizer(str(self.tokenizer_file), n_vocab=self.vocab_size,
                                                         eos_token=self.eos_token_ids or None)
            except Exception as exc:  # noqa: BLE001 (llguidance raises ValueError, ImportError: any is the same answer)
                self._problem = f"the grammar engine cannot read {self.tokenizer_file.name}: {exc}"
        if self._tokenizer is None:
            raise WispError(self._problem)
        return self._tokenizer

    def constraint(self, grammar: str, param: str = "response_format") -> "GrammarConstraint":
        """A fresh matcher for `grammar`; InvalidParameter(param) with llguidance's message if it does not compile,
        or with why the grammar engine cannot serve this tokenizer."""
        import llguidance

        try:
            tokenizer = self.tokenizer
        except WispError as exc:
            raise InvalidParameter(param, f"{param}: constrained output is unavailable for this model: {exc}") from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidParameter(param, f"{param}: the grammar does not compile: {matcher.get_error()}")
        return GrammarConstraint(matcher, self.vocab_size)

    def token_bytes(self, token: int) -> bytes:
        """The bytes token `token` stands for (a byte-level token may be part of a UTF-8 character)."""
        return self.tokenizer.decode_bytes([token])


_BITS = torch.arange(32, dtype=torch.int32)


def prepare_masks(constraints: list["GrammarConstraint"]) -> None:
    """Compute the next-token bitmasks of several requests' grammars at once, on llguidance's worker threads (the GIL
    released), so that the CPU work overlaps the step the device is still running; each `mask` then uses its row."""
    if not constraints:
        return
    import llguidance

    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor()
    words = -(-constraints[0].vocab_size // 32)
    masks = torch.zeros((len(constraints), words), dtype=torch.int32)  # [R, W]
    _EXECUTOR.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(constraints)], masks.data_ptr(),
                                      words * 4, len(constraints))  # each row's bytes
    for c, row in zip(constraints, masks):
        c._prepared = row


_EXECUTOR = None


class GrammarConstraint:
    """One request's grammar state (llguidance's `LLMatcher`), the sampler's `TokenConstraint`."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size
        self._prepared: torch.Tensor | None = None  # this step's bitmask, when `prepare_masks` computed it

    def allowed(self, device: torch.device) -> torch.Tensor:
        """bool [vocab_size]: the tokens the grammar allows next."""
        if self._prepared is not None:
            words, self._prepared = self._prepared.to(device), None  # [W]
        else:
            words = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32).to(device)  # [W]
        bits = (words[:, None] >> _BITS.to(device)) & 1  # [W, 32], bit b of word w is token 32 w + b
        allowed = bits.reshape(-1).bool()[: self.vocab_size]
        if allowed.numel() < self.vocab_size:
            allowed = torch.cat([allowed, allowed.new_zeros(self.vocab_size - allowed.numel())])
        return allowed

    def mask(self, logits: torch.Tensor) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar matcher failed: {self.matcher.get_error()}")
        logits.masked_fill_(~self.allowed(logits.device)[: logits.numel()], float("-inf"))

    def accept(self, token: int) -> None:
        self._prepared = None
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar allows no further token (its text is complete and EOS was taken, or it stopped)."""
        return self.matcher.is_stopped()
