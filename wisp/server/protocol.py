"""The OpenAI wire format wisp reads: request bodies and error objects (responses: `wisp.server.responses`).

Requests are validated strictly (a string where a number belongs is a 400, never coerced; a float with no
fractional part is an integer, as JSON Schema's `integer` says); fields
OpenAI defines that wisp cannot honour (best_of, suffix, audio, the deprecated functions, ...) are rejected with a
message naming them rather than silently ignored; fields nobody defines are ignored. Field names
follow the OpenAI API exactly; `structured_outputs` (regex, Lark grammar, JSON schema or choice) and `top_k` are
vLLM's extensions.

Field types (valid-Unicode text, integers as whole floats): `wisp.server.wire_types`; the fields that shape the
reply's text (response_format, structured_outputs, tools): `wisp.server.output_fields`.

Invariant: an `ErrorInfo` message is always encodable as UTF-8 (unencodable characters are backslash-escaped),
  so rendering an error can never fail on the text it quotes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from wisp.engine.sampling import MAX_LOGPROBS, SamplingParams
from wisp.server.output_fields import GrammarRequest, NamedToolChoice, ResponseFormat, StructuredOutputs, Tool
from wisp.server.wire_types import Encodable, Int, Text, accepts, check_encodable, unencodable_at


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
_FLOAT32_TINY = 1e-45  # the least value float32 does not round to 0 (SamplingParams rejects those that do)
_SEED_MAX = 2**63 - 2**10  # the largest double below 2**63 (the document's numbers are doubles)
_POSITIVE_INT = accepts({"type": "integer", "minimum": 1})
_TEXT = {"type": "string", "minLength": 1}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT = accepts({"anyOf": [_TEXT, _TOKEN_IDS, {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1},
                              {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1}]}, nullable=False)
_STOP = accepts({"anyOf": [_TEXT, {"type": "array", "items": _TEXT}]})
_UNSUPPORTED = {  # options OpenAI defines that wisp only takes at their neutral value
    "n": accepts({"type": "integer", "enum": [1]}),
    "zero": accepts({"type": "number", "enum": [0]}),
    "absent": WithJsonSchema({"type": "null"}),
    "false": accepts({"type": "boolean", "enum": [False]}),
    "empty object": accepts({"type": "object", "maxProperties": 0}),
    "empty string": accepts({"type": "string", "maxLength": 0}),
    "empty array": accepts({"type": "array", "maxItems": 0}),
}


MAX_CHOICES = 128  # OpenAI's bound on n


def _within(value, low, high, name: str):
    """`value` if it is None or in [low, high], else a ValueError naming the field and the range."""
    if value is not None and not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value
_PENALTY = accepts({"type": "number", "minimum": -2, "maximum": 2})
_LOGIT_BIAS = accepts({"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool | None = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: Text
    max_tokens: Annotated[Int | None, _POSITIVE_INT] = None  # default: 16 (completions), the rest of the context (chat)
    temperature: Annotated[float | None, accepts({"anyOf": [{"type": "number", "enum": [0]}, {"type": "number", "minimum": _FLOAT32_TINY, "maximum": 3.4e38}]})] = None  # OpenAI's default is 1
    top_p: Annotated[float | None, accepts({"type": "number", "minimum": _FLOAT32_TINY, "maximum": 1})] = None
    top_k: Annotated[Int | None, accepts({"type": "integer", "minimum": 0})] = None  # extension (vLLM's name)
    n: Annotated[Int | None, accepts({"type": "integer", "minimum": 1, "maximum": MAX_CHOICES})] = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Annotated[str | list[str] | None, Encodable, _STOP] = None
    seed: Annotated[Int | None, accepts({"type": "integer", "minimum": 0, "maximum": _SEED_MAX})] = None
    ignore_eos: bool | None = None  # extension
    user: Text | None = None
    presence_penalty: Annotated[float | None, _PENALTY] = None
    frequency_penalty: Annotated[float | None, _PENALTY] = None
    logit_bias: Annotated[dict[str, float] | None, _LOGIT_BIAS] = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's extension

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int | None) -> int | None:
        return _within(v, 1, MAX_CHOICES, "n")

    @field_validator("suffix", check_fields=False)
    @classmethod
    def _unsupported(cls, v, info):
        if v:
            raise ValueError(f"{info.field_name} is not supported")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float | None, info) -> float | None:
        return _within(v, -2, 2, info.field_name)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"logit_bias keys are token ids (strings of digits), got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias for token {key} must be in [-100, 100], got {bias}")
        return v

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= _SEED_MAX:
            raise ValueError(f"seed must be in [0, {_SEED_MAX}]")
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

    @property
    def choices(self) -> int:
        return self.n or 1

    def requested_logprobs(self) -> int | None:
        """How many top log-probabilities each token reports (None: none)."""
        return None

    def sampling_params(self, max_tokens: int, choice: int = 0,
                        defaults: Mapping[str, float] | None = None) -> SamplingParams:
        """SamplingParams for choice `choice` of this request (raises InvalidParameter, naming the field, on
        out-of-range values). With a seed, choice i samples from seed + i (mod 2**63): reproducible and distinct.
        temperature, top_p and top_k the request leaves out come from `defaults` (the model's generation_config,
        as vLLM's server applies it), else OpenAI's (1, 1, and no top-k)."""
        defaults = defaults or {}
        kw: dict[str, Any] = dict(
            max_tokens=max_tokens,
            temperature=defaults.get("temperature", 1.0) if self.temperature is None else self.temperature,
            top_p=defaults.get("top_p", 1.0) if self.top_p is None else self.top_p,
            top_k=int(defaults.get("top_k", 0)) if self.top_k is None else self.top_k,
            seed=None if self.seed is None else (self.seed + choice) % 2**63,
            ignore_eos=bool(self.ignore_eos),
            logprobs=self.requested_logprobs(),
            logit_bias=tuple((int(k), float(b)) for k, b in (self.logit_bias or {}).items()),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
        )
        if self.stop_strings:  # only when asked, so params stay default-constructible without it
            kw["stop"] = self.stop_strings
        return SamplingParams(**kw)

    def grammar_request(self) -> "GrammarRequest | None":
        """The grammar this request's output must follow (`structured_outputs`), or None."""
        return None if self.structured_outputs is None else self.structured_outputs.grammar_request()


class CompletionRequest(_SamplingRequest):
    prompt: Annotated[str | list[Int] | list[str] | list[list[Int]], Encodable, _PROMPT]
    echo: bool | None = False
    logprobs: Annotated[Int | None, accepts({"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS})] = None
    best_of: Annotated[Int | None, _UNSUPPORTED["n"]] = None
    suffix: Annotated[str | None, _UNSUPPORTED["empty string"]] = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        return _within(v, 0, MAX_LOGPROBS, "logprobs")

    def requested_logprobs(self) -> int | None:
        return self.logprobs

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
        check_encodable(self.model_extra or {})
        return self

    def template_dict(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "\n".join(part.text for part in self.content)
        out.setdefault("content", "")
        return out


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[Int | None, _POSITIVE_INT] = None
    logprobs: bool | None = False
    top_logprobs: Annotated[Int | None, accepts({"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS})] = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # not honoured: only their absence is accepted
    functions: Annotated[Any, _UNSUPPORTED["absent"]] = None
    function_call: Annotated[Any, _UNSUPPORTED["absent"]] = None
    reasoning_effort: Annotated[Any, _UNSUPPORTED["absent"]] = None
    audio: Annotated[Any, _UNSUPPORTED["absent"]] = None
    web_search_options: Annotated[Any, _UNSUPPORTED["absent"]] = None
    modalities: Annotated[Any, accepts({"type": "array", "items": {"type": "string", "enum": ["text"]}})] = None

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, v):
        if v is not None and v != ["text"]:
            raise ValueError(f"modalities {v!r} is not supported: wisp answers in text only (omit it, or send [\"text\"])")
        return v

    @field_validator("functions", "function_call", "reasoning_effort", "audio", "web_search_options")
    @classmethod
    def _not_honoured(cls, v, info):
        if v is not None:
            hint = " (use tools and tool_choice)" if info.field_name in ("functions", "function_call") else " (omit it)"
            raise ValueError(f"{info.field_name} is not supported: it would change the reply, and wisp cannot honour "
                             f"it{hint}")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info) -> int | None:
        _within(v, 0, MAX_LOGPROBS, "top_logprobs")
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs set to true")
        return v

    @field_validator("tools")
    @classmethod
    def _distinct_tools(cls, v: list[Tool] | None) -> list[Tool] | None:
        names = [t.function.name for t in v or ()]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same function name")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v, info):
        names = [t.function.name for t in info.data.get("tools") or ()]
        if v == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(v, NamedToolChoice) and v.function.name not in names:
            raise ValueError(f"tool_choice names function {v.function.name!r}, which is not in tools")
        if names and (v == "required" or isinstance(v, NamedToolChoice)) and info.data.get("structured_outputs"):
            raise ValueError("a forced tool_choice and structured_outputs both constrain the output: send one")
        return v

    @field_validator("response_format")
    @classmethod
    def _one_constraint(cls, v: ResponseFormat | None, info) -> ResponseFormat | None:
        choice = info.data.get("tool_choice")
        if v is not None and v.type != "text":
            if info.data.get("structured_outputs") is not None:
                raise ValueError("response_format and structured_outputs both constrain the output: send one")
            if info.data.get("tools") and (choice == "required" or isinstance(choice, NamedToolChoice)):
                raise ValueError("response_format and a forced tool_choice both constrain the output: send one")
        return v

    @property
    def uses_tools(self) -> bool:
        """Whether the reply may hold tool calls (tools given and tool_choice not "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as OpenAI's dicts (what chat templates and tool-call grammars read), when the reply may call them."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.uses_tools else None

    @property
    def forces_tool_call(self) -> bool:
        return bool(self.tools) and (self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice))

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def grammar_request(self) -> GrammarRequest | None:
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            return GrammarRequest("json_object", None, "response_format")
        if fmt is not None and fmt.type == "json_schema":
            return GrammarRequest("json_schema", fmt.json_schema.schema_ or {}, "response_format")
        return super().grammar_request()

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
