"""The app's own routes: /health, /metrics, and the admin routes (admin token required):
GET /v1/library, PUT /v1/library/roots, POST /v1/models/load, POST /v1/models/unload.

Resources, limits and sessions are in engine/server/resources.py.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from engine.server.errors import ApiError, CompactJSONResponse
from engine.server.metrics import EngineGauges
from engine.server.openai import model_card
from engine.server.schemas import LibraryRootsRequest, LoadModelRequest, UnloadModelRequest
from engine.server.streaming import Ctx

router = APIRouter(tags=["App"])


@router.get("/health", response_model=None)
async def health(ctx: Ctx) -> Response:
    """200 while a model is ready; 503 (same body) while loading or with no model."""
    models, worker = ctx.models, ctx.worker
    current = models.current
    body = {"status": "ok" if models.state == "ready" else models.state,
            "state": models.state, "model": current.id if current else None,
            "loading": models.loading, "busy": not worker.idle, "waiting": worker.waiting,
            "pid": os.getpid()}
    return CompactJSONResponse(body, status_code=200 if models.state == "ready" else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(ctx: Ctx) -> PlainTextResponse:
    current = ctx.models.current
    gauges = None
    if current is not None:  # the governor's last figures: no wait for the engine thread
        named = ctx.sessions.count(current.engine)
        gauges = await asyncio.to_thread(EngineGauges.read, current.engine, named)
    text = ctx.metrics.render(waiting=ctx.worker.waiting, busy=not ctx.worker.idle,
                              model_loaded=current is not None, engine=gauges)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/library")
async def library(ctx: Ctx) -> dict[str, Any]:
    models = ctx.models
    current = models.current
    entries = [{"name": e.name, "path": str(e.path), "format": e.format, "family": e.family,
                "size_bytes": e.size_bytes,
                "loaded": current is not None and current.path == e.path.resolve()}
               for e in models.library()]
    return {"roots": [str(r) for r in models.roots], "models": entries,
            "loaded": current.id if current else None, "state": models.state}


@router.put("/v1/library/roots")
async def set_library_roots(body: LibraryRootsRequest, ctx: Ctx) -> dict[str, Any]:
    """Replace the folders models may be loaded from (the app's library roots). Folders
    that do not exist now (an unplugged drive) are kept: they list nothing until they
    return."""
    ctx.models.set_roots(body.roots)
    return await library(ctx)


@router.post("/v1/models/load")
async def load_model(body: LoadModelRequest, ctx: Ctx
                     ) -> dict[str, Any]:
    """Load a model from the library (the current one is unloaded first), with
    ``context_length`` tokens of context at most when given."""
    model = await ctx.models.load(body.model, body.context_length)
    return {**model_card(model), "state": ctx.models.state, "path": str(model.path)}


@router.post("/v1/models/unload")
async def unload_model(body: UnloadModelRequest, ctx: Ctx
                       ) -> dict[str, Any]:
    current = ctx.models.current
    if body.model and (current is None or not current.matches(body.model)):
        raise ApiError(404, f"the model {body.model!r} is not loaded", param="model",
                       code="model_not_found")
    unloaded = await ctx.models.unload()
    return {"unloaded": unloaded, "state": ctx.models.state}
