"""The conversation list: search, new, rename (in place), delete.

A widget of its own so the main window can put it in its left sidebar; the chat view
holds it in a splitter until then.
"""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListView,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.client import single_shot
from app.context import AppContext
from app.models.conversations import ConversationListModel
from app.views.chat_parts import named


def confirm(parent: QWidget | None, text: str) -> bool:
    """Ask yes/no (tests replace this: no modal dialog may block them)."""
    answer = QMessageBox.question(parent, "Please confirm", text)
    return answer == QMessageBox.StandardButton.Yes


class ConversationList(QWidget):
    """Conversations of ``ctx.store``, newest first; signals what the user picks."""

    selected = Signal(object)  # conversation id (int), or None when nothing is selected
    new_requested = Signal()
    deleted = Signal(int)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("conversationListPanel")
        self.model = ConversationListModel(ctx.store, self)
        self._quiet = False
        self.search = named(QLineEdit(), "chatSearch")
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.view = named(QListView(), "conversationList")
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.view.setModel(self.model)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                  | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.new_button = named(QPushButton("New"), "chatNew")
        self.rename_button = named(QPushButton("Rename"), "chatRename")
        self.delete_button = named(QPushButton("Delete"), "chatDelete")
        buttons = QHBoxLayout()
        for button in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.search)
        layout.addWidget(self.view, 1)
        layout.addLayout(buttons)
        self._debounce = single_shot(150, self)
        self._debounce.timeout.connect(lambda: self.reload())
        self.search.textChanged.connect(lambda _t: self._debounce.start())
        self.view.selectionModel().currentChanged.connect(self._on_current)
        self.new_button.clicked.connect(self.new_requested.emit)
        self.rename_button.clicked.connect(self._edit_current)
        self.delete_button.clicked.connect(self.delete_current)
        self.reload()

    # --- public ---------------------------------------------------------------------------

    def reload(self, select: int | None = None) -> None:
        """Read the list again (keeping, or moving to, the selected conversation)."""
        keep = self.current_id() if select is None else select
        self._quiet = True
        try:
            self.model.reload(self.search.text())
            self._select_row(self.model.row_of(keep) if keep is not None else -1)
        finally:
            self._quiet = False
        self._update_buttons()

    def current_id(self) -> int | None:
        conv = self.model.conversation_at(self.view.currentIndex().row())
        return conv.id if conv is not None else None

    def select(self, conv_id: int | None) -> None:
        """Select ``conv_id`` (emits ``selected`` when it changes)."""
        self._select_row(self.model.row_of(conv_id) if conv_id is not None else -1)

    def rename(self, conv_id: int, title: str) -> None:
        row = self.model.row_of(conv_id)
        if row >= 0:
            self.model.setData(self.model.index(row), title)
        else:
            self.ctx.store.rename_conversation(conv_id, title)

    def delete_current(self) -> None:
        conv = self.model.conversation_at(self.view.currentIndex().row())
        if conv is None or not confirm(self, f"Delete the chat “{conv.title}”? "
                                             "Its messages cannot be brought back."):
            return
        self.ctx.store.delete_conversation(conv.id)
        self.deleted.emit(conv.id)
        self.reload(select=-1)
        if self.model.rowCount():
            self._select_row(0)
        else:
            self.selected.emit(None)

    # --- internals ------------------------------------------------------------------------

    def _select_row(self, row: int) -> None:
        flags = QItemSelectionModel.SelectionFlag.ClearAndSelect
        index = self.model.index(row) if row >= 0 else self.model.index(-1)
        self.view.selectionModel().setCurrentIndex(index, flags)

    def _on_current(self, *_args: object) -> None:
        self._update_buttons()
        if not self._quiet:
            self.selected.emit(self.current_id())

    def _edit_current(self) -> None:
        index = self.view.currentIndex()
        if index.isValid():
            self.view.edit(index)

    def _update_buttons(self) -> None:
        has = self.view.currentIndex().isValid()
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

