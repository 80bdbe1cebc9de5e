"""The conversation list as a Qt item model: one row per conversation, titles editable."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)

from app.store import ChatStore, Conversation

ID_ROLE = Qt.ItemDataRole.UserRole + 1

_Index = QModelIndex | QPersistentModelIndex


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


class ConversationListModel(QAbstractListModel):
    """Conversations from a :class:`ChatStore`, newest first, filtered by a search text.

    Editing a row's title (``setData``) renames the conversation in the store.
    """

    renamed = Signal(int, str)  # conversation id, new title

    def __init__(self, store: ChatStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.query = ""
        self._rows: list[Conversation] = []

    def reload(self, query: str | None = None) -> None:
        if query is not None:
            self.query = query
        self.beginResetModel()
        self._rows = self.store.search_conversations(self.query)
        self.endResetModel()

    def conversation_at(self, row: int) -> Conversation | None:
        return self._rows[row] if 0 <= row < len(self._rows) else None

    def row_of(self, conv_id: int) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == conv_id), -1)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        conv = self.conversation_at(index.row()) if index.isValid() else None
        if conv is None:
            return None
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return conv.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{conv.title}\nlast used {_when(conv.updated)}"
        if role == ID_ROLE:
            return conv.id
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        base = super().flags(index)
        return base | Qt.ItemFlag.ItemIsEditable if index.isValid() else base

    def setData(self, index: _Index, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:
        conv = self.conversation_at(index.row()) if index.isValid() else None
        title = str(value).strip()
        if conv is None or role != Qt.ItemDataRole.EditRole or not title:
            return False
        self.store.rename_conversation(conv.id, title)
        fresh = self.store.conversation(conv.id)
        if fresh is not None:
            self._rows[index.row()] = fresh
        self.dataChanged.emit(index, index)
        self.renamed.emit(conv.id, title)
        return True
