"""Chat messages -> prompt text, through the checkpoint's Jinja chat template.

The template comes from tokenizer_config.json and is untrusted: it runs in jinja2's
ImmutableSandboxedEnvironment, with the globals Hugging Face templates expect (raise_exception,
strftime_now, a non-HTML-escaping tojson). It is compiled once; a template that fails to compile only
makes chat requests fail (400), never the server start.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from wisp.errors import WispError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str | None, special_tokens: dict[str, Any] | None = None):
        self._variables = {k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)}
        self._template = None
        self._problem = "this model has no chat template (tokenizer_config.json has no chat_template); use /v1/completions"
        if source is None:
            return
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            self._problem = f"the model's chat template does not compile: {exc}"

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt for `messages` (and `tools`, OpenAI's tool dicts, which the template lists for the model),
        ending with the assistant's generation prompt; WispError if it fails."""
        if self._template is None:
            raise WispError(self._problem)
        try:
            return self._template.render(messages=messages, tools=tools, add_generation_prompt=True, **self._variables)
        except Exception as exc:  # TemplateError, raise_exception(), or a template tripping on odd input
            raise WispError(f"the chat template rejected these messages: {exc}") from None
