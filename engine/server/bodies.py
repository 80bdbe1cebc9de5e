"""Request bodies are JSON whatever their ``Content-Type`` says.

Ollama's documented examples (``curl http://localhost:11434/api/generate -d '{...}'``)
send no JSON content type: curl labels ``-d`` data ``application/x-www-form-urlencoded``,
and some clients send ``text/plain`` or nothing. Ollama and llama.cpp read such a body as
JSON anyway; FastAPI would not, so this middleware relabels it before routing. Every
route of the worker takes JSON. A browser page cannot exploit this to post "simple"
cross-origin requests: the guard refuses requests carrying an ``Origin`` that was not
allowed (engine/server/security.py).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

_RELABELLED = (b"", b"application/x-www-form-urlencoded", b"text/plain")


class JsonBodyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            kind = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
            if kind.split(b";")[0].strip().lower() in _RELABELLED:
                scope = {**scope, "headers": [*headers,
                                              (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
