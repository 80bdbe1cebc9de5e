"""One streamed answer: the request, its text saved as it arrives, the screen updated at
most every ~40 ms, and how it ended (done, stopped, failed, or did not fit)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.client import ApiFailure, ChatOutcome, ChatStream, single_shot
from app.context import AppContext
from app.memory_words import gui_words, refusal_words
from app.store import ChatStore, StreamWriter

TICK_MS = 40  # screen updates while streaming: at most this often
BUSY_RETRIES = 20  # a session still finishing the previous turn: retry this many times
BUSY_RETRY_MS = 250
OVERFLOW = "context_length_exceeded"
WORKER_STOPPED = "interrupted: the worker stopped"
_PROMPT_TOKENS = re.compile(r"(?:prompt has |^)(\d+) tokens")


@dataclass(frozen=True)
class AnswerEnd:
    conversation_id: int
    message_id: int
    state: str  # done | stopped | failed
    note: str
    text: str
    failure: ApiFailure | None = None
    usage: dict[str, Any] | None = None

    @property
    def overflow(self) -> bool:
        return self.failure is not None and self.failure.code == OVERFLOW

    def prompt_tokens(self) -> int | None:
        """The history's size in tokens, from the worker's overflow message."""
        match = _PROMPT_TOKENS.search(self.failure.message) if self.failure else None
        return int(match.group(1)) if match else None


def cut_point(sizes: list[int], users: list[int], history: int | None, limit: int | None,
              room: int) -> int:
    """Index of the first message to keep when dropping the oldest ones: a user message
    (never the last one dropped), far enough to bring ``history`` tokens under ``limit``
    with ``room`` left for the answer. ``sizes``: each message's characters, used to
    estimate tokens in proportion."""
    if history is None or limit is None or len(users) < 2:
        return users[1] if len(users) > 1 else 0
    total = sum(sizes) or 1
    needed = (history - limit + room) * total / history
    for cut in users[1:]:
        if sum(sizes[:cut]) >= needed:
            return cut
    return users[-1]


def fits_without_older(sizes: list[int], users: list[int], history: int | None,
                       limit: int | None, room: int) -> bool:
    """Whether leaving the older messages out could help: there is an older exchange, and
    the last one alone (estimated in proportion to its characters) leaves ``room`` tokens
    for the answer."""
    if len(users) < 2:
        return False
    if history is None or limit is None:
        return True
    total = sum(sizes) or 1
    return history * sum(sizes[users[-1]:]) / total + room <= limit


def context_length(ctx: AppContext) -> int | None:
    meta = (ctx.model or {}).get("meta") or {}
    value = meta.get("context_length")
    return int(value) if isinstance(value, int) and value > 0 else None


class AnswerRun(QObject):
    """Streams one assistant message into the row ``message_id`` of the store."""

    progressed = Signal()  # the text grew (coalesced: at most every TICK_MS)
    ended = Signal(object)  # AnswerEnd

    def __init__(self, ctx: AppContext, store: ChatStore, conversation_id: int,
                 message_id: int, messages: list[dict[str, str]], options: dict[str, Any],
                 session_id: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.conversation_id = conversation_id
        self.message_id = message_id
        self.messages = messages
        self.options = options
        self.session_id = session_id
        self.writer = StreamWriter(store, message_id)
        self.stream: ChatStream | None = None
        self.finished = False
        self._dirty = False
        self._retries = 0
        self._tick = QTimer(self)
        self._tick.setInterval(TICK_MS)
        self._tick.timeout.connect(self._on_tick)
        self._retry = single_shot(BUSY_RETRY_MS, self)
        self._retry.timeout.connect(self.start)

    @property
    def text(self) -> str:
        return self.writer.text

    def start(self) -> None:
        if self.finished:
            return
        self.stream = self.ctx.client.chat(self.messages, self.options,
                                           session_id=self.session_id,
                                           model=str((self.ctx.model or {}).get("id") or ""))
        self.stream.delta.connect(self._on_delta)
        self.stream.thought.connect(self._on_thought)
        self.stream.finished.connect(self._on_finished)
        self.stream.failed.connect(self._on_failed)
        self._tick.start()

    def stop(self, note: str = "stopped") -> None:
        """Stop now; the text so far stays (state ``stopped``)."""
        if self.finished:
            return
        if self.stream is not None:
            self.stream.abort()
        self._end("stopped", note)

    # --- the stream -----------------------------------------------------------------------

    def _on_delta(self, piece: str) -> None:
        self.writer.append(piece)
        self._dirty = True

    def _on_thought(self, piece: str) -> None:
        self.writer.append_thought(piece)
        self._dirty = True

    def _on_tick(self) -> None:
        self.writer.flush_if_due()
        if self._dirty:
            self._dirty = False
            self.progressed.emit()

    def _on_finished(self, outcome: ChatOutcome) -> None:
        usage = outcome.usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        note = ""
        limit = context_length(self.ctx)
        if isinstance(prompt, int) and isinstance(completion, int) and limit and \
                prompt + completion >= limit:
            note = f"the answer reached the end of the model's context ({limit} tokens)"
        elif outcome.finish_reason == "length":
            note = f"the answer reached max tokens ({self.options.get('max_tokens')})"
        self._end("done", note, usage=outcome.usage,
                  tokens=completion if isinstance(completion, int) else None,
                  prompt_tokens=prompt if isinstance(prompt, int) else None)

    def _on_failed(self, failure: ApiFailure) -> None:
        if failure.code == "session_busy" and not self.text and \
                self._retries < BUSY_RETRIES:
            self._retries += 1  # the worker is still closing the previous (stopped) turn
            self._retry.start()
            return
        if failure.unreachable:
            note = WORKER_STOPPED if self.text else WORKER_STOPPED + " before answering"
        elif failure.code == OVERFLOW:
            note = "not sent: the conversation does not fit the model's context"
        elif failure.code == "resource_limit":
            note = refusal_words(failure.message)
        else:
            note = f"failed: {gui_words(failure.text())}"
        self._end("failed", note, failure=failure)

    def _end(self, state: str, note: str, *, failure: ApiFailure | None = None,
             usage: dict[str, Any] | None = None, tokens: int | None = None,
             prompt_tokens: int | None = None) -> None:
        self.finished = True
        self._tick.stop()
        self._retry.stop()
        self.writer.finish(state, tokens=tokens, prompt_tokens=prompt_tokens, note=note)
        if self._dirty:
            self._dirty = False
            self.progressed.emit()
        self.ended.emit(AnswerEnd(self.conversation_id, self.message_id, state, note, self.text,
                                 failure, usage))
