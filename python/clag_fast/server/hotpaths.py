"""The two requests an agent backend sends most, ``POST /v1/search`` and ``POST /v1/memories``,
answered without FastAPI's per-request machinery.

FastAPI stays the API's definition: its routes, models and OpenAPI document are unchanged, and
every other request goes through it. For these two, ``HotPaths`` (an ASGI layer in front of
it) reads the body, parses and validates it exactly as FastAPI does (``json.loads``, then the
same pydantic model, errors located under "body"), and calls the same handlers
(``routes.handle_add``, ``routes.handle_search``) with the same principal and limits. What it
skips is the generic part, measured at about a third of the event loop's time per request under
the bench load: a scan of every route's pattern, the dependency solver (per request: signature
introspection, a scope copy per middleware layer), and a re-validation of the response model
before it is serialised. The answer is the response model serialised by pydantic-core, errors
are the same ``{"error": {code, message}}`` bodies (``http_errors.error_answer``).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from pydantic import TypeAdapter, ValidationError

from clag_fast.server import routes
from clag_fast.server.http_errors import error_answer, error_response, problem, validation_problem
from clag_fast.server.models import NewMemories, NewMemory, SearchRequest

try:  # optional: not a dependency of the server extra
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_loads = None

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]


class HotPaths:
    """ASGI: answers POST /v1/search and POST /v1/memories itself, passes everything else to
    ``app`` (the FastAPI application, whose ``state`` holds the service and the key ring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # The same validators FastAPI builds for these bodies (the body as one parameter).
        self._routes: dict[str, tuple[TypeAdapter, Callable[..., Awaitable[Any]]]] = {
            "/v1/memories": (TypeAdapter(NewMemory | NewMemories), routes.handle_add),
            "/v1/search": (TypeAdapter(SearchRequest), routes.handle_search),
        }

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root):]
            route = self._routes.get(path)
            if route is not None:
                await self._answer(scope, receive, send, *route)
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: dict, receive: Receive, send: Send, adapter: TypeAdapter,
                      handler: Callable[..., Awaitable[Any]]) -> None:
        try:
            body = await _read_body(receive)
            state = self.app.state
            svc = state.service
            # FastAPI's order: the JSON is read first, then the dependencies (the key), then
            # the body is validated.
            value = _load(body)
            who = routes.principal_of(state.keyring, _Headers(scope["headers"]))
            value = _validate(value, adapter)
            result = await handler(value, svc, who, svc.config.limits)
            payload = result.__pydantic_serializer__.to_json(result)
        except _Disconnected:
            return
        except Exception as e:  # every failure is an error answer, as FastAPI's handlers give
            await error_response(*error_answer(e, f"POST {scope['path']}"))(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": _JSON + [(b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


class _Disconnected(Exception):
    """The client went away before its body arrived: nothing to answer."""


class _Headers:
    """Header lookup by lower-case name over the ASGI list (the first value, as Starlette's
    ``Headers.get``), without building a dict per request."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw

    def get(self, name: str, default: Any = None) -> Any:
        key = name.encode("latin-1")
        for k, v in self._raw:
            if k.lower() == key:
                return v.decode("latin-1")
        return default


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


_MISSING = object()


def _load(body: bytes) -> Any:
    """The body's JSON as FastAPI reads it (``json.loads``; the same malformed-JSON answers);
    ``_MISSING`` for an empty body.

    orjson, where installed, parses first: a 384-float vector in a fifth of ``json.loads``'
    time. It accepts a subset of what ``json.loads`` accepts (no NaN literals, no integers
    beyond 64 bits) and gives the same values for it, so anything it refuses is parsed again
    by ``json.loads``, which decides the answer as it does behind FastAPI."""
    if not body:
        return _MISSING
    if _orjson_loads is not None:
        try:
            return _orjson_loads(body)
        except Exception:  # noqa: BLE001 - json.loads below gives the answer FastAPI would
            pass
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise validation_problem([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                   "input": {}, "ctx": {"error": e.msg}}]) from None
    except Exception:  # too deep (RecursionError), not UTF-8: FastAPI's generic answer
        raise problem(400, "malformed_json", "There was an error parsing the body") from None


def _validate(value: Any, adapter: TypeAdapter) -> Any:
    """The body's model, validated as FastAPI validates a body parameter (errors under "body")."""
    if value is _MISSING:
        raise validation_problem([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return adapter.validate_python(value, from_attributes=True)
    except ValidationError as e:
        errors = [dict(err, loc=("body", *err["loc"])) for err in e.errors(include_url=False)]
        raise validation_problem(errors) from None
