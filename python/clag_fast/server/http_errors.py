"""Every error answer of the service: ``{"error": {"code", "message"}}`` with a status.

One table maps the store's exceptions onto statuses (ValueError/TypeError 400, KeyError 404,
PermissionError 403, a busy queue or a missing embedding model 503); anything unexpected is logged with its traceback and
answered 500 "internal" without it. The client (``clag_fast.client``) maps the codes back.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from clag_fast.errors import ModelFilesError, ShardUnavailable

log = logging.getLogger(__name__)


class _Problem(Exception):
    """An error answer decided by a route (auth, limits, unknown ids)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def problem(status: int, code: str, message: str) -> _Problem:
    """The exception a route raises to answer ``status`` with ``code`` and ``message``."""
    return _Problem(status, code, message)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def store_error(e: BaseException) -> tuple[int, str, str]:
    """(status, code, message) for an exception raised by the store."""
    if isinstance(e, _Problem):
        return e.status, e.code, e.message
    if isinstance(e, ModelFilesError):  # the embedding model is missing: texts cannot be served
        return 503, "model_unavailable", str(e)
    if isinstance(e, ShardUnavailable):  # a sharded store's owner is restarting (clag_fast.distributed)
        return 503, "shard_unavailable", str(e)
    if isinstance(e, KeyError):
        return 404, "not_found", str(e.args[0]) if e.args else "not found"
    if isinstance(e, PermissionError):
        return 403, "forbidden", str(e)
    if isinstance(e, TypeError):
        return 400, "wrong_type", str(e)
    if isinstance(e, ValueError):
        return 400, "invalid", str(e)
    return 500, "internal", "internal error (logged by the service)"


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str]:
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return "malformed_json", f"the body is not valid JSON ({ctx.get('error', 'parse error')})"
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid_request", "; ".join(parts) + more


def validation_problem(errors: list[dict[str, Any]]) -> _Problem:
    """The 400 answer to a body that failed validation (pydantic's errors, locations under
    "body" as FastAPI reports them)."""
    code, message = _validation_message(errors)
    return _Problem(400, code, message)


def error_answer(e: BaseException, where: str) -> tuple[int, str, str, dict[str, str] | None]:
    """(status, code, message, headers) answering any exception a request raised; ``where``
    (method and path) names the request in the log of an unexpected error."""
    status, code, message = store_error(e)
    if status == 500:
        log.error("unexpected error answering %s", where, exc_info=e)
    headers = None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif code == "shard_unavailable":  # a restarting shard is back within seconds
        headers = {"Retry-After": "1"}
    return status, code, message, headers


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into an ErrorBody."""

    @app.exception_handler(_Problem)
    async def _on_problem(request: Request, e: _Problem) -> JSONResponse:
        return error_response(*error_answer(e, ""))

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, e: RequestValidationError) -> JSONResponse:
        p = validation_problem(list(e.errors()))
        return error_response(p.status, p.code, p.message)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        codes = {400: "malformed_json", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        return error_response(e.status_code, codes.get(e.status_code, "http_error"), str(e.detail))

    async def _on_store_error(request: Request, e: Exception) -> JSONResponse:
        return error_response(*error_answer(e, f"{request.method} {request.url.path}"))

    # The built-ins the store raises are answered by Starlette's exception middleware (which
    # does not re-raise); ``Exception`` goes to the outermost handler, which logs and answers 500.
    for cls in (KeyError, PermissionError, TypeError, ValueError, ModelFilesError, ShardUnavailable, Exception):
        app.add_exception_handler(cls, _on_store_error)


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` with 413 before they are read whole
    (a declared Content-Length is checked first; a chunked body is counted as it streams)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"the request body is larger than the service's limit of {self.max_bytes} bytes"
        if scope.get("method") in ("POST", "PATCH", "PUT"):
            # The API speaks JSON only: read every body as JSON whatever its declared type
            # (`curl -d` sends form encoding), so a wrong body is a clear "malformed JSON".
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
            scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await _send_json(send, 413, "too_large", message)
                    return
        seen = 0
        answered = False

        async def counted_receive() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    # A _Problem, so the app's own handler answers it (inside the route).
                    raise _BodyTooLarge(413, "too_large", message)
            return msg

        async def tracking_send(msg: dict) -> None:
            nonlocal answered
            if msg["type"] == "http.response.start":
                answered = True
            await send(msg)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except _BodyTooLarge:
            if not answered:
                await _send_json(send, 413, "too_large", message)


class _BodyTooLarge(_Problem):
    pass


async def _send_json(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
