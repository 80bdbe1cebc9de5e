"""The chat: conversations on the left, the transcript, and the message box.

Answers stream in (the last message only is re-rendered, at most every ~40 ms) and are
saved while they stream (app/store.py). Each conversation is a session on the worker
(``X-Session-Id``): after an edit or a regenerate only the changed part is computed again.
A conversation that no longer fits the model's context is never cut silently: a banner
gives the numbers and offers a new chat or leaving the oldest messages out of what is sent.
Nothing a user wrote is deleted for that: the messages left out stay in the database, the
transcript (marked "not sent to the model") and the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QMenu,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.store import ChatStore, Conversation, Message
from app.views import chat_parts
from app.views.chat_answer import AnswerEnd, AnswerRun
from app.views.chat_fit import ContextFitting
from app.views.chat_list import ConversationList
from app.views.chat_message import MessageWidget
from app.views.chat_models import ModelPicker
from app.views.chat_parts import (
    Composer,
    ContextBanner,
    InlineNotice,
    SamplingPanel,
    export_text,
    named,
    write_in_background,
)
from app.views.chat_transcript import Transcript
from app.views.elided import ElidedLabel

NEW_TITLE = "New chat"
OPEN_KEY = "chat/open_conversation"


def ask_save_path(parent: QWidget | None, suggested: Path) -> Path | None:
    """Where to save an export (tests monkeypatch this: no modal dialog in tests)."""
    return chat_parts.ask_save_path(parent, suggested)


def title_from(text: str, limit: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


class ChatView(ContextFitting, QWidget):
    answer_started = Signal()
    answer_finished = Signal(object)  # the store's Message (id, state, content, note, ...)
    exported = Signal(object)  # Path

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatView")
        if ctx.store is None:
            ctx.store = ChatStore(ctx.paths.chats_db)
        self.ctx = ctx
        self.store: ChatStore = ctx.store
        self._conv: Conversation | None = None
        self._run: AnswerRun | None = None
        self._editing: int | None = None
        self._overflow: int | None = None  # history tokens the worker reported
        self._build()
        self._connect()
        listed = self.store.list_conversations()
        last = ctx.settings.value(OPEN_KEY, 0)  # the chat open when the app closed
        self.open_conversation(last if any(c.id == last for c in listed) else
                               listed[0].id if listed else None)

    # --- building -------------------------------------------------------------------------

    def _build(self) -> None:
        self.conversations = ConversationList(self.ctx, self)
        self.title = named(ElidedLabel(""), "chatTitle")
        self.settings_toggle = named(QToolButton(), "chatSettingsToggle")
        self.settings_toggle.setText("Settings")
        self.settings_toggle.setCheckable(True)
        self.export_button = named(QToolButton(), "chatExport")
        self.export_button.setText("Export")
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.export_button)
        menu.addAction("Markdown…", lambda: self.export("markdown"))
        menu.addAction("JSON…", lambda: self.export("json"))
        self.export_button.setMenu(menu)
        self.model_picker = ModelPicker(self.ctx, self)
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.model_picker)
        top.addWidget(self.settings_toggle)
        top.addWidget(self.export_button)
        self.settings = SamplingPanel(self)
        self.settings.hide()
        self.banner = ContextBanner(self)
        self.notice = InlineNotice(self)
        self.transcript = Transcript(self)
        right = QWidget()
        layout = QVBoxLayout(right)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.settings)
        layout.addWidget(self.banner)
        layout.addWidget(self.notice)
        layout.addWidget(self.transcript, 1)
        self.composer = Composer(self)
        self.input = self.composer.input
        self.send_button = self.composer.send_button
        self.stop_button = self.composer.stop_button
        self.regen_button = self.composer.regen_button
        self.editing_label = self.composer.editing_label
        layout.addWidget(self.composer)
        self.splitter = named(QSplitter(Qt.Orientation.Horizontal), "chatSplitter")
        self.splitter.addWidget(self.conversations)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([220, 700])
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.splitter)

    def _connect(self) -> None:
        self.conversations.selected.connect(self._on_selected)
        self.conversations.new_requested.connect(self.new_conversation)
        self.conversations.deleted.connect(self._on_deleted)
        self.conversations.model.renamed.connect(self._on_renamed)
        self.input.submitted.connect(self._submit)
        self.input.escaped.connect(self._escape)
        self.send_button.clicked.connect(self._submit)
        self.stop_button.clicked.connect(self.stop)
        self.regen_button.clicked.connect(self.regenerate)
        self.settings_toggle.toggled.connect(self.settings.setVisible)
        self.settings.changed.connect(self._save_settings)
        self.banner.new_chat.connect(self._banner_new_chat)
        self.banner.drop_oldest.connect(self.drop_oldest)
        self.ctx.down.connect(self._on_down)
        self.ctx.ready.connect(self._on_ready)
        self.ctx.model_changed.connect(self._on_model_changed)
        self.settings.set_model(self.ctx.model)
        self.transcript.edit_requested.connect(self._start_edit)
        app = QCoreApplication.instance()
        if app is not None:  # an answer still streaming at exit is saved as interrupted
            app.aboutToQuit.connect(self._on_quit)
        self._focus_key = QShortcut(QKeySequence("Ctrl+L"), self, self.focus_input,
                                    context=Qt.ShortcutContext.WidgetWithChildrenShortcut)

    def showEvent(self, event: QShowEvent) -> None:
        # the main window may bind Ctrl+L itself; two active bindings would cancel out
        taken = any(a.shortcut() == QKeySequence("Ctrl+L")
                    for a in self.window().findChildren(QAction))
        self._focus_key.setEnabled(not taken)
        super().showEvent(event)

    # --- public ---------------------------------------------------------------------------

    def current_conversation_id(self) -> int | None:
        return self._conv.id if self._conv is not None else None

    @property
    def answering(self) -> bool:
        return self._run is not None and not self._run.finished

    def message_widgets(self) -> list[MessageWidget]:
        return self.transcript.widgets()

    def focus_input(self) -> None:
        self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def _new_sampling(self) -> dict[str, Any]:
        """A new chat's sampling: what the loaded model recommends, over the app's own."""
        card = self.ctx.model if isinstance(self.ctx.model, dict) else None
        return self.ctx.settings.sampling_for(card)

    def _on_model_changed(self, card: Any) -> None:
        """A chat not started yet takes the new model's recommended sampling."""
        self.settings.set_model(card)
        conv = self._conv
        if card is None or (conv is not None and self.store.messages(conv.id)):
            return
        sampling = self._new_sampling()
        self.settings.load(self.settings.system_prompt.toPlainText(), sampling)
        if conv is not None:
            self.store.update_conversation(conv.id, sampling=sampling)

    def open_conversation(self, conv_id: int | None) -> None:
        """Show ``conv_id`` (None: nothing yet; the first message starts a chat)."""
        self._conv = self.store.conversation(conv_id) if conv_id is not None else None
        if self._conv is not None:
            self.ctx.settings.set_value(OPEN_KEY, self._conv.id)  # reopened next time
        self._cancel_edit()
        self.banner.hide()
        conv = self._conv
        self.settings.load(conv.system_prompt if conv else self.ctx.settings.system_prompt,
                           conv.sampling if conv and conv.sampling else self._new_sampling())
        self.title.setText(conv.title if conv else NEW_TITLE)
        if self.conversations.current_id() != conv_id:
            self.conversations.reload(select=conv_id if conv_id is not None else -1)
        self._render_all()

    def new_conversation(self) -> int:
        """Start a chat (reusing the current one while it is still empty)."""
        if self._conv is not None and not self.store.messages(self._conv.id):
            self.focus_input()
            return self._conv.id
        conv = self.store.create_conversation(NEW_TITLE,
                                              system_prompt=self.ctx.settings.system_prompt,
                                              sampling=self._new_sampling())
        self.conversations.reload(select=conv.id)
        self.open_conversation(conv.id)
        self.focus_input()
        return conv.id

    def send(self, text: str) -> bool:
        """Send ``text`` as the next message (or as the edit in progress)."""
        text = text.strip()
        if not text:
            return False
        if self.answering:
            self.notice.say("An answer is still being written: stop it (Esc) or wait.")
            return False
        if self._editing is not None:
            return self.edit_and_resend(self._editing, text)
        if self._conv is None:  # the first message starts a chat, with the panel's settings
            conv = self.store.create_conversation(
                NEW_TITLE, system_prompt=self.settings.system_prompt.toPlainText(),
                sampling=self.settings.sampling())
            self.open_conversation(conv.id)
        assert self._conv is not None
        if self._conv.title == NEW_TITLE and not self.store.messages(self._conv.id):
            self.store.rename_conversation(self._conv.id, title_from(text))
            self._refresh_conversation()
        self._add_widget(self.store.add_message(self._conv.id, "user", text))
        return self._answer()

    def stop(self) -> None:
        """Stop the answer being written; its text so far stays (state ``stopped``)."""
        if self._run is not None:
            self._run.stop()

    def regenerate(self) -> bool:
        """Answer the last message again (the previous answer is replaced)."""
        if self.answering or self._conv is None:
            return False
        messages = self.store.messages(self._conv.id)
        if messages and messages[-1].role == "assistant":
            self._remove_messages([messages[-1].id])
            messages = messages[:-1]
        if not messages or messages[-1].role != "user":
            return False
        return self._answer()

    def edit_and_resend(self, message_id: int, text: str) -> bool:
        """Replace your message ``message_id`` with ``text``; what followed it is dropped
        and answered again (the worker's session rewinds to the edit)."""
        message = self.store.message(message_id)
        if message is None or message.role != "user" or not text.strip():
            return False
        self.stop()
        if self.current_conversation_id() != message.conversation_id:
            self.open_conversation(message.conversation_id)
        self.store.update_message(message_id, content=text.strip())
        self.store.truncate_after(message.conversation_id, message.position)
        conv = self.store.conversation(message.conversation_id)
        if conv is not None and conv.context_from > message.position:
            self.store.set_context_from(conv.id, message.position)  # the edit is sent
            self._refresh_conversation()
        self._cancel_edit()
        self._render_all()
        return self._answer()

    def export(self, kind: str) -> Path | None:
        """Save the conversation as Markdown or JSON where the user chooses."""
        exported = export_text(self.store, self._conv, kind)
        if isinstance(exported, str):
            self.notice.say(exported)
            return None
        text, name = exported
        path = ask_save_path(self, Path.home() / name)
        if path is None:
            return None
        write_in_background(path, text, self, self._on_exported, self.notice.say)
        return path

    # --- answering ------------------------------------------------------------------------

    def _answer(self) -> bool:
        conv = self._conv
        assert conv is not None
        history = [{"role": m.role, "content": m.content}
                   for m in self.store.sent_messages(conv.id)
                   if m.role in ("user", "assistant") and m.content]
        system = self.settings.system_prompt.toPlainText().strip()
        payload = ([{"role": "system", "content": system}] if system else []) + history
        placeholder = self.store.add_message(conv.id, "assistant", "", state="streaming")
        run = AnswerRun(self.ctx, self.store, conv.id, placeholder.id, payload,
                        self.settings.sampling(), conv.session_id, self)
        self._run = run
        run.progressed.connect(self._on_progress)
        run.ended.connect(self._on_ended)
        self._add_widget(placeholder)
        self.banner.hide()
        self.notice.say("")
        self.conversations.reload()
        run.start()
        self._update_buttons()
        self.answer_started.emit()
        return True

    def _on_progress(self) -> None:
        run = self._run
        widget = self.transcript.widget_of(run.message_id) if run is not None else None
        if run is not None and widget is not None:
            widget.set_thoughts(run.writer.thoughts, thinking=not run.text)
            widget.set_text(run.text)

    def _on_ended(self, end: AnswerEnd) -> None:
        run = self._run
        if run is not None and run.message_id == end.message_id:
            self._run = None
            run.deleteLater()
        message = self.store.message(end.message_id)
        if end.overflow and not end.text and \
                end.conversation_id == self.current_conversation_id():
            self._remove_messages([end.message_id])  # the empty answer the app added
            self._show_overflow(end)
        elif message is not None and (widget := self.transcript.widget_of(message.id)):
            widget.update_from(message, answering=False)
        self._update_buttons()
        if message is not None:
            self.answer_finished.emit(message)

    # --- transcript -----------------------------------------------------------------------

    def _render_all(self) -> None:
        self.transcript.clear()
        if self._conv is not None:
            for message in self.store.messages(self._conv.id):
                self._add_widget(message)
                widget = self.transcript.widget_of(message.id)
                if widget is not None:
                    widget.set_left_out(message.position < self._conv.context_from)
        self._update_buttons()

    def _add_widget(self, message: Message) -> None:
        answering = self._run is not None and self._run.message_id == message.id
        self.transcript.add(message, answering)
        self._update_buttons()

    def _remove_messages(self, ids: list[int]) -> None:
        self.store.delete_messages(ids)
        self.transcript.remove(ids)
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.answering
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.regen_button.setEnabled(not busy and len(self.transcript) > 0)

    # --- small handlers -------------------------------------------------------------------

    def _submit(self) -> None:
        if self.send(self.input.toPlainText()):
            self.input.clear()

    def _escape(self) -> None:
        if self.answering:
            self.stop()
        elif self._editing is not None:
            self._cancel_edit()
            self.input.clear()

    def _start_edit(self, message_id: int) -> None:
        message = self.store.message(message_id)
        if message is None:
            return
        self._editing = message_id
        self.composer.begin_edit(message.content)

    def _cancel_edit(self) -> None:
        self._editing = None
        self.composer.end_edit()

    def _save_settings(self) -> None:
        if self._conv is not None:
            self.store.update_conversation(
                self._conv.id, system_prompt=self.settings.system_prompt.toPlainText(),
                sampling=self.settings.sampling())

    def _refresh_conversation(self) -> None:
        if self._conv is not None:
            self._conv = self.store.conversation(self._conv.id)
            self.title.setText(self._conv.title if self._conv else NEW_TITLE)
            self.conversations.reload()

    def _on_selected(self, conv_id: object) -> None:
        if conv_id != self.current_conversation_id():
            self.open_conversation(conv_id if isinstance(conv_id, int) else None)

    def _on_deleted(self, conv_id: int) -> None:
        if self._run is not None and self._run.conversation_id == conv_id:
            self.stop()
        if conv_id == self.current_conversation_id():
            self._conv = None
            self._render_all()

    def _on_renamed(self, conv_id: int, title: str) -> None:
        if conv_id == self.current_conversation_id():
            self._refresh_conversation()

    def window_closing(self) -> None:
        """The window closed (the worker stops next): an answer being written is saved
        as interrupted, not as failed by the stop."""
        self._on_quit()

    def _on_quit(self) -> None:
        if self._run is not None:
            self._run.stop("interrupted: the app closed")

    def _on_exported(self, path: object) -> None:
        self.notice.say(f"Saved the chat to {path}.")
        self.exported.emit(path)

    def _on_down(self, reason: str) -> None:
        # the reason is a sentence of its own (with brackets of its own): not put in more
        self.notice.say(f"The worker stopped. {reason.strip()} Your chats are saved; you "
                        "can send again when it is back.")

    def _on_ready(self) -> None:
        self.notice.say("")
