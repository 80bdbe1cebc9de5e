"""The asyncio side of a generation: submit (engine/server/jobs.py: the hand-off to the
engine thread), wait for the first item, collect or stream, cancel when the client leaves;
SSE and NDJSON framing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.engine import GenerateRequest
from engine.server.config import ServerConfig
from engine.server.errors import ApiError, dumps, from_exception
from engine.server.generation import Chunk, Final, Limits
from engine.server.jobs import Item as Item
from engine.server.jobs import submit_generation
from engine.server.metrics import Metrics
from engine.server.models import LoadedModel, ModelManager
from engine.server.sessions import SessionRegistry
from engine.server.worker import EngineWorker, JobHandle, Priority

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    return b"data: " + dumps(payload).encode("utf-8") + b"\n\n"


def ndjson(payload: Any) -> bytes:
    return dumps(payload).encode("utf-8") + b"\n"


@dataclass
class ServerContext:
    """Everything a route needs; one per app (``app.state.ctx``)."""

    config: ServerConfig
    worker: EngineWorker
    models: ModelManager
    metrics: Metrics
    sessions: SessionRegistry = field(default_factory=SessionRegistry)
    #: set once the server begins to stop: endless streams (resources) end then, so that
    #: they do not hold a graceful stop until its deadline
    stopping: threading.Event = field(default_factory=threading.Event)

    def submit(self, model: LoadedModel, request: GenerateRequest, *,
               limits: Limits = Limits(),  # noqa: B008
               priority: Priority = "normal", session: str | None = None) -> JobHandle[Item]:
        """Queue a generation on the engine thread: see engine/server/jobs.py (what a
        job is, who runs it, how its events come back)."""
        return submit_generation(self.worker, self.models, self.sessions, self.metrics,
                                 model, request, limits=limits, priority=priority,
                                 session=session)


def get_context(request: Request) -> ServerContext:
    """FastAPI dependency: the app's ServerContext."""
    ctx = request.app.state.ctx
    assert isinstance(ctx, ServerContext)
    return ctx


#: A route parameter that receives the app's ServerContext.
Ctx = Annotated[ServerContext, Depends(get_context)]


@asynccontextmanager
async def cancel_on_disconnect(request: Request, handles: Sequence[JobHandle[Any]]
                               ) -> AsyncIterator[None]:
    """While inside, a client that closes its connection cancels ``handles``."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                for handle in handles:
                    handle.cancel()
                return

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task


async def first_item(handle: JobHandle[Item], request: Request,
                     renames: Mapping[str, str] | None = None) -> Item:
    """The job's first item (so errors before any token still become HTTP errors)."""
    async with cancel_on_disconnect(request, [handle]):
        try:
            return await anext(handle)
        except StopAsyncIteration:
            raise ApiError(503, "the request was cancelled before it ran",
                           code="cancelled", retry_after_s=1) from None
        except Exception as exc:
            raise from_exception(exc, renames=renames) from exc


async def collect(handle: JobHandle[Item], request: Request, first: Item | None = None,
                  renames: Mapping[str, str] | None = None) -> tuple[list[Chunk], Final]:
    """All of a job's chunks and its final item; the client leaving cancels it."""
    items: list[Item] = [] if first is None else [first]
    async with cancel_on_disconnect(request, [handle]):
        try:
            if not items or not isinstance(items[-1], Final):
                async for item in handle:
                    items.append(item)
        except Exception as exc:
            raise from_exception(exc, renames=renames) from exc
    final = items[-1]
    if not isinstance(final, Final):
        raise ApiError(503, "the request was cancelled", code="cancelled", retry_after_s=1)
    return [i for i in items if isinstance(i, Chunk)], final


async def items_after(first: Item, handle: JobHandle[Item]) -> AsyncIterator[Item]:
    """``first`` and the rest of the job's items; errors arrive as ApiError."""
    yield first
    if isinstance(first, Final):
        return
    try:
        async for item in handle:
            yield item
    except Exception as exc:
        raise from_exception(exc) from exc


class JobStreamingResponse(StreamingResponse):
    """A streaming response that cancels its jobs when it ends for any reason: done,
    client gone (Starlette cancels the body iterator), or shutdown."""

    def __init__(self, content: AsyncIterator[bytes], handles: Sequence[JobHandle[Any]],
                 media_type: str) -> None:
        super().__init__(content, media_type=media_type, headers=SSE_HEADERS)
        self._handles = list(handles)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for handle in self._handles:
                handle.cancel()
