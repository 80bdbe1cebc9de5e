"""Ollama's ``POST /api/pull`` (an admin route: it writes into the library): a catalog
name or a Hub repository (``owner/name[:FILE]``) pulled into the worker's first
``--models-dir`` by :func:`engine.hub.pull.pull`, with Ollama's streamed status lines
(``pulling manifest``, ``pulling <digest>`` with ``total``/``completed``, ``verifying
sha256 digest``, ``writing manifest``, ``success``; an error as an ``{"error": ...}``
line). ``"stream": false`` answers once, at the end. The Hub is ``$HF_ENDPOINT`` of the
worker, else https://huggingface.co. A client that goes away cancels the download (a later
pull continues it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.server.errors import ApiError
from engine.server.schemas import OllamaPullRequest
from engine.server.streaming import Ctx, ndjson

router = APIRouter(tags=["Ollama"])
_DONE = object()


def _line(event: Any) -> dict[str, Any]:
    if event.total is not None:
        return {"status": f"pulling {(event.digest or '')[:12]}",
                "digest": f"sha256:{event.digest}" if event.digest else "",
                "total": event.total, "completed": event.completed or 0}
    status = event.status
    if status.startswith("verifying"):
        status = "verifying sha256 digest"
    return {"status": status}


@router.post("/api/pull", response_model=None)
async def pull(body: OllamaPullRequest, request: Request, ctx: Ctx) -> Response:
    from engine.hub.download import DownloadCancelled, DownloadError
    from engine.hub.pull import pull as run_pull

    name = (body.model or body.name).strip()
    if not name:
        raise ApiError(400, "model: a catalog name or owner/name[:FILE] is required",
                       param="model", hint='e.g. {"model": "qwen2.5-coder-0.5b"}')
    if not ctx.models.roots:
        raise ApiError(400, "this worker has no model folder to pull into",
                       hint="start it with --models-dir DIR")
    root = ctx.models.roots[0]
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()

    def report(event: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, _line(event))

    def work() -> None:
        try:
            result = run_pull(name, root, progress=report, cancelled=stop.is_set)
            loop.call_soon_threadsafe(queue.put_nowait, {"status": "success",
                                                         "model": result.folder.name,
                                                         "detail": result.summary})
        except DownloadCancelled:
            loop.call_soon_threadsafe(queue.put_nowait, {"error": "pull cancelled"})
        except DownloadError as exc:
            loop.call_soon_threadsafe(queue.put_nowait, {"error": exc.message})
        except Exception as exc:  # the stream must end with a line, whatever happened
            loop.call_soon_threadsafe(queue.put_nowait,
                                      {"error": f"pull failed: {type(exc).__name__}: {exc}"})
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    threading.Thread(target=work, name="api-pull", daemon=True).start()

    async def lines() -> AsyncIterator[dict[str, Any]]:
        try:
            while (item := await queue.get()) is not _DONE:
                if item.get("status") != "success" or "model" in item:
                    yield item
        finally:
            stop.set()

    if body.stream:
        async def stream() -> AsyncIterator[bytes]:
            async for item in lines():
                yield ndjson(item)
        return StreamingResponse(stream(), media_type="application/x-ndjson")
    last: dict[str, Any] = {}
    async for item in lines():
        last = item
    if "error" in last:
        raise ApiError(400, last["error"], param="model")
    return JSONResponse({"status": "success"})
