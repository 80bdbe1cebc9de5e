"""The model's answer, piece by piece, as text and tool calls (engine.text.tool_calls has
the syntaxes).

:class:`CallParser` is fed the generated text as it streams and returns events: text
that is certainly not part of a call (:class:`Text`; a possible start of the call marker
is held back until it is decided), a call's name as soon as it is known
(:class:`CallStart`), fragments of its arguments as they arrive (:class:`Arguments`; they
join to the arguments' exact JSON text), and the call complete (:class:`CallEnd`). A whole
answer parsed at once gives the same events, so streamed and non-streamed answers agree.

A call whose JSON never closed (the answer was cut) ends at :meth:`finish` with what it
has; text that opened a call but never named one comes back as text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.text.tool_calls import CallSyntax


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int
    id: str
    name: str
    arguments: str
    #: The arguments' JSON closed (False: the answer was cut inside them).
    complete: bool


Event = Text | CallStart | Arguments | CallEnd

_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"'
                   r"\s*:\s*")


class _JsonEnd:
    """Follows one JSON value character by character; ``done`` once it closed."""

    __slots__ = ("depth", "done", "escape", "started", "string")

    def __init__(self) -> None:
        self.depth = 0
        self.string = self.escape = self.started = self.done = False

    def feed(self, ch: str) -> None:
        self.started = True
        if self.string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.string = False
                self.done = self.depth == 0
            return
        if ch == '"':
            self.string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            self.done = self.depth <= 0


@dataclass
class _Call:
    index: int
    id: str
    raw: str = ""
    name: str | None = None
    args_at: int | None = None
    args: str = ""
    args_scan: _JsonEnd = field(default_factory=_JsonEnd)
    scan: _JsonEnd = field(default_factory=_JsonEnd)


class CallParser:
    """See the module docstring. ``feed(text, token_id)``: the special marker token
    (which the detokenizer drops from the text) counts as its text."""

    def __init__(self, syntax: CallSyntax, *, max_calls: int | None = None) -> None:
        self.syntax = syntax
        self.max_calls = max_calls
        self._buf = ""           # text not yet decided
        self._state = "text"     # text | open | call | after | array | trailing
        self._in_array = False
        self._call: _Call | None = None
        self._count = 0
        self._emitted_text = False
        self._trailing = ""
        self.calls: list[CallEnd] = []

    # --- public -------------------------------------------------------------------------

    def feed(self, text: str, token_id: int | None = None) -> list[Event]:
        if token_id is not None and token_id == self.syntax.open_id:
            text = self.syntax.open + text
        elif token_id is not None and token_id == self.syntax.close_id:
            text = self.syntax.close + text
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        call = self._call
        if call is not None:
            if call.name is None:
                events += self._text(self._opened_text(call))
            else:
                events.append(self._end(call, complete=False))
        elif self._state == "open" and self._buf:
            events += self._text(self.syntax.open + self._buf)
        elif self._buf:
            events += self._text(self._buf)
        self._buf = ""
        return events

    # --- the states ---------------------------------------------------------------------

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            before = (self._state, len(self._buf))
            handler = getattr(self, "_on_" + self._state)
            events += handler(final)
            if (self._state, len(self._buf)) == before:
                return events

    def _text(self, text: str) -> list[Event]:
        if not text:
            return []
        self._emitted_text = True
        return [Text(text)]

    def _on_text(self, final: bool) -> list[Event]:
        buf, syntax = self._buf, self.syntax
        if self.max_calls == 0:
            self._buf = ""
            return self._text(buf)
        if syntax.format == "llama3" and not self._emitted_text:
            stripped = buf.lstrip()
            if not stripped:
                return []
            if stripped[0] == "{":
                self._buf = stripped
                self._state = "open"
                return []
            if not syntax.open:
                self._buf = ""
                return self._text(buf)
        marker = syntax.open
        at = buf.find(marker) if marker else -1
        if at >= 0:  # the blanks before a call are dropped
            self._buf = buf[at + len(marker):]
            self._state = "open"
            return self._text(buf[:at].rstrip())
        if final or not marker:
            self._buf = ""
            return self._text(buf)
        keep = _partial_suffix(buf, marker)
        cut = len(buf[:len(buf) - keep].rstrip())  # blanks wait: a call may follow
        self._buf = buf[cut:]
        return self._text(buf[:cut])

    def _on_open(self, final: bool) -> list[Event]:
        stripped = self._buf.lstrip()
        if not stripped:
            return []
        if stripped[0] == "[" and not self._in_array:
            self._in_array = True
            self._buf = stripped[1:]
            return []
        if stripped[0] != "{":
            self._state = "trailing"
            return []
        self._buf = stripped
        self._call = _Call(self._count, "call_" + uuid.uuid4().hex[:24])
        self._count += 1
        self._state = "call"
        return []

    def _on_call(self, final: bool) -> list[Event]:
        call = self._call
        assert call is not None
        events: list[Event] = []
        consumed = 0
        for ch in self._buf:
            consumed += 1
            call.raw += ch
            call.scan.feed(ch)
            if call.name is not None and call.args_at is not None and not call.args_scan.done:
                if call.args_scan.started or not ch.isspace():
                    call.args_scan.feed(ch)
                    call.args += ch
                    events.append(Arguments(call.index, ch))
            elif call.name is None:
                head = _HEAD.match(call.raw)
                if head is not None and call.scan.depth == 1 and not call.scan.string:
                    call.name = json.loads('"' + head.group(1) + '"')
                    call.args_at = head.end()
                    events.append(CallStart(call.index, call.id, call.name))
            if call.scan.done:
                break
        self._buf = self._buf[consumed:]
        events = _merge(events)
        if call.scan.done:
            events += self._close(call)
        return events

    def _close(self, call: _Call) -> list[Event]:
        events: list[Event] = []
        if call.name is None:  # keys in another order: read the object whole
            try:
                obj = json.loads(call.raw)
            except ValueError:
                obj = None
            name = obj.get("name") if isinstance(obj, dict) else None
            if not isinstance(name, str):
                self._call = None
                self._state = "trailing"
                return self._text(self._opened_text(call))
            args: Any = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                args = _loads_or(args)
            call.name, call.args = name, json.dumps(args, ensure_ascii=False)
            events += [CallStart(call.index, call.id, name), Arguments(call.index, call.args)]
        events.append(self._end(call, complete=True))
        self._call = None
        self._state = "after"
        return events

    def _on_after(self, final: bool) -> list[Event]:
        syntax, buf = self.syntax, self._buf
        stripped = buf.lstrip()
        if not stripped:
            return []
        if self._in_array:
            if stripped[0] == ",":
                self._buf, self._state = stripped[1:], "open"
            elif stripped[0] == "]":
                self._buf, self._in_array = stripped[1:], False
                self._state = "between"
            else:
                self._state = "trailing"
            return []
        if syntax.close:
            if stripped.startswith(syntax.close):
                self._buf, self._state = stripped[len(syntax.close):], "between"
                return []
            if syntax.close.startswith(stripped) and not final:
                return []
        self._state = "between"
        return []

    def _on_between(self, final: bool) -> list[Event]:
        stripped = self._buf.lstrip()
        if not stripped:
            return []
        open_ = self.syntax.open
        can_more = self.max_calls is None or self._count < self.max_calls
        if can_more and open_ and stripped.startswith(open_):
            self._buf, self._state = stripped[len(open_):], "open"
            return []
        if can_more and stripped[0] == ";" and self.syntax.format == "llama3":
            self._buf, self._state = stripped[1:], "open"
            return []
        if can_more and open_ and open_.startswith(stripped) and not final:
            return []
        self._state = "trailing"
        return []

    def _on_trailing(self, final: bool) -> list[Event]:
        buf, self._buf = self._buf, ""
        return self._text(buf)

    def _end(self, call: _Call, complete: bool) -> CallEnd:
        end = CallEnd(call.index, call.id, call.name or "", call.args, complete)
        self.calls.append(end)
        return end

    def _opened_text(self, call: _Call) -> str:
        return (self.syntax.open if self.syntax.open else "") + call.raw + self._buf


def _loads_or(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _merge(events: list[Event]) -> list[Event]:
    """Adjacent argument characters of one call as one fragment."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, Arguments) and isinstance(last, Arguments) \
                and last.index == event.index:
            out[-1] = Arguments(event.index, last.text + event.text)
        else:
            out.append(event)
    return out


@dataclass(frozen=True)
class Parsed:
    content: str
    calls: tuple[CallEnd, ...]


def parse_answer(syntax: CallSyntax, pieces: Sequence[tuple[str, int | None]],
                 max_calls: int | None = None) -> Parsed:
    """A whole answer (its text pieces and token ids) as content and calls."""
    parser = CallParser(syntax, max_calls=max_calls)
    events: list[Event] = []
    for text, token in pieces:
        events += parser.feed(text, token)
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Text))
    return Parsed(content, tuple(parser.calls))
