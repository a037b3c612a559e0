"""The OpenAI wire format wisp reads: request bodies and error objects (responses: `wisp.server.responses`).

Requests are validated strictly (a string where a number belongs is a 400, never coerced; a float with no
fractional part is an integer, as JSON Schema's `integer` says); fields
OpenAI defines that wisp cannot honour (n > 1, logprobs, penalties, tools, ...) are rejected with a
message naming them rather than silently ignored; fields nobody defines are ignored. Field names
follow the OpenAI API exactly.

Invariants:
- Every string a request carries that wisp reads (`Text`: model, prompt, stop, user, message roles,
  contents and extra message keys) is valid Unicode: JSON can spell a lone UTF-16 surrogate
  (`"\\ud800"`), which no encoder or tokenizer accepts, so it is a validation error naming its field.
- An `ErrorInfo` message is always encodable as UTF-8 (unencodable characters are backslash-escaped),
  so rendering an error can never fail on the text it quotes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator,
)

from wisp.engine.sampling import SamplingParams


# -- text ---------------------------------------------------------------------------------------------
_SURROGATE = re.compile("[\ud800-\udfff]")


def unencodable_at(text: str) -> int | None:
    """The index of the first character of `text` that UTF-8 cannot encode (a lone surrogate), or None."""
    match = _SURROGATE.search(text)
    return None if match is None else match.start()


def _first_unencodable(value: Any, path: str = "") -> tuple[str, str, int] | None:
    """(path, text, index) of the first string under `value` (str, list, dict or model, walked in order)
    holding a lone surrogate; path is relative (`.0.text`, `.name`, or "" for `value` itself)."""
    if isinstance(value, str):
        at = unencodable_at(value)
        return None if at is None else (path, value, at)
    if isinstance(value, BaseModel):
        value = value.model_dump()
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_unencodable(str(key), f"{path}.<key>") or _first_unencodable(item, f"{path}.{key}")
        if found is not None:
            return found
    return None


def _encodable(value: Any) -> Any:
    found = _first_unencodable(value)
    if found is not None:
        path, text, at = found
        where = f"{path.lstrip('.')}: " if path else ""
        raise ValueError(f"{where}the text holds a lone UTF-16 surrogate (U+{ord(text[at]):04X} at character {at}), "
                         "which is not valid Unicode: send valid UTF-8 (an escaped surrogate must be half of a pair)")
    return value


Encodable = AfterValidator(_encodable)
"""Checks, after the type, that every string in a value is valid Unicode (no lone surrogate)."""
Text = Annotated[str, Encodable]
"""A request string wisp reads: valid Unicode, else a 400 naming its field."""


def _whole(value: Any) -> Any:
    """A float with no fractional part as the int it spells (JSON Schema's `integer` admits 16.0); else as it is,
    for the strict int check to judge."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole)]
"""An integer request field: an int, or a float with no fractional part (`16.0`); never a string or a bool."""


# -- errors -------------------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None

    @field_validator("message")
    @classmethod
    def _utf8(cls, v: str) -> str:
        return v.encode("utf-8", "backslashreplace").decode("utf-8") if unencodable_at(v) is not None else v


REQUEST_FAILED = "request_failed"  # error code: this request failed on its own in the engine (others ran on)


class ErrorResponse(BaseModel):
    error: ErrorInfo


class APIError(Exception):
    """An error with its HTTP status and OpenAI error object fields; the app renders it."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)


# -- requests -----------------------------------------------------------------------------------------
# What the OpenAPI document says a field accepts: the values the validators below and SamplingParams let
# through, not just the Python type (the validation itself is unchanged; 400s keep their own messages).
def _accepts(schema: dict[str, Any], nullable: bool = True) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]} if nullable else schema)


_FLOAT32_TINY = 1e-45  # the least value float32 does not round to 0 (SamplingParams rejects those that do)
_SEED_MAX = 2**63 - 2**10  # the largest double below 2**63 (the document's numbers are doubles)
_POSITIVE_INT = _accepts({"type": "integer", "minimum": 1})
_TEXT = {"type": "string", "minLength": 1}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT = _accepts({"anyOf": [_TEXT, _TOKEN_IDS, {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1},
                              {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1}]}, nullable=False)
_STOP = _accepts({"anyOf": [_TEXT, {"type": "array", "items": _TEXT}]})
_UNSUPPORTED = {  # options OpenAI defines that wisp only takes at their neutral value
    "n": _accepts({"type": "integer", "enum": [1]}),
    "zero": _accepts({"type": "number", "enum": [0]}),
    "absent": WithJsonSchema({"type": "null"}),
    "false": _accepts({"type": "boolean", "enum": [False]}),
    "empty object": _accepts({"type": "object", "maxProperties": 0}),
    "empty string": _accepts({"type": "string", "maxLength": 0}),
    "empty array": _accepts({"type": "array", "maxItems": 0}),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool | None = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: Text
    max_tokens: Annotated[Int | None, _POSITIVE_INT] = None  # default: 16 (completions), the rest of the context (chat)
    temperature: Annotated[float | None, _accepts({"anyOf": [{"type": "number", "enum": [0]}, {"type": "number", "minimum": _FLOAT32_TINY, "maximum": 3.4e38}]})] = None  # OpenAI's default is 1
    top_p: Annotated[float | None, _accepts({"type": "number", "minimum": _FLOAT32_TINY, "maximum": 1})] = None
    top_k: Annotated[Int | None, _accepts({"type": "integer", "minimum": 0})] = None  # extension (vLLM's name)
    n: Annotated[Int | None, _UNSUPPORTED["n"]] = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Annotated[str | list[str] | None, Encodable, _STOP] = None
    seed: Annotated[Int | None, _accepts({"type": "integer", "minimum": 0, "maximum": _SEED_MAX})] = None
    ignore_eos: bool | None = None  # extension
    user: Text | None = None
    presence_penalty: Annotated[float | None, _UNSUPPORTED["zero"]] = None
    frequency_penalty: Annotated[float | None, _UNSUPPORTED["zero"]] = None
    logit_bias: Annotated[dict[str, float] | None, _UNSUPPORTED["empty object"]] = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError(f"n={v} is not supported: wisp returns exactly one choice per request (use n=1)")
        return v

    # fields of the two request kinds (check_fields=False: each kind has only some of them)
    @field_validator("echo", "logprobs", "suffix", "top_logprobs", "tools", check_fields=False)
    @classmethod
    def _unsupported(cls, v, info):
        if v or (info.field_name == "logprobs" and isinstance(v, int) and not isinstance(v, bool)):
            raise ValueError(f"{info.field_name} is not supported")  # completions' logprobs: 0 is a request too
        return v

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= _SEED_MAX:
            raise ValueError(f"seed must be in [0, {_SEED_MAX}]")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("presence/frequency penalties are not supported (leave them at 0)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict | None) -> dict | None:
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v is not None and any(s == "" for s in ([v] if isinstance(v, str) else v)):
            raise ValueError("stop strings must not be empty")
        return v

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """SamplingParams for this request (raises InvalidParameter, naming the field, on out-of-range values)."""
        kw: dict[str, Any] = dict(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            ignore_eos=bool(self.ignore_eos),
        )
        if self.stop_strings:  # only when asked, so params stay default-constructible without it
            kw["stop"] = self.stop_strings
        return SamplingParams(**kw)


class CompletionRequest(_SamplingRequest):
    prompt: Annotated[str | list[Int] | list[str] | list[list[Int]], Encodable, _PROMPT]
    echo: Annotated[bool | None, _UNSUPPORTED["false"]] = False
    logprobs: Annotated[Int | None, _UNSUPPORTED["absent"]] = None  # 0 would ask for the sampled token's logprob
    best_of: Annotated[Int | None, _UNSUPPORTED["n"]] = None
    suffix: Annotated[str | None, _UNSUPPORTED["empty string"]] = None

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"got {len(v)} prompts: wisp takes one prompt per request")
            v = v[0]
        if len(v) == 0:
            raise ValueError("prompt is empty")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v):
        if v not in (None, 1):
            raise ValueError(f"best_of={v} is not supported (use 1)")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: str  # checked by ChatMessage.content


ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatMessage(BaseModel):
    """One message; extra keys (name, tool_call_id, ...) are kept and passed to the chat template."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: Annotated[Text, WithJsonSchema({"type": "string", "enum": list(ROLES)})]
    content: Annotated[str | list[TextPart] | None, Encodable] = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"role {v!r} is not one of {', '.join(ROLES)}")
        return v

    @model_validator(mode="after")
    def _extra_encodable(self) -> "ChatMessage":
        _encodable(self.model_extra or {})
        return self

    def template_dict(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "\n".join(part.text for part in self.content)
        out.setdefault("content", "")
        return out


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Annotated[Text, WithJsonSchema({"type": "string", "enum": ["text"]})]


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[Int | None, _POSITIVE_INT] = None
    logprobs: Annotated[bool | None, _UNSUPPORTED["false"]] = False
    top_logprobs: Annotated[Int | None, _UNSUPPORTED["zero"]] = None
    tools: Annotated[list[dict[str, Any]] | None, _UNSUPPORTED["empty array"]] = None
    response_format: ResponseFormat | None = None
    # tool calling and reasoning controls, not honoured yet: only their absence (or "none") is accepted
    tool_choice: Annotated[Any, _accepts({"type": "string", "enum": ["none"]})] = None
    parallel_tool_calls: Annotated[Any, _UNSUPPORTED["absent"]] = None
    functions: Annotated[Any, _UNSUPPORTED["absent"]] = None
    function_call: Annotated[Any, _UNSUPPORTED["absent"]] = None
    reasoning_effort: Annotated[Any, _UNSUPPORTED["absent"]] = None
    audio: Annotated[Any, _UNSUPPORTED["absent"]] = None
    web_search_options: Annotated[Any, _UNSUPPORTED["absent"]] = None
    modalities: Annotated[Any, _accepts({"type": "array", "items": {"type": "string", "enum": ["text"]}})] = None

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, v):
        if v is not None and v != ["text"]:
            raise ValueError(f"modalities {v!r} is not supported: wisp answers in text only (omit it, or send [\"text\"])")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, v):
        if v not in (None, "none"):
            raise ValueError("tool_choice is not supported: wisp does not call tools (omit it, or send \"none\")")
        return v

    @field_validator("parallel_tool_calls", "functions", "function_call", "reasoning_effort", "audio",
                     "web_search_options")
    @classmethod
    def _not_honoured(cls, v, info):
        if v is not None:
            raise ValueError(f"{info.field_name} is not supported: it would change the reply, and wisp cannot honour "
                             "it (omit it)")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: ResponseFormat | None):
        if v is not None and v.type != "text":
            raise ValueError(f"response_format type {v.type!r} is not supported (only 'text')")
        return v

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
