"""An OpenAI-compatible server as third-party servers are built: Starlette with
sse-starlette's ``EventSourceResponse`` at its default separator (CRLF line ends, comment
pings), the way llama-cpp-python's and other servers stream. None of this project's code:
run with any Python that has starlette and uvicorn (sse-starlette where installed, else
its framing written out by hand, byte for byte the same).

    python tests/app/thirdparty_standin.py PORT

Its answers are fixed text: chat streams ``ANSWER`` word by word; ``/v1/completions`` takes
``suffix`` the way llama-cpp-python does for a model without FIM tokens (appended to the
text, not used); ``/props``, ``/infill`` and ``/v1/resources`` do not exist (404).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

try:
    from sse_starlette.sse import EventSourceResponse
except ImportError:  # pragma: no cover - depends on the interpreter
    EventSourceResponse = None

MODEL = "standin-model"
ANSWER = "Hello from a server nobody here wrote."
COMPLETION = "radius ** 2 * math.pi"


async def models(_request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"id": MODEL, "object": "model", "owned_by": "me", "permissions": []}]})


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                         "finish_reason": finish}]}


async def chat(request: Request) -> Response:
    body = await request.json()
    if body.get("model") not in (MODEL, ""):
        return JSONResponse({"error": {"message": f"model {body.get('model')!r} not found",
                                       "type": "invalid_request_error"}}, status_code=404)
    words = ANSWER.split(" ")
    pieces = [_chunk({"role": "assistant"})] + [
        _chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
    pieces.append(_chunk({}, "stop"))

    async def events():
        for piece in pieces:
            await asyncio.sleep(0.01)
            yield {"data": json.dumps(piece)}
        yield {"data": "[DONE]"}

    if EventSourceResponse is not None:
        return EventSourceResponse(events(), ping=1)

    async def framed():  # sse-starlette's default framing: CRLF, a ping comment first
        yield b": ping - 2026-01-01 00:00:00.000000\r\n\r\n"
        async for event in events():
            yield f"data: {event['data']}\r\n\r\n".encode()

    return StreamingResponse(framed(), media_type="text/event-stream")


async def completions(request: Request) -> Response:
    body = await request.json()
    text = COMPLETION + (body.get("suffix") or "")  # llama-cpp-python without FIM tokens
    return JSONResponse({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                         "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 6,
                                   "total_tokens": 16}})


app = Starlette(routes=[Route("/v1/models", models),
                        Route("/v1/chat/completions", chat, methods=["POST"]),
                        Route("/v1/completions", completions, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
