"""The request fields that shape a reply's text: `response_format` (json_object, json_schema), vLLM's
`structured_outputs` (json, regex, Lark grammar, choice), and `tools` / `tool_choice`. Each constrained request comes
out as one `GrammarRequest`, which `wisp.server.output_constraints` turns into a grammar for the engine."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from wisp.server.wire_types import Encodable, Text


@dataclass(frozen=True)
class GrammarRequest:
    """What a request's output must follow: `kind` json_schema (spec: the schema), json_object, regex, grammar (a
    Lark grammar in llguidance's dialect) or choice (spec: the strings); `param` names the field it came from."""

    kind: str
    spec: Any
    param: str


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` extension: exactly one of json (a schema), regex, grammar (Lark) or choice."""

    model_config = ConfigDict(strict=True, extra="forbid")
    json_: Annotated[dict[str, Any] | None, Encodable] = Field(None, alias="json")
    regex: Text | None = None
    grammar: Text | None = None
    choice: Annotated[list[str] | None, Encodable] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "StructuredOutputs":
        given = [k for k in ("json_", "regex", "grammar", "choice") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, grammar or choice")
        if self.choice is not None and not self.choice:
            raise ValueError("choice must list at least one string")
        return self

    def grammar_request(self) -> GrammarRequest:
        if self.json_ is not None:
            return GrammarRequest("json_schema", self.json_, "structured_outputs")
        kind = "regex" if self.regex is not None else "grammar" if self.grammar is not None else "choice"
        return GrammarRequest(kind, getattr(self, kind), "structured_outputs")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: Text
    description: Text | None = None
    schema_: Annotated[dict[str, Any] | None, Encodable] = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Annotated[Text, WithJsonSchema({"type": "string", "enum": ["text", "json_object", "json_schema"]})]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _known(self) -> "ResponseFormat":
        if self.type not in ("text", "json_object", "json_schema"):
            raise ValueError(f"response_format type {self.type!r} is not one of text, json_object, json_schema")
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: Annotated[Text, WithJsonSchema({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"})]
    description: Text | None = None
    parameters: Annotated[dict[str, Any] | None, Encodable] = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _FUNCTION_NAME.fullmatch(v):
            raise ValueError(f"function name {v!r} must be 1-64 letters, digits, underscores or dashes")
        return v


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: Text


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    function: FunctionName
