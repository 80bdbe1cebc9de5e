"""Server-sent events, parsed as the HTML specification says (section 9.2, "Parsing an
event stream"), so any server's framing reads the same:

- lines end with LF, CRLF or CR (sse-starlette frames with CRLF by default; a CR at the end
  of one chunk and an LF at the start of the next are one line end);
- a line starting with ``:`` is a comment (keep-alive pings);
- ``field: value`` with at most one space after the colon removed; a line without a colon
  is a field with an empty value;
- ``data`` lines of one event are joined with LF; ``event`` names it (default
  ``message``); ``id`` sets the last event id (not when it holds a NUL); ``retry`` is the
  reconnection time in ms;
- a blank line dispatches the event, unless it has no data; an event not ended by a
  blank line when the stream ends is dropped.

Pure Python: :class:`SseParser` takes bytes and returns :class:`SseEvent` objects.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class SseEvent:
    data: str
    event: str = "message"
    id: str = ""


class SseParser:
    """Feed it bytes as they arrive; each call returns the events they completed."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""  # text of a line not ended yet
        self._after_cr = False  # the last character seen was a CR: skip one LF
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self.last_id = ""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        text = self._decoder.decode(chunk)
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")  # one byte-order mark may open the stream
        events: list[SseEvent] = []
        start = 0
        i = 0
        if self._after_cr and text.startswith("\n"):
            start = i = 1
        self._after_cr = False
        while i < len(text):
            ch = text[i]
            if ch in "\r\n":
                line = self._pending + text[start:i]
                self._pending = ""
                if ch == "\r":
                    if i + 1 < len(text):
                        if text[i + 1] == "\n":
                            i += 1
                    else:
                        self._after_cr = True
                event = self._line(line)
                if event is not None:
                    events.append(event)
                start = i + 1
            i += 1
        self._pending += text[start:]
        return events

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent("\n".join(data), event or "message", self.last_id)
