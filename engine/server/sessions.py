"""Chat sessions the client names with ``X-Session-Id``, kept as engine sessions.

The OpenAI chat API re-sends the whole conversation every turn. With the header
``X-Session-Id: NAME`` (any text of 1..128 characters) the worker keeps one engine session
per NAME, created on first use, whose token history is the conversation so far: the last
turn's prompt and answer. Each turn, on the engine thread:

1. the conversation is rendered with the model's chat template and encoded, exactly as a
   request without the header would be;
2. the result is compared with the session's tokens: their common prefix is kept, and
   when the session holds more than that (an edited or regenerated message, an answer the
   client cut short) it is rewound to the common prefix first;
3. only the tokens after the common prefix run, through the scheduler, as a turn of that
   engine session: the KV of the history comes from the session's pages, so nothing
   before is prefilled again, even when other requests used the engine in between. The
   KV past the common prefix is kept aside for the turn: long runs of it that the new
   prompt holds at other positions (the oldest exchange left out) are shifted into place
   instead of recomputed (``engine.kv.shift``; ``--cache-reuse``).

The answer is the one the request gets without the header (same prompt tokens, same stop
tokens, same options). ``usage.prompt_tokens_details.cached_tokens`` says how many prompt
tokens were not prefilled. One turn per session at a time: a request for a session that is
still answering gets 409 with Retry-After. A session is closed after ``session_idle_s``
without a turn, by ``DELETE /v1/sessions/{name}``, when its model is unloaded, and when
``max_sessions`` are open and another is needed (the least recently used idle one goes).
Names are the client's own labels, not secrets: callers that share an API key share them.

Everything here runs on the engine thread, except :meth:`SessionRegistry.count`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.config import GenerateOptions
from engine.engine import Engine, GenerateRequest
from engine.kv.reuse import common_prefix_len
from engine.server.errors import ApiError
from engine.server.generation import Chunk, Final, run_generation
from engine.server.models import ModelManager
from engine.server.worker import EngineWorker, Priority, WorkerStoppedError
from engine.text.reasoning import thought_mode
from engine.text.tokenizer import ChatMessage

log = logging.getLogger(__name__)
Messages = tuple[ChatMessage | Mapping[str, Any], ...]
Tools = tuple[Mapping[str, Any], ...] | None

DEFAULT_IDLE_S = 1800.0
DEFAULT_MAX_SESSIONS = 64
MAX_NAME_CHARS = 128
HEADER = "X-Session-Id"


def session_name(raw: str | None) -> str | None:
    """The session a request names (None: no header, or an empty one), or a 400."""
    if raw is None or not raw.strip():
        return None
    name = raw.strip()
    if len(name) > MAX_NAME_CHARS:
        raise ApiError(400, f"{HEADER}: at most {MAX_NAME_CHARS} characters, got {len(name)}",
                       param=HEADER, code="invalid_value",
                       hint="name the conversation with a short id, e.g. a UUID")
    return name


@dataclass
class NamedSession:
    name: str
    session_id: int
    last_used: float
    busy: bool = False
    #: Deleted while answering: the engine session closes when the turn ends.
    closed: bool = False


class SessionRegistry:
    """Session names -> engine sessions of the served engine (see the module docstring)."""

    def __init__(self, *, idle_timeout_s: float = DEFAULT_IDLE_S,
                 max_sessions: int = DEFAULT_MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._owner: weakref.ref[Engine] | None = None
        self._named: dict[str, NamedSession] = {}

    def _table(self, engine: Engine) -> dict[str, NamedSession]:
        if self._owner is None or self._owner() is not engine:
            self._owner = weakref.ref(engine)
            self._named = {}  # another model: the old engine's sessions went with it
        return self._named

    def count(self, engine: Engine | None) -> int:
        """Named sessions open on ``engine`` (any thread)."""
        owner = self._owner() if self._owner is not None else None
        return len(self._named) if engine is not None and owner is engine else 0

    def names(self, engine: Engine) -> list[str]:
        return list(self._table(engine))

    def lookup(self, engine: Engine, name: str) -> NamedSession | None:
        return self._table(engine).get(name)

    def acquire(self, engine: Engine, name: str) -> NamedSession:
        """The session ``name`` (created when new), marked busy for one turn."""
        table = self._table(engine)
        self.sweep(engine)
        entry = table.get(name)
        if entry is not None and entry.busy:
            raise ApiError(409, f"the session {name!r} is still answering another request",
                           param=HEADER, code="session_busy", retry_after_s=1,
                           hint="wait for the answer (or cancel it) before the next turn")
        if entry is None:
            self._make_room(engine, table)
            entry = table[name] = NamedSession(name, engine.create_session(), self._clock())
        entry.busy = True
        return entry

    def release(self, engine: Engine, entry: NamedSession) -> None:
        entry.busy = False
        entry.last_used = self._clock()
        if entry.closed:
            _close(engine, entry)

    def close(self, engine: Engine, name: str) -> bool:
        """Close ``name``; False when there is no such session."""
        entry = self._table(engine).pop(name, None)
        if entry is None:
            return False
        if entry.busy:
            entry.closed = True
        else:
            _close(engine, entry)
        return True

    def sweep(self, engine: Engine) -> int:
        """Close sessions idle longer than the timeout; return how many."""
        table = self._table(engine)
        cutoff = self._clock() - self.idle_timeout_s
        expired = [e for e in table.values() if not e.busy and e.last_used <= cutoff]
        for entry in expired:
            del table[entry.name]
            _close(engine, entry)
        return len(expired)

    def _make_room(self, engine: Engine, table: dict[str, NamedSession]) -> None:
        if len(table) < self.max_sessions:
            return
        idle = [e for e in table.values() if not e.busy]
        if not idle:
            raise ApiError(429, f"all {len(table)} sessions are answering; at most "
                           f"{self.max_sessions} are kept", param=HEADER,
                           code="too_many_sessions", retry_after_s=1,
                           hint="retry shortly, or close sessions with DELETE /v1/sessions/NAME")
        oldest = min(idle, key=lambda e: e.last_used)
        del table[oldest.name]
        _close(engine, oldest)


def _close(engine: Engine, entry: NamedSession) -> None:
    if entry.session_id in engine.sessions:
        engine.close_session(entry.session_id)


def plan_turn(history: Sequence[int], prompt: Sequence[int]) -> tuple[int, list[int]]:
    """(history tokens to drop, prompt tokens to run): the common prefix is kept, and at
    least the last prompt token runs."""
    keep = common_prefix_len(history, prompt, len(prompt) - 1)
    return len(history) - keep, list(prompt[keep:])


def session_turn(engine: Engine, session_id: int, messages: Messages,
                 options: GenerateOptions, tools: Tools = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> GenerateRequest:
    """Rewind the session to what it shares with ``messages``; the request for the rest."""
    chat = GenerateRequest(messages=messages, options=options, tools=tools,
                           chat_template_kwargs=template_kwargs)
    prompt = engine.encode_request(chat)
    session = engine.sessions.get(session_id)
    drop, new = plan_turn(session.tokens, prompt)
    if drop and engine.reuse.shifter is not None:
        # the KV past the common prefix stays aside for this turn: runs of it the prompt
        # holds at other positions (older messages left out) are shifted, not recomputed
        engine.sessions.set_aside(session, len(session.tokens) - drop)
    elif drop:
        engine.rewind_session(session_id, drop)
    if options.eos_token_ids is None:
        # token ids alone stop at EOS only: keep the chat request's end-of-turn stops
        options = replace(options, eos_token_ids=engine.stop_ids(chat))
    return GenerateRequest(token_ids=tuple(new), options=options,
                           thoughts=thought_mode(engine.tokenizer, prompt) or "off")


def session_job(engine_of: Callable[[], Engine], registry: SessionRegistry, name: str,
                messages: Messages, options: GenerateOptions, *,
                on_final: Callable[[Final], None] | None = None,
                priority: Priority = "normal", tools: Tools = None,
                template_kwargs: Mapping[str, Any] | None = None,
                ) -> Callable[[threading.Event], Iterator[Chunk | Final]]:
    """A worker job running one chat turn in the session ``name``."""

    def job(cancel: threading.Event) -> Iterator[Chunk | Final]:
        engine = engine_of()
        entry = registry.acquire(engine, name)
        try:
            request = session_turn(engine, entry.session_id, messages, options, tools,
                                   template_kwargs)
            for item in run_generation(engine, request, cancel, priority=priority,
                                       session_id=entry.session_id):
                if isinstance(item, Final) and on_final is not None:
                    on_final(item)
                yield item
        finally:
            registry.release(engine, entry)

    return job


async def sweep_forever(worker: EngineWorker, models: ModelManager, registry: SessionRegistry,
                        every_s: float = 60.0) -> None:
    """Close idle sessions now and then (the app runs this while it serves)."""

    def sweep() -> int:
        current = models.current
        return registry.sweep(current.engine) if current is not None else 0

    while True:
        await asyncio.sleep(every_s)
        try:
            await worker.call(sweep)
        except WorkerStoppedError:
            return
        except Exception:  # never let housekeeping end the server
            log.exception("closing idle sessions failed")


def close_named(models: ModelManager, registry: SessionRegistry, name: str) -> bool:
    """Engine thread: close ``name`` on the served engine."""
    current = models.current
    return current is not None and registry.close(current.engine, name)
