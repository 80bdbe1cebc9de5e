"""The worker's FastAPI app: routes of every dialect, middleware, lifespan.

Middleware, outermost first: request id and its log line (engine/server/worker_log.py)
-> request metrics -> body size limit -> JSON body label
(engine/server/bodies.py) -> guard (origin, host, API key, admin token) -> CORS (only with
--cors-origin) -> routes. The engine thread starts with the app and stops after the
server has finished (or cancelled) in-flight requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.server import admin, llamacpp, ollama, openai, pull, resources
from engine.server.bodies import JsonBodyMiddleware
from engine.server.config import ServerConfig
from engine.server.errors import CompactJSONResponse, install_handlers
from engine.server.metrics import Metrics
from engine.server.models import ModelManager
from engine.server.schemas import ErrorResponse
from engine.server.security import BodyLimitMiddleware, GuardMiddleware
from engine.server.sessions import SessionRegistry, sweep_forever
from engine.server.streaming import ServerContext
from engine.server.worker import EngineWorker
from engine.server.worker_log import RequestIdMiddleware

TITLE = "onnx-local-llm worker"
VERSION = "0.1.0"

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The request is invalid (field named)."},
    401: {"model": ErrorResponse, "description": "An API key or the admin token is needed."},
    403: {"model": ErrorResponse, "description": "Origin, host, token or path not allowed."},
    404: {"model": ErrorResponse, "description": "Unknown model."},
    409: {"model": ErrorResponse, "description": "Conflicts with the worker's state (a session "
          "still answering, runtime limit changes disabled)."},
    413: {"model": ErrorResponse, "description": "The body is over the size limit."},
    429: {"model": ErrorResponse, "description": "Busy; see Retry-After."},
    501: {"model": ErrorResponse, "description": "Not supported by this model or worker."},
    503: {"model": ErrorResponse, "description": "No model, or it is loading; see Retry-After."},
}


class RequestMetricsMiddleware:
    """Counts requests by matched route and status, and times them to the last byte."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_request(route, scope["method"], status,
                                         time.perf_counter() - started)


def build_context(config: ServerConfig) -> ServerContext:
    """The worker's state; loads ``config.model`` now (errors surface before listening)."""
    worker = EngineWorker(max_queue=config.max_queue, max_running=config.engine.max_batch)
    metrics = Metrics()
    worker.on_record = metrics.observe_job
    models = ModelManager(worker, config.models_dirs, config.engine, trusted=config.model,
                          presets=config.presets)
    if config.model is not None:
        models.load_now(config.model)
    sessions = SessionRegistry(idle_timeout_s=config.session_idle_s,
                               max_sessions=config.max_sessions)
    return ServerContext(config, worker, models, metrics, sessions)


def create_app(config: ServerConfig, ctx: ServerContext | None = None) -> FastAPI:
    ctx = ctx or build_context(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.worker.start()
        sweeper = asyncio.create_task(sweep_forever(
            ctx.worker, ctx.models, ctx.sessions, every_s=min(60.0, config.session_idle_s)))
        try:
            yield
        finally:
            sweeper.cancel()
            await asyncio.to_thread(ctx.worker.stop, config.graceful_shutdown_s)

    app = FastAPI(title=TITLE, version=VERSION, lifespan=lifespan, redoc_url=None,
                  default_response_class=CompactJSONResponse,
                  description="One local server for the desktop app and every editor: "
                  "OpenAI, llama.cpp and Ollama dialects over one engine thread.")
    app.state.ctx = ctx
    install_handlers(app)
    for router in (admin.router, resources.router, openai.router, llamacpp.router,
                   ollama.router, pull.router):
        app.include_router(router, responses=_ERRORS)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(GuardMiddleware, api_key=config.api_key, admin_token=config.admin_token,
                       cors_origins=config.cors_origins, loopback_only=config.loopback)
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware, metrics=ctx.metrics)
    app.add_middleware(RequestIdMiddleware)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=TITLE, version=VERSION, routes=app.routes,
                                 description=app.description)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)  # we answer 400
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
