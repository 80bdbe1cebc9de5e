"""HTTP errors: one exception type, the engine's errors mapped onto status codes, and the
error body each dialect's clients read.

- OpenAI routes (and the app's own): ``{"error": {"message", "type", "param", "code"}}``.
- llama.cpp routes: ``{"error": {"code": 400, "message": ..., "type": ...}}``.
- Ollama routes (``/api/...``): ``{"error": "message"}``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import (
    CancelledError,
    ConstraintError,
    ContextOverflowError,
    EngineError,
    InvalidOptionError,
    InvalidPromptError,
    ModelLoadError,
    ResourceLimitError,
    RuntimeSelectionError,
    TokenizerError,
    UnsupportedModelError,
)
from engine.server.worker import QueueFullError, WorkerStoppedError

log = logging.getLogger(__name__)

Dialect = Literal["openai", "llamacpp", "ollama"]
LLAMACPP_PATHS = ("/infill", "/completion", "/tokenize", "/detokenize", "/apply-template",
                  "/props", "/slots")

_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
          409: "conflict_error", 413: "invalid_request_error", 429: "rate_limit_error",
          501: "not_supported_error", 503: "unavailable_error"}


class ApiError(Exception):
    """An error with its HTTP status; ``param`` names the request field at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, hint: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.hint = hint
        self.retry_after_s = retry_after_s

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error" if self.status >= 500 else
                          "invalid_request_error")

    @property
    def full_message(self) -> str:
        return f"{self.message} (fix: {self.hint})" if self.hint else self.message


def from_exception(exc: BaseException, *, renames: Mapping[str, str] | None = None) -> ApiError:
    """The HTTP form of an engine or worker error; ``renames`` maps engine option names
    (``max_new_tokens``) to the field the client sent (``max_tokens``)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFullError):
        return ApiError(429, str(exc), code="server_busy", retry_after_s=exc.retry_after_s,
                        hint=f"retry in {exc.retry_after_s} s")
    if isinstance(exc, WorkerStoppedError):
        return ApiError(503, str(exc), code="shutting_down", retry_after_s=5)
    if not isinstance(exc, EngineError):
        return ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error")
    hint = exc.hint
    if isinstance(exc, InvalidOptionError):
        field = exc.field.split("[")[0]
        param = (renames or {}).get(field, field)
        message = exc.message
        if param != field:
            message = param + message[len(field):] if message.startswith(field) else message
        return ApiError(400, message, param=param, code="invalid_value", hint=hint)
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, exc.message, code="context_length_exceeded", hint=hint)
    if isinstance(exc, (InvalidPromptError, TokenizerError)):
        return ApiError(400, exc.message, code="invalid_prompt", hint=hint)
    if isinstance(exc, UnsupportedModelError):
        return ApiError(501, exc.message, code="not_supported", hint=hint)
    if isinstance(exc, (ModelLoadError, RuntimeSelectionError)):
        return ApiError(400, exc.message, code="model_load_failed", hint=hint)
    if isinstance(exc, ResourceLimitError):
        return ApiError(429, exc.message, code="resource_limit", hint=hint, retry_after_s=5)
    if isinstance(exc, CancelledError):
        return ApiError(409, exc.message, code="cancelled", hint=hint)
    if isinstance(exc, ConstraintError):  # a token forced past the grammar's mask
        return ApiError(422, exc.message, code="constraint_violated", hint=hint)
    # Other engine errors come from what the request asked for (e.g. a logit_bias that
    # masks every token): the request cannot be processed as given.
    return ApiError(422, exc.message, code="generation_failed", hint=hint)


def dialect_of(path: str) -> Dialect:
    if path.startswith("/api/"):
        return "ollama"
    if path in LLAMACPP_PATHS:
        return "llamacpp"
    return "openai"


def error_body(error: ApiError, dialect: Dialect) -> dict[str, Any]:
    if dialect == "ollama":
        return {"error": error.full_message}
    if dialect == "llamacpp":
        return {"error": {"code": error.status, "message": error.full_message,
                          "type": error.type}}
    body: dict[str, Any] = {"message": error.full_message, "type": error.type,
                            "param": error.param, "code": error.code}
    return {"error": body}


def error_response(error: ApiError, path: str) -> JSONResponse:
    headers = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    return CompactJSONResponse(error_body(error, dialect_of(path)), status_code=error.status,
                               headers=headers)


def _finite(value: Any) -> Any:
    """Replace non-finite floats (JSON has no -inf) by large finite ones, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return -9999.0 if value < 0 or math.isnan(value) else 9999.0
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(content: Any) -> str:
    """Compact JSON, no spaces after ':' or ',' (llama.vim matches ``"content"\\s*:"``)."""
    try:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(content), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))


class CompactJSONResponse(JSONResponse):
    """Every JSON body the worker sends: compact and always valid JSON."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


#: A union member's name in an error's location (``str``, ``list[ContentPart]``,
#: ``constrained-str``), not a field's.
_UNION_MEMBER = re.compile(r"str|int|float|bool|dict|list|none|.*[\[\-].*")


def _validation_error(exc: RequestValidationError) -> ApiError:
    errors = list(exc.errors())
    if not errors:
        return ApiError(400, "the request body is invalid")
    # a lone surrogate first: the other errors of a union are its other members' refusals
    first = next((e for e in errors if e.get("type") == "lone_surrogate"), errors[0])
    loc = [str(part) for part in first.get("loc", ()) if part != "body"
           and not _UNION_MEMBER.fullmatch(str(part))]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, "the request body is not valid JSON", code="invalid_json",
                        hint="send a JSON object with Content-Type: application/json")
    if param is None and kind in ("dict_type", "model_attributes_type", "missing"):
        return ApiError(400, "the request body must be a JSON object", code="invalid_json",
                        hint="send a JSON object with Content-Type: application/json")
    message = f"{param}: {first.get('msg', 'invalid')}" if param else str(first.get("msg"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return ApiError(400, message, param=param, code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    """Every error leaves in its dialect's shape; unexpected ones as 500, logged."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc, request.url.path)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(_validation_error(exc), request.url.path)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        error = ApiError(exc.status_code, str(exc.detail))
        response = error_response(error, request.url.path)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    async def on_engine_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(from_exception(exc), request.url.path)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path,
                      exc_info=exc)
        return error_response(from_exception(exc), request.url.path)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(EngineError, on_engine_error)
    app.add_exception_handler(QueueFullError, on_engine_error)
    app.add_exception_handler(WorkerStoppedError, on_engine_error)
    app.add_exception_handler(Exception, on_unexpected)
