"""SQLite chat history: conversations and their messages, saved as they are written.

One file (``AppPaths.chats_db``) in WAL mode. An answer is saved while it streams: its row
is created when the request starts (state ``streaming``) and updated with the text so far
by a :class:`StreamWriter` (at most every ~100 ms or every few pieces), then finished as
``done``, ``stopped`` or ``failed``. A crash therefore loses at most the last 100 ms; a
row still ``streaming`` when nothing is answering it was interrupted (the view says so).

Main thread only: one connection, small writes (an update takes well under 2 ms).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATES = ("done", "streaming", "stopped", "failed")
ROLES = ("system", "user", "assistant")
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',
    session_id TEXT NOT NULL,
    context_from INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'done'
        CHECK (state IN ('done', 'streaming', 'stopped', 'failed')),
    tokens INTEGER,
    prompt_tokens INTEGER,
    note TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    thoughts TEXT NOT NULL DEFAULT '',
    UNIQUE (conversation_id, position)
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, position);
"""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str
    sampling: dict[str, Any]
    session_id: str
    context_from: int = 0  # messages before this position are kept but not sent


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    position: int
    role: str
    content: str
    state: str
    tokens: int | None  # the answer's completion tokens (assistant messages)
    prompt_tokens: int | None  # the prompt's tokens when this answer was made
    note: str  # why an answer ended early ("stopped by you", "interrupted: ...")
    created: float
    updated: float
    #: A reasoning model's thoughts before this answer: shown folded, never sent back.
    thoughts: str = ""


_CONV_COLS = ("id, title, created, updated, system_prompt, sampling, session_id, "
              "context_from")
_MSG_COLS = ("id, conversation_id, position, role, content, state, tokens, prompt_tokens, "
             "note, created, updated, thoughts")


def _conversation(row: tuple[Any, ...]) -> Conversation:
    try:
        sampling = json.loads(row[5]) if row[5] else {}
    except ValueError:
        sampling = {}
    return Conversation(row[0], row[1], row[2], row[3], row[4],
                        sampling if isinstance(sampling, dict) else {}, row[6], int(row[7]))


def _message(row: tuple[Any, ...]) -> Message:
    return Message(*row)


class ChatStore:
    """Conversations and messages in one SQLite file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, fast
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(conversations)")}
            if "context_from" not in columns:  # a version-1 file: every message was sent
                self._db.execute("ALTER TABLE conversations ADD COLUMN context_from "
                                 "INTEGER NOT NULL DEFAULT 0")
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(messages)")}
            if "thoughts" not in columns:  # before version 3: no reasoning models' thoughts
                self._db.execute("ALTER TABLE messages ADD COLUMN thoughts TEXT NOT NULL "
                                 "DEFAULT ''")
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- conversations --------------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", *, system_prompt: str = "",
                            sampling: dict[str, Any] | None = None) -> Conversation:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations (title, created, updated, system_prompt, sampling, "
            "session_id) VALUES (?, ?, ?, ?, ?, ?)",
            (title, now, now, system_prompt, json.dumps(sampling or {}), uuid.uuid4().hex))
        conv = self.conversation(int(cur.lastrowid or 0))
        assert conv is not None
        return conv

    def conversation(self, conv_id: int) -> Conversation | None:
        row = self._db.execute(f"SELECT {_CONV_COLS} FROM conversations WHERE id = ?",
                               (conv_id,)).fetchone()
        return _conversation(row) if row else None

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title = ?, updated = ? WHERE id = ?",
                         (title.strip() or "Untitled", time.time(), conv_id))

    def update_conversation(self, conv_id: int, *, system_prompt: str | None = None,
                            sampling: dict[str, Any] | None = None) -> None:
        """Save the conversation's system prompt and sampling settings (``None``: keep)."""
        if system_prompt is not None:
            self._db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?",
                             (system_prompt, conv_id))
        if sampling is not None:
            self._db.execute("UPDATE conversations SET sampling = ? WHERE id = ?",
                             (json.dumps(sampling), conv_id))

    def set_context_from(self, conv_id: int, position: int) -> None:
        """Send the model only the messages from ``position`` on; the earlier ones stay in
        the conversation (shown and exported as not sent)."""
        self._db.execute("UPDATE conversations SET context_from = ? WHERE id = ?",
                         (max(0, int(position)), conv_id))

    def sent_messages(self, conv_id: int) -> list[Message]:
        """The messages the model is sent (from the conversation's ``context_from``)."""
        conv = self.conversation(conv_id)
        start = conv.context_from if conv is not None else 0
        return [m for m in self.messages(conv_id) if m.position >= start]

    def delete_conversation(self, conv_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    def list_conversations(self) -> list[Conversation]:
        """Every conversation, the most recently used first."""
        rows = self._db.execute(f"SELECT {_CONV_COLS} FROM conversations "
                                "ORDER BY updated DESC, id DESC").fetchall()
        return [_conversation(r) for r in rows]

    def search_conversations(self, query: str) -> list[Conversation]:
        """Conversations whose title or any message contains ``query`` (case-insensitive)."""
        query = query.strip()
        if not query:
            return self.list_conversations()
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            f"SELECT {_CONV_COLS} FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' "
            "OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id "
            "AND m.content LIKE ?1 ESCAPE '\\') ORDER BY updated DESC, id DESC",
            (pattern,)).fetchall()
        return [_conversation(r) for r in rows]

    def _touch(self, conv_id: int, now: float) -> None:
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))

    # --- messages -------------------------------------------------------------------------

    def messages(self, conv_id: int) -> list[Message]:
        rows = self._db.execute(f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? "
                                "ORDER BY position", (conv_id,)).fetchall()
        return [_message(r) for r in rows]

    def message(self, message_id: int) -> Message | None:
        row = self._db.execute(f"SELECT {_MSG_COLS} FROM messages WHERE id = ?",
                               (message_id,)).fetchone()
        return _message(row) if row else None

    def add_message(self, conv_id: int, role: str, content: str = "", *,
                    state: str = "done") -> Message:
        """Append a message at the end of the conversation."""
        if role not in ROLES or state not in STATES:
            raise ValueError(f"role must be one of {ROLES} and state one of {STATES}, got "
                             f"{role!r} / {state!r}")
        now = time.time()
        with self._transaction():
            row = self._db.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM messages "
                                   "WHERE conversation_id = ?", (conv_id,)).fetchone()
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, position, role, content, state, "
                "created, updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conv_id, int(row[0]), role, content, state, now, now))
            self._touch(conv_id, now)
        message = self.message(int(cur.lastrowid or 0))
        assert message is not None
        return message

    def update_message(self, message_id: int, *, content: str | None = None,
                       state: str | None = None, tokens: int | None = None,
                       prompt_tokens: int | None = None, note: str | None = None,
                       thoughts: str | None = None) -> None:
        """Change the given fields of a message (``None``: keep)."""
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        fields = {"content": content, "state": state, "tokens": tokens,
                  "prompt_tokens": prompt_tokens, "note": note, "thoughts": thoughts}
        changes = {k: v for k, v in fields.items() if v is not None}
        if not changes:
            return
        sets = ", ".join(f"{k} = ?" for k in changes)
        self._db.execute(f"UPDATE messages SET {sets}, updated = ? WHERE id = ?",
                         (*changes.values(), time.time(), message_id))

    def delete_messages(self, message_ids: list[int]) -> None:
        with self._transaction():
            self._db.executemany("DELETE FROM messages WHERE id = ?",
                                 [(i,) for i in message_ids])

    def truncate_after(self, conv_id: int, position: int) -> int:
        """Delete the messages after ``position``; return how many went."""
        cur = self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND "
                               "position > ?", (conv_id, position))
        return cur.rowcount

    # --- export ---------------------------------------------------------------------------

    def export_json(self, conv_id: int) -> dict[str, Any]:
        conv = self.conversation(conv_id)
        if conv is None:
            raise KeyError(f"no conversation {conv_id}")
        messages = [{**{k: v for k, v in asdict(m).items() if k != "conversation_id"},
                     "sent_to_model": m.position >= conv.context_from}
                    for m in self.messages(conv_id)]
        return {"format": "onnx-local-llm chat", "version": SCHEMA_VERSION,
                **asdict(conv), "messages": messages}

    def export_markdown(self, conv_id: int) -> str:
        conv = self.conversation(conv_id)
        if conv is None:
            raise KeyError(f"no conversation {conv_id}")
        lines = [f"# {conv.title}", ""]
        if conv.system_prompt:
            lines += ["**System:** " + conv.system_prompt, ""]
        for m in self.messages(conv_id):
            heading = {"user": "You", "assistant": "Assistant"}.get(m.role, m.role.title())
            extra = f" ({m.note})" if m.note else ""
            if m.position < conv.context_from:
                extra += " (not sent to the model)"
            if m.role == "assistant" and m.tokens is not None:
                extra += f" — {m.tokens} tokens"
            lines += [f"## {heading}{extra}", ""]
            if m.thoughts:
                lines += ["<details><summary>Thinking</summary>", "", m.thoughts.strip(), "",
                          "</details>", ""]
            lines += [m.content, ""]
        return "\n".join(lines).rstrip() + "\n"


class StreamWriter:
    """Saves an answer as it streams: :meth:`append` pieces, :meth:`finish` at the end.

    Writes at most every ``interval_s`` or every ``every`` pieces (whichever comes first);
    :meth:`flush_if_due` lets a timer save text that arrived before a pause.
    """

    def __init__(self, store: ChatStore, message_id: int, *, interval_s: float = 0.1,
                 every: int = 16, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.message_id = message_id
        self.interval_s = interval_s
        self.every = every
        self._clock = clock
        self._parts: list[str] = []
        self._thoughts: list[str] = []
        self._pending = 0
        self._last = clock()
        self.writes = 0

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def thoughts(self) -> str:
        return "".join(self._thoughts)

    def append_thought(self, piece: str) -> None:
        """A reasoning model's thought text: saved apart from the answer."""
        self._thoughts.append(piece)
        self._added()

    def _added(self) -> None:
        self._pending += 1
        if self._pending >= self.every:
            self.flush()
        else:
            self.flush_if_due()

    def append(self, piece: str) -> None:
        self._parts.append(piece)
        self._added()

    def flush_if_due(self) -> None:
        if self._pending and self._clock() - self._last >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self.store.update_message(self.message_id, content=self.text,
                                      thoughts=self.thoughts if self._thoughts else None)
            self.writes += 1
        self._pending = 0
        self._last = self._clock()

    def finish(self, state: str, *, tokens: int | None = None,
               prompt_tokens: int | None = None, note: str | None = None) -> None:
        self.store.update_message(self.message_id, content=self.text, state=state,
                                  tokens=tokens, prompt_tokens=prompt_tokens, note=note,
                                  thoughts=self.thoughts if self._thoughts else None)
        self._pending = 0
        self.writes += 1
