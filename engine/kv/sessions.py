"""Persistent sessions: a token history plus the pages that cache its KV.

The tokens are the truth; the pages are a cache of KV for a prefix of them (`kv_len`).
Losing pages (no room) only costs recomputation on the next turn, never correctness.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.errors import InvalidOptionError
from engine.kv.cache import PagePool, PageTable, PrefixCache, truncate_table


@dataclass
class Session:
    id: int
    tokens: list[int] = field(default_factory=list)
    table: PageTable = field(default_factory=PageTable)
    #: The KV of an earlier history the session rewound past, kept until its next turn
    #: starts so runs of it can be shifted into the new prompt (engine.kv.shift).
    aside: tuple[list[int], PageTable] | None = None

    @property
    def kv_len(self) -> int:
        return self.table.length


class SessionStore:
    def __init__(self, pool: PagePool, cache: PrefixCache | None) -> None:
        self.pool = pool
        self.cache = cache
        self._sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    def idle(self) -> list[Session]:
        """Sessions holding KV, least recently created first."""
        return [s for s in self._sessions.values() if s.kv_len]

    def create(self) -> Session:
        session = Session(next(self._ids))
        self._sessions[session.id] = session
        return session

    def get(self, session_id: int) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise InvalidOptionError(
                "session_id", f"no open session {session_id}",
                hint="create one with create_session(); closed sessions cannot be reused",
            ) from None

    def close(self, session_id: int) -> None:
        session = self.get(session_id)
        self.release_aside(session)
        self.truncate(session, 0)
        del self._sessions[session_id]

    def truncate(self, session: Session, length: int) -> None:
        """Keep the first `length` tokens (and at most that much KV)."""
        del session.tokens[length:]
        if session.table.length > length:
            truncate_table(self.pool, session.table, length, self.cache)

    def set_aside(self, session: Session, length: int) -> None:
        """`truncate` to `length`, keeping the KV past it aside for the next turn."""
        self.release_aside(session)
        table = session.table
        if table.length > length:
            session.aside = (list(session.tokens[:table.length]),
                             PageTable(list(table.pages), table.length))
            for page in table.pages:
                self.pool.retain(page)
                if self.cache is not None:
                    self.cache.acquired(page)
        self.truncate(session, length)

    def take_aside(self, session: Session) -> tuple[list[int], PageTable] | None:
        """The set-aside KV (the caller releases it with `release_table`)."""
        aside, session.aside = session.aside, None
        return aside

    def release_table(self, table: PageTable) -> None:
        truncate_table(self.pool, table, 0, self.cache)

    def release_aside(self, session: Session) -> None:
        aside = self.take_aside(session)
        if aside is not None:
            self.release_table(aside[1])

    def drop_kv(self, session: Session) -> None:
        truncate_table(self.pool, session.table, 0, self.cache)

    def fork(self, session_id: int) -> Session:
        """A new session with the same history, sharing pages (copied on write)."""
        source = self.get(session_id)
        child = self.create()
        child.tokens = list(source.tokens)
        child.table = PageTable(list(source.table.pages), source.table.length)
        for page in child.table.pages:
            self.pool.retain(page)
            if self.cache is not None:
                self.cache.acquired(page)
        return child
