"""Resources, limits and sessions: what the gauges and the memory slider of the app use.

- ``GET /v1/resources``: the Resource Governor's snapshot (limits, budget, per tier used /
  limit / headroom, other processes) and the engine's KV figures (page pool, prefix cache
  pages and hits, sessions, the tiered KV store). It is taken on the engine thread (KV is
  reported first), between two tokens; if that takes longer than a moment (a model is
  loading, a long prompt chunk runs) the governor's last reported figures are sent with
  ``"fresh": false``. Without a model ``governor`` and ``kv`` are null (``state`` says why).
  ``throughput``: the last answer's tokens/s and time to first token (``last``, null before
  one) and the running totals (``answers``, ``completion_tokens_total``).
- ``GET /v1/resources/stream``: the same as server-sent events, one every ``interval_s``
  (default 1 s) until the client leaves, or after ``max_events`` when given.
- ``PUT /v1/limits`` (admin): ``{"host_ram": "50%"}``, ``{"vram": "2GiB"}`` or ``{"disk":
  ...}``, one tier per request, any form ``parse_limit`` accepts. The change runs on the
  engine thread between two tokens; lowering a limit below what is held frees idle KV at
  once; running requests keep going. The answer is the engine's ``LimitOutcome``.
- ``POST /v1/kv/free`` (admin): closes every ``X-Session-Id`` chat session and drops the
  prefix cache's idle pages; the answer says how many and how many bytes were freed.
  Limits set with ``PUT /v1/limits`` are applied again to every model loaded later.
- ``DELETE /v1/sessions/{name}``: closes an ``X-Session-Id`` chat session.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.responses import StreamingResponse

from engine.engine import Engine
from engine.errors import InvalidOptionError, ResourceLimitError
from engine.memory.governor import GovernorSnapshot
from engine.memory.limits import ACCEPTED_FORMS, LIMIT_FLAGS, parse_limit
from engine.memory.trim import trim_heap
from engine.server.errors import ApiError, from_exception
from engine.server.schemas import LimitsRequest
from engine.server.sessions import SessionRegistry, close_named
from engine.server.streaming import SSE_HEADERS, Ctx, ServerContext, sse
from engine.server.worker import WorkerStoppedError

router = APIRouter(tags=["App"])

_TIER_OF_FLAG = {flag: tier for tier, flag in LIMIT_FLAGS.items()}
#: How long a snapshot may wait for the engine thread before the reported figures are used.
_FRESH_WAIT_S = 1.0
#: How often a paused stream looks whether the server is stopping (seconds).
_STOP_CHECK_S = 0.05


def kv_figures(engine: Engine, registry: SessionRegistry) -> dict[str, Any]:
    """The engine's KV: pool pages, prefix cache, sessions, the tiered store."""
    pool, cache, tiers = engine.pool, engine.prefix_cache, engine.kv_tiers
    return {
        "held_bytes": engine.kv_bytes(),
        "page_tokens": pool.page_size,
        "page_bytes": pool.geometry.page_bytes(pool.page_size),
        # the live KV's element type and bytes a token (16-bit where the engine's kernel
        # runs attention on the CPU, int16 or float16: engine.model.kv16_pass)
        "dtype": engine.spec.kv_pairs[0].dtype if engine.spec.kv_pairs else None,
        "bytes_per_token": engine.spec.kv_bytes_per_token,
        # a declared sliding window (engine.kv.window): a sequence's KV stops at its rows
        "window": None if engine.runner.window is None else engine.runner.window.as_dict(),
        "pool": {"pages": pool.allocated_pages, "max_pages": pool.max_pages,
                 "bytes": pool.nbytes},
        "prefix_cache": None if cache is None else {
            "pages": len(cache), "idle_pages": cache.idle_pages, "lookups": cache.lookups,
            "hits": cache.hits, "hit_tokens": cache.hit_tokens},
        "sessions": {"open": len(engine.sessions), "named": registry.count(engine),
                     "max_named": registry.max_sessions,
                     "idle_timeout_s": registry.idle_timeout_s},
        "store": None if tiers is None else dict(tiers.store.stats()),
    }


def _body(snapshot: GovernorSnapshot, engine: Engine, registry: SessionRegistry
          ) -> dict[str, Any]:
    return {"governor": snapshot.as_dict(), "kv": kv_figures(engine, registry)}


async def current_resources(ctx: ServerContext, wait_s: float = _FRESH_WAIT_S
                            ) -> dict[str, Any]:
    """The /v1/resources body (see the module docstring)."""
    model = ctx.models.current
    head = {"time": round(time.time(), 3), "state": ctx.models.state,
            "model": model.id if model is not None else None,
            "throughput": ctx.metrics.throughput()}
    if model is None:
        return {**head, "fresh": False, "governor": None, "kv": None}
    engine, registry = model.engine, ctx.sessions

    def fresh() -> dict[str, Any]:  # engine thread: report KV, then read
        return _body(engine.resource_snapshot(), engine, registry)

    try:
        body = await asyncio.wait_for(ctx.worker.call(fresh), wait_s)
        return {**head, "fresh": True, **body}
    except TimeoutError:
        def reported() -> dict[str, Any]:  # the governor is thread-safe
            return _body(engine.governor.snapshot(), engine, registry)

        return {**head, "fresh": False, **await asyncio.to_thread(reported)}


@router.get("/v1/resources")
async def resources(ctx: Ctx) -> dict[str, Any]:
    """The governor snapshot and the engine's KV figures."""
    return await current_resources(ctx)


async def _pause(ctx: ServerContext, seconds: float) -> None:
    """Sleep ``seconds``, or less once the server begins to stop."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not ctx.stopping.is_set() and (left := end - loop.time()) > 0:
        await asyncio.sleep(min(left, _STOP_CHECK_S))


@router.get("/v1/resources/stream", response_model=None)
async def resources_stream(
    ctx: Ctx,
    interval_s: Annotated[float, Query(ge=0.1, le=60.0)] = 1.0,
    max_events: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
) -> StreamingResponse:
    """``/v1/resources`` as server-sent events, one every ``interval_s`` seconds."""

    async def events() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        due, sent = loop.time(), 0
        while (max_events is None or sent < max_events) and not ctx.stopping.is_set():
            try:
                payload = await current_resources(ctx, min(interval_s, _FRESH_WAIT_S))
            except WorkerStoppedError:
                return  # shutting down
            yield sse(payload)
            sent += 1
            due = max(due + interval_s, loop.time())
            if max_events is None or sent < max_events:
                await _pause(ctx, due - loop.time())

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


def limit_text(value: str | int | float) -> str:
    """A limit value as text that parses back to the same limit (JSON numbers included:
    ``1e-05`` is written out, since scientific notation is refused in text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return str(int(value)) if value > 1 else format(Decimal(repr(value)), "f")
    return str(value)


@router.put("/v1/limits")
async def put_limits(body: LimitsRequest, ctx: Ctx) -> dict[str, Any]:
    """Change one memory limit now (admin token); the answer says what was freed."""
    given = {tier: value for tier, value in (("vram", body.vram), ("host_ram", body.host_ram),
                                             ("disk", body.disk)) if value is not None}
    if len(given) != 1:
        raise ApiError(400, f"send exactly one of vram, host_ram or disk, got {len(given)}",
                       code="invalid_value", hint=f'e.g. {{"host_ram": "50%"}}; a value is '
                       f"{ACCEPTED_FORMS}")
    tier, value = next(iter(given.items()))
    try:
        parse_limit(value, field=LIMIT_FLAGS[tier])
    except InvalidOptionError as exc:
        raise from_exception(exc, renames=_TIER_OF_FLAG) from exc
    engine = ctx.models.require(None).engine
    text = limit_text(value)
    try:
        outcome = await ctx.worker.call(lambda: engine.set_limit(tier, text))
    except ResourceLimitError as exc:  # runtime override is off
        raise ApiError(409, exc.message, param=tier, code="runtime_override_disabled",
                       hint=exc.hint) from exc
    ctx.models.limits[tier] = text  # applied again to the next model loaded
    return outcome.as_dict()


def free_kept(engine: Engine, registry: SessionRegistry) -> dict[str, Any]:
    """Engine thread: close every named chat session and drop the prefix cache's idle
    pages; what they held is freed (a chat's next turn recomputes its KV)."""
    before = engine.kv_bytes()
    closed = sum(registry.close(engine, name) for name in registry.names(engine))
    cache = engine.prefix_cache
    pages = cache.evict(cache.idle_pages) if cache is not None else 0
    gc.collect()
    trim_heap()  # the process's measured memory drops with it
    engine.resource_snapshot()  # the governor hears of it now
    return {"object": "kv.freed", "sessions_closed": closed, "pages_evicted": pages,
            "bytes_freed": max(0, before - engine.kv_bytes()),
            "kv_bytes": engine.kv_bytes()}


@router.post("/v1/kv/free")
async def free_kv(ctx: Ctx) -> dict[str, Any]:
    """Free what kept chats and the prefix cache hold (admin token); answers in progress
    keep their KV."""
    engine = ctx.models.require(None).engine
    return await ctx.worker.call(lambda: free_kept(engine, ctx.sessions))


@router.delete("/v1/sessions/{name:path}")
async def delete_session(name: str, ctx: Ctx) -> dict[str, Any]:
    """Close an ``X-Session-Id`` chat session (its KV is freed)."""
    name = name.strip()
    closed = ctx.models.current is not None and await ctx.worker.call(
        lambda: close_named(ctx.models, ctx.sessions, name))
    if not closed:
        raise ApiError(404, f"no open session {name!r}", param="name",
                       code="session_not_found", hint="sessions close after "
                       f"{ctx.sessions.idle_timeout_s:g} s without a turn and when the model "
                       "changes")
    return {"deleted": name, "object": "session.deleted"}
