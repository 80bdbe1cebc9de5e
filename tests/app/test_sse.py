"""The SSE parser on the framings servers use (LF, CRLF, CR), split anywhere."""

from __future__ import annotations

import pytest

from app.sse import SseEvent, SseParser

STREAM = ('data: {"a": 1}\n\n'
          ': ping - 2024-01-01\n\n'
          'event: error\nid: 7\ndata: first\ndata:second\n\n'
          'data\n\n'
          'id: 8\nretry: 1500\n\n'
          'data: tail without blank line')


def _parse(raw: bytes, step: int) -> tuple[list[SseEvent], SseParser]:
    parser = SseParser()
    events: list[SseEvent] = []
    for i in range(0, len(raw), step):
        events += parser.feed(raw[i:i + step])
    return events, parser


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_every_line_ending_and_every_split_give_the_same_events(ending, step):
    raw = ("\ufeff" + STREAM.replace("\n", ending)).encode("utf-8")
    events, parser = _parse(raw, step)
    # "data" alone is a data field with an empty value: an event with empty data
    assert events == [SseEvent('{"a": 1}'), SseEvent("first\nsecond", "error", "7"),
                      SseEvent("", "message", "7")]
    assert parser.last_id == "8" and parser.retry_ms == 1500


def test_a_multibyte_character_split_across_chunks_is_kept():
    raw = 'data: café ☕\r\n\r\n'.encode()
    events, _ = _parse(raw, 1)
    assert events == [SseEvent("café ☕")]
