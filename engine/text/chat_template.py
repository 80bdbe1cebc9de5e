"""Chat templates: Hugging Face Jinja templates rendered in a sandbox.

jinja2 is imported and the template compiled at the first render: a process that only
completes raw prompts (an editor's worker) never pays for it, and a model whose template
is broken still loads and serves raw prompts; the chat request gets the error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from engine.api import ChatMessage as ChatMessage
from engine.errors import InvalidPromptError, TokenizerError


class _TemplateRaised(Exception):
    """A chat template called ``raise_exception(msg)``."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # HF's filter: plain json.dumps (Jinja's own tojson HTML-escapes, which templates don't want)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _compile(source: str, origin: str) -> Any:
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text: as is."""

        tags = {"generation"}  # noqa: RUF012 - Jinja's Extension API declares it this way

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationTag, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(
            f"{origin}: the chat template does not compile (line {exc.lineno}: {exc.message})",
            hint="fix or replace the template; raw prompts still work without one",
        ) from exc


class ChatTemplate:
    """A Jinja chat template, rendered in a sandbox with Hugging Face semantics."""

    def __init__(self, source: str, origin: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self.origin = origin
        self._special = dict(special_tokens)
        self._template: Any = None

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
               tools: Sequence[Mapping[str, Any]] | None = None,
               extra: Mapping[str, Any] | None = None) -> str:
        variables: dict[str, Any] = {**self._special, **(extra or {})}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt)
        if tools is not None:
            variables["tools"] = [dict(t) for t in tools]
        if self._template is None:
            self._template = _compile(self.source, self.origin)
        try:
            return self._template.render(**variables)
        except _TemplateRaised as exc:
            raise TokenizerError(
                f"the chat template rejected the conversation: {exc}",
                hint="change the messages (roles, order, system prompt) as the message says",
            ) from exc
        except Exception as exc:  # any error inside template code
            raise TokenizerError(
                f"{self.origin}: rendering the chat template failed: {exc}",
                hint="check the messages' fields; the template may expect ones this request "
                "lacks",
            ) from exc


def message_dict(message: ChatMessage | Mapping[str, Any], index: int) -> dict[str, Any]:
    if isinstance(message, ChatMessage):
        return {"role": message.role, "content": message.content}
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise InvalidPromptError(
            f"messages[{index}] has no string 'role'",
            hint='each message needs a role and content, e.g. {"role": "user", "content": "hi"}',
        )
    return dict(message)
