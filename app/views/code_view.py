"""Code: an editor that asks the worker's ``POST /infill`` for the middle while you type.

After typing pauses (``debounce_ms``, 250 by default; setting ``code/debounce_ms``) the
text before and after the cursor goes to the worker in llama.cpp's dialect, laid out as
llama.vim does (the lines above as ``input_prefix``, the typed part of the line as
``prompt``, the rest as ``input_suffix``). The answer shows as grey ghost text at the
cursor: Tab takes it, Esc drops it, typing replaces it. Lines that are only a Markdown
code fence are left out of a suggestion. A model without FIM tokens works
too: the worker completes from the prefix alone and trims the answer by the suffix itself
(``engine.generation.fim_plain``), so the pane does not trim it again.

Newest wins: a request still in flight is aborted when a newer one starts, and an answer
for a text or cursor that has changed since it was asked for is dropped, never shown.
Under the editor one line says how long the last suggestion took and how many tokens it
has, or in words why there is none (no model, the worker not answering, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QElapsedTimer, Signal
from PySide6.QtGui import QPalette, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.client import ApiFailure, JsonReply, single_shot
from app.context import AppContext
from app.remote import fim_answer, fim_request, refused
from app.views import while_alive
from app.views.code_editor import CodeEditor
from app.views.code_files import CodeFiles

DEFAULT_DEBOUNCE_MS = 250
DEFAULT_N_PREDICT = 48
READY_TEXT = "Type to get suggestions; Tab takes one, Esc drops it."
#: Lines of context sent around the cursor (llama.vim's n_prefix / n_suffix).
PREFIX_LINES, SUFFIX_LINES = 256, 64

STARTER = '''import math


def circle_area(radius: float) -> float:
    """The area of a circle."""
    return '''


@dataclass(frozen=True)
class FimContext:
    """The text around the cursor, split the way /infill wants it."""

    prefix: str
    prompt: str
    suffix: str


def fim_context(editor: CodeEditor) -> FimContext:
    """Lines above the cursor, the typed part of its line, and the rest."""
    cursor = editor.textCursor()
    block = cursor.block()
    line = block.text()
    # positionInBlock counts UTF-16 units; Python strings count code points
    units = line.encode("utf-16-le")
    col = cursor.positionInBlock() * 2
    typed = units[:col].decode("utf-16-le", "replace")
    after = units[col:].decode("utf-16-le", "replace")
    above: list[str] = []
    prev = block.previous()
    while prev.isValid() and len(above) < PREFIX_LINES:
        above.append(prev.text())
        prev = prev.previous()
    below: list[str] = []
    nxt = block.next()
    while nxt.isValid() and len(below) < SUFFIX_LINES:
        below.append(nxt.text())
        nxt = nxt.next()
    prefix = "".join(f"{text}\n" for text in reversed(above))
    suffix = after + "\n" + "".join(f"{text}\n" for text in below)
    return FimContext(prefix, typed, suffix)


def describe(failure: ApiFailure) -> str:
    """A failed completion in a few words for the line under the editor."""
    if failure.unreachable:
        return "Worker unreachable: no suggestions until it answers again."
    # the llama.cpp dialect's error code is the HTTP status: read the message too
    message = failure.message.lower()
    if failure.code == "model_loading" or (failure.status == 503 and "is loading" in message):
        return "The model is loading: suggestions start when it is ready."
    if failure.code == "model_not_loaded" or (failure.status == 503
                                               and "no model" in message):
        return "No model: load a code model in Models to get suggestions."
    return f"No suggestion: {failure.text()}"


class CodeView(QWidget):
    """The FIM code pane (see the module docstring)."""

    suggestion_shown = Signal(str)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeView")
        self.ctx = ctx
        self.n_predict = int(ctx.settings.value("code/n_predict", DEFAULT_N_PREDICT))
        self.editor = CodeEditor(self)
        self.status = QLabel(READY_TEXT)
        self.status.setObjectName("codeStatus")
        self.status.setWordWrap(True)
        self.status.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        row = QHBoxLayout()
        row.setContentsMargins(4, 0, 4, 0)
        row.addWidget(self.status, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        self.files = CodeFiles(ctx, self.editor, self)
        self.files.problem.connect(self._set_status)
        layout.addWidget(self.files.bar)
        layout.addWidget(self.editor, 1)
        layout.addLayout(row)
        self._timer = single_shot(int(ctx.settings.value("code/debounce_ms",
                                                         DEFAULT_DEBOUNCE_MS)), self)
        self._timer.timeout.connect(self.request_now)
        self._reply: JsonReply | None = None
        self._clock = QElapsedTimer()
        self._edits = 0
        self._asked: tuple[int, int, int] | None = None  # (request id, edits, cursor)
        self._line_rest = ""  # the text after the cursor on its line, when asked mid-line
        self._suffix = ""  # the suffix of the request in flight
        #: Counters a test (or a curious user) can read.
        self.requests_sent = 0
        self.requests_aborted = 0
        self.answers_dropped = 0
        self.shown_request = 0
        self.last_latency_ms: float | None = None
        self.editor.setPlainText(STARTER)
        self.editor.moveCursor(QTextCursor.MoveOperation.End)
        self.editor.document().contentsChanged.connect(self._on_edited)
        self.editor.accepted.connect(lambda _text: self._set_status("Suggestion taken."))
        self.editor.dismissed.connect(lambda: self._set_status("Suggestion dropped."))
        ctx.model_changed.connect(self._on_model_changed)
        ctx.down.connect(self._on_down)
        ctx.ready.connect(lambda: self._set_status(READY_TEXT))

    # --- public -------------------------------------------------------------------------

    @property
    def suggestion(self) -> str:
        """The ghost text now shown ("" when none)."""
        return self.editor.ghost

    @property
    def debounce_ms(self) -> int:
        return self._timer.interval()

    @debounce_ms.setter
    def debounce_ms(self, value: int) -> None:
        self._timer.setInterval(max(0, int(value)))

    @property
    def in_flight(self) -> bool:
        return self._reply is not None and not self._reply.done

    def accept(self) -> bool:
        """Insert the suggestion at the cursor (what Tab does)."""
        return self.editor.accept_ghost()

    def dismiss(self) -> bool:
        """Drop the suggestion (what Esc does)."""
        return self.editor.dismiss_ghost()

    def request_now(self) -> None:
        """Ask for a suggestion for the text and cursor as they are now (no debounce)."""
        self._timer.stop()
        self._abort()
        if not self.ctx.client.is_configured:
            self._set_status("Worker unreachable: it has not started yet.")
            return
        fim = fim_context(self.editor)
        body: dict[str, Any] = {
            "input_prefix": fim.prefix, "input_suffix": fim.suffix, "prompt": fim.prompt,
            "n_predict": self.n_predict, "temperature": 0.0, "stream": False,
            "cache_prompt": True, "t_max_predict_ms": 2000}
        rest = fim.suffix.split("\n", 1)[0]
        self._line_rest = rest if rest.strip() else ""
        if self._line_rest:
            body["stop"] = ["\n"]  # mid-line: a one-line suggestion, and it comes sooner
        path = "/infill"
        caps = self.ctx.remote_caps if self.ctx.remote else None
        if caps is not None:  # a remote server: the best path it has (app/remote.py)
            path, body = fim_request(caps, fim.prefix, fim.prompt, fim.suffix, self.n_predict,
                                     bool(self._line_rest))
        self._suffix = fim.suffix
        self.requests_sent += 1
        request_id = self.requests_sent
        self._asked = (request_id, self._edits, self.editor.textCursor().position())
        reply = self.ctx.client.call("POST", path, body, timeout_ms=30_000)
        # an answer can come after this view is gone (the window closed while asking)
        reply.finished.connect(while_alive(
            self, lambda answer: self._on_answer(reply, request_id, answer)))
        reply.failed.connect(while_alive(self, lambda failure: self._on_failed(reply, failure)))
        self._reply = reply
        self._clock.start()

    # --- answers ------------------------------------------------------------------------

    def _current(self, reply: JsonReply, request_id: int) -> bool:
        """Whether this answer still fits what the editor shows (else it is dropped)."""
        if reply is not self._reply:
            return False
        state = (request_id, self._edits, self.editor.textCursor().position())
        return self._asked == state

    def _on_answer(self, reply: JsonReply, request_id: int, answer: Any) -> None:
        elapsed = float(self._clock.elapsed())
        reply.deleteLater()  # one reply per pause in typing: do not keep them all
        if not self._current(reply, request_id):
            self.answers_dropped += 1
            return
        self._reply = None
        caps = self.ctx.remote_caps if self.ctx.remote else None
        if caps is not None:
            item = fim_answer(caps, answer, self._suffix)
        else:
            item = answer[0] if isinstance(answer, list) and answer else answer
            item = item if isinstance(item, dict) else {}
        text = trim_repetition(drop_fences(str(item.get("content") or "")).rstrip())
        if self._line_rest and item.get("fim_layout") != "prefix-only":
            # the worker trims prefix-only answers itself (engine.fim_trim), brackets aware
            text = fit_mid_line(text, self._line_rest)
        tokens = item.get("tokens_predicted")
        if not isinstance(tokens, int):
            tokens = (item.get("timings") or {}).get("predicted_n", 0)
        self.last_latency_ms = elapsed
        what = f"{elapsed:.0f} ms · {tokens} token{'s' if tokens != 1 else ''}"
        if not text.strip():
            self.editor.clear_ghost()
            self._set_status(f"No suggestion here ({what}).")
            return
        self.shown_request = request_id
        self.editor.set_ghost(text)
        self._set_status(f"Suggestion in {what}. Tab takes it, Esc drops it.")
        self.suggestion_shown.emit(text)

    def _on_failed(self, reply: JsonReply, failure: ApiFailure) -> None:
        reply.deleteLater()
        if reply is not self._reply:
            return
        self._reply = None
        caps = self.ctx.remote_caps if self.ctx.remote else None
        if caps is not None and refused(failure) and caps.drop_path():
            self.request_now()  # this server has no such path: the next best one
            return
        self._set_status(describe(failure))

    # --- plumbing -----------------------------------------------------------------------

    def _on_edited(self) -> None:
        self._edits += 1
        self._abort()
        self._timer.start()

    def _abort(self) -> None:
        if self._reply is not None and not self._reply.done:
            self._reply.abort()
            self._reply.deleteLater()
            self.requests_aborted += 1
        self._reply = None

    def _set_status(self, text: str) -> None:
        self.status.setText(text)

    def _on_model_changed(self, card: object) -> None:
        if card is None:
            self._abort()
            self.editor.clear_ghost()
            self._set_status("No model: load a code model in Models to get suggestions.")
        else:
            self._set_status(READY_TEXT)

    def _on_down(self, why: str) -> None:
        self._abort()
        self.editor.clear_ghost()
        self._set_status(f"Worker unreachable: {why}")


def trim_repetition(text: str, min_repeats: int = 3, max_unit: int = 24) -> str:
    """``text`` without a loop it ends in: when the suggestion ends by repeating a piece of
    2..``max_unit`` characters ``min_repeats`` or more times until the token limit (small
    models fall into ``len(len(len(...``), the piece is kept once. Repeats that end before
    the text does (``[0, 0, 0]``) and runs of one character (``1000``) are left alone."""
    for start in range(len(text)):
        rest = text[start:]
        for unit in range(2, max_unit + 1):
            piece = rest[:unit]
            if len(rest) < unit * min_repeats or len(set(piece)) < 2 or not piece.strip():
                continue
            whole, tail = divmod(len(rest), unit)
            if rest == piece * whole + piece[:tail]:
                return text[:start + unit].rstrip()
    return text


_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[\w+#.-]*[ \t]*$")


def drop_fences(text: str) -> str:
    """``text`` without lines that are only a Markdown code fence (```, ```js, ~~~): a
    model that has seen chat answers may open or close one in the middle of code."""
    lines = text.split("\n")
    kept = [line for line in lines if not _FENCE.match(line)]
    return text if len(kept) == len(lines) else "\n".join(kept)


def fit_mid_line(text: str, rest: str) -> str:
    """A suggestion for a cursor with ``rest`` after it on the line: its first line only,
    less the end that repeats what ``rest`` already holds (a model that writes
    ``len(values)):`` before an existing ``):`` would otherwise show ``len(values)):):``)."""
    line = text.split("\n", 1)[0].rstrip()
    ahead = rest.strip()
    for k in range(min(len(line), len(ahead)), 0, -1):
        if line.endswith(ahead[:k]):
            return line[:-k].rstrip()
    return line
