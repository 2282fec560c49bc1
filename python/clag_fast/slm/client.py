"""OpenAI-compatible chat client with JSON-schema-constrained output.

Standard library only (``http.client``), so the product has no HTTP dependency and no proxy
surprises: ``urllib`` honours ``http_proxy`` variables, which would route loopback calls to a
proxy on some machines.

Works against llama.cpp's ``llama-server``, llama-cpp-python's server, ollama and vLLM. The
servers disagree on how a JSON schema is passed, so the client detects it once per client:

1. ``{"type": "json_schema", "json_schema": {"name", "schema"}}`` (OpenAI, llama-server, vLLM);
2. ``{"type": "json_object", "schema": S}`` (llama-cpp-python 0.3.x answers HTTP 500 to 1.);
3. no ``response_format`` at all: the prompt alone asks for JSON.

A detected mode whose server refuses one particular schema with HTTP 400/422 (a strict server
and a keyword it lacks, such as routing's ``prefixItems``) sends that call down the list; the
mode stays remembered for the other schemas.

Whatever the server does, the reply goes through a tolerant parser (think blocks, code fences,
prose around the object, raw newlines in strings) and a validator for the schema subset we use.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from clag_fast.errors import (  # noqa: F401 -- re-exported: callers catch them from here too
    LLMError, LLMHTTPError, LLMInvalidOutput, LLMTimeout, LLMUnreachable, SchemaError,
)

log = logging.getLogger(__name__)

__all__ = [
    "LLMClient",
    "LLMStats",
    "LLMError",
    "LLMUnreachable",
    "LLMTimeout",
    "LLMHTTPError",
    "LLMInvalidOutput",
    "SchemaError",
    "parse_json_object",
    "validate",
]

# Order in which schema-passing modes are tried by "auto" detection.
SCHEMA_MODES = ("json_schema", "json_object", "none")


def is_transient(e: BaseException) -> bool:
    """True for failures that may pass if the same request is sent again later: the server
    unreachable or too slow, HTTP 408 / 429 / 5xx. Not: 4xx, invalid output, other errors."""
    if isinstance(e, (LLMUnreachable, LLMTimeout)):
        return True
    return isinstance(e, LLMHTTPError) and (e.status in (408, 429) or e.status >= 500)


# --------------------------------------------------------------------------- parsing

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def _balanced_object(text: str, start: int) -> str | None:
    """The JSON object starting at ``text[start] == '{'``, or None when it never closes.

    String-aware so braces inside strings do not count.
    """
    depth = 0
    in_str = False
    esc = False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def parse_json_object(text: str) -> dict:
    """Extract the first JSON object from a model's reply.

    Tolerates ``<think>...</think>`` blocks, Markdown code fences, prose before and after the
    object, and raw control characters (newlines, tabs) inside strings. Raises
    :class:`LLMInvalidOutput` when there is no complete object (e.g. a reply cut by
    ``max_tokens``).
    """
    if not isinstance(text, str):
        raise LLMInvalidOutput(f"reply content is {type(text).__name__}, not text", repr(text))
    cleaned = _THINK_RE.sub("", text)
    # An unterminated think block (reply cut while thinking) holds no answer.
    lower = cleaned.lower()
    if "<think>" in lower:
        cleaned = cleaned[: lower.index("<think>")]
    truncated = False
    pos = cleaned.find("{")
    while pos != -1:
        candidate = _balanced_object(cleaned, pos)
        if candidate is None:
            truncated = True
            break
        try:
            # strict=False accepts raw newlines/tabs inside strings, which small models emit.
            value = json.loads(candidate, strict=False)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
        pos = cleaned.find("{", pos + 1)
    why = "truncated JSON object" if truncated else "no JSON object"
    raise LLMInvalidOutput(f"{why} in reply: {text[:120]!r}", text)


# --------------------------------------------------------------------------- validation

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def validate(value: Any, schema: dict, path: str = "$") -> None:
    """Check ``value`` against the JSON-schema subset clag_fast's prompts use.

    Supported: ``type`` (object/array/string/integer/number/boolean/null, or a list of them),
    ``properties``, ``required``, ``additionalProperties: false``, ``items`` (a schema or
    false), ``prefixItems``, ``minItems``,
    ``maxItems``, ``enum``, ``minLength``, ``maxLength``, ``minimum``, ``maximum``. Raises
    :class:`SchemaError` naming the first offending path.
    """
    t = schema.get("type")
    if t is not None:
        types = [t] if isinstance(t, str) else list(t)
        ok = False
        for name in types:
            if name not in _TYPES:
                raise SchemaError(f"{path}: unsupported schema type {name!r}")
            py = _TYPES[name]
            # bool is a subclass of int in Python but not an integer in JSON.
            if isinstance(value, bool) and name in ("integer", "number"):
                continue
            if isinstance(value, py):
                ok = True
                break
        if not ok:
            raise SchemaError(f"{path}: expected {t}, got {type(value).__name__} {value!r:.60}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaError(f"{path}: {value!r:.60} is not one of {schema['enum']!r:.120}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise SchemaError(f"{path}: missing required key {key!r}")
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key in value:
                validate(value[key], sub, f"{path}.{key}")
        if schema.get("additionalProperties") is False:
            extra = set(value) - set(props)
            if extra:
                raise SchemaError(f"{path}: unexpected keys {sorted(extra)!r}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise SchemaError(f"{path}: {len(value)} items, fewer than {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise SchemaError(f"{path}: {len(value)} items, more than {schema['maxItems']}")
        prefix = schema.get("prefixItems", ())
        for i, sub in enumerate(prefix[: len(value)]):
            validate(value[i], sub, f"{path}[{i}]")
        rest = schema.get("items")
        if rest is False and len(value) > len(prefix):
            raise SchemaError(f"{path}: {len(value)} items, more than the {len(prefix)} allowed")
        if isinstance(rest, dict):
            for i in range(len(prefix), len(value)):
                validate(value[i], rest, f"{path}[{i}]")
    elif isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            raise SchemaError(f"{path}: string shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SchemaError(f"{path}: string longer than {schema['maxLength']}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaError(f"{path}: {value} below minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaError(f"{path}: {value} above maximum {schema['maximum']}")


# Keywords that make llama.cpp's grammar much slower to sample (measured: a `pattern` plus
# `maxLength` turned a 1.3 s call into 42 s with SmolLM2-135M) and that we check after
# parsing anyway; they are removed from the schema sent to the server.
_WIRE_DROP = ("pattern", "maxLength", "minLength", "minimum", "maximum")


def _wire_schema(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _wire_schema(v) for k, v in schema.items() if k not in _WIRE_DROP}
    if isinstance(schema, list):
        return [_wire_schema(v) for v in schema]
    return schema


# --------------------------------------------------------------------------- stats


@dataclass
class LLMStats:
    """Thread-safe counters of one client's traffic.

    ``calls`` counts :meth:`LLMClient.chat_json` / :meth:`LLMClient.chat` calls (one decision
    each, whatever the retries); ``requests`` counts HTTP requests; ``errors`` counts calls
    that raised. Tokens come from the server's ``usage`` block (0 when it sends none).
    """

    calls: int = 0
    requests: int = 0
    errors: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    max_latency_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def snapshot(self) -> dict:
        """A consistent copy of the counters as a plain dict."""
        with self._lock:
            return {
                "calls": self.calls,
                "requests": self.requests,
                "errors": self.errors,
                "retries": self.retries,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "latency_s": self.latency_s,
                "max_latency_s": self.max_latency_s,
            }

    def _add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def _call_done(self, latency: float, error: bool) -> None:
        with self._lock:
            self.calls += 1
            self.errors += int(error)
            self.latency_s += latency
            self.max_latency_s = max(self.max_latency_s, latency)


# --------------------------------------------------------------------------- client


class LLMClient:
    """Client of an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Args:
        base_url: ``http://host:port`` or ``http://host:port/v1`` (https works too).
        model: model name sent with each request; None asks the server's ``/v1/models`` once
            and uses the first id (llama.cpp servers ignore the name anyway).
        timeout: seconds per socket operation (connect, and each read while waiting).
        max_retries: extra attempts after an unreachable server, a timeout, HTTP 429 or 5xx.
        max_concurrency: requests in flight at once from this client (a semaphore); a 2-core
            llama.cpp server gains nothing from more.
        backoff: first retry delay in seconds, doubled per retry (capped at 8 s).
        temperature: sampling temperature; 0 keeps organisation decisions reproducible.
        schema_mode: "auto" (detect, see the module docstring), "json_schema", "json_object"
            or "none".
        api_key: sent as ``Authorization: Bearer`` when given.
        unreachable_cooldown: after a call failed because the server is unreachable, calls
            fail fast for this many seconds instead of retrying, so a dead server does not
            slow every ``add()`` down.

    Raises :class:`LLMError` subclasses only; never returns unvalidated output from
    :meth:`chat_json`.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        max_concurrency: int = 2,
        *,
        backoff: float = 0.5,
        temperature: float = 0.0,
        schema_mode: str = "auto",
        api_key: str | None = None,
        unreachable_cooldown: float = 5.0,
    ):
        if not isinstance(base_url, str) or not base_url:
            raise ValueError(f"base_url must be a non-empty URL string, got {base_url!r}")
        parsed = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if schema_mode != "auto" and schema_mode not in SCHEMA_MODES:
            raise ValueError(f"schema_mode must be 'auto' or one of {SCHEMA_MODES}, got {schema_mode!r}")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        prefix = parsed.path.rstrip("/")
        if not prefix.endswith("/v1"):
            prefix += "/v1"
        self._prefix = prefix
        self.base_url = f"{parsed.scheme}://{parsed.netloc}{prefix}"
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.max_concurrency = int(max_concurrency)
        self.backoff = float(backoff)
        self.temperature = float(temperature)
        self.api_key = api_key
        self.unreachable_cooldown = float(unreachable_cooldown)
        self.stats = LLMStats()
        self._sem = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        # The detected (or forced) way of passing a schema; None until the first success.
        self._schema_mode: str | None = None if schema_mode == "auto" else schema_mode
        self._detected = schema_mode == "auto"  # a mode the user fixed is never second-guessed
        self._down_until = 0.0

    def __repr__(self) -> str:
        return f"LLMClient({self.base_url!r}, model={self.model!r}, schema_mode={self._schema_mode!r})"

    @property
    def schema_mode(self) -> str | None:
        """How this server takes a schema ("json_schema" / "json_object" / "none"); None until
        the first successful schema call when detecting."""
        return self._schema_mode

    # ---------------------------------------------------------------- transport

    def _request(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        """One HTTP exchange, no retry. Returns the decoded JSON body."""
        conn_cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(self._host, self._port, timeout=timeout)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self.stats._add(requests=1)
        try:
            conn.request(method, self._prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (socket.timeout, TimeoutError) as e:
            raise LLMTimeout(f"{method} {self.base_url}{path}: no answer within {timeout:g} s") from e
        except (ConnectionRefusedError, socket.gaierror) as e:
            raise LLMUnreachable(f"{method} {self.base_url}{path}: {e}") from e
        except (http.client.HTTPException, ConnectionError, OSError) as e:
            # Reset / closed mid-answer (server crashed or killed): treat as unreachable.
            raise LLMUnreachable(f"{method} {self.base_url}{path}: {type(e).__name__}: {e}") from e
        finally:
            conn.close()
        text = raw.decode("utf-8", errors="replace")
        if not 200 <= resp.status < 300:
            raise LLMHTTPError(resp.status, text)
        try:
            out = json.loads(text)
        except json.JSONDecodeError as e:
            raise LLMInvalidOutput(f"server body is not JSON: {text[:120]!r}", text) from e
        if not isinstance(out, dict):
            raise LLMInvalidOutput(f"server body is not a JSON object: {text[:120]!r}", text)
        return out

    @staticmethod
    def _retryable(e: LLMError, retry_http: bool) -> bool:
        return is_transient(e) if retry_http else isinstance(e, (LLMUnreachable, LLMTimeout))

    def _with_retries(self, fn, *args, retry_http: bool = True):
        """Call ``fn(*args)`` with bounded retries and exponential backoff.

        ``retry_http=False`` while probing schema modes: a 500 there usually means "this
        server does not take that response_format", and retrying it only wastes seconds.
        """
        now = time.monotonic()
        if now < self._down_until:
            raise LLMUnreachable(
                f"{self.base_url} was unreachable {self.unreachable_cooldown:g} s ago; not retrying yet"
            )
        attempt = 0
        while True:
            try:
                return fn(*args)
            except LLMError as e:
                if attempt >= self.max_retries or not self._retryable(e, retry_http):
                    if isinstance(e, LLMUnreachable) and self.unreachable_cooldown > 0:
                        self._down_until = time.monotonic() + self.unreachable_cooldown
                    raise
                delay = min(8.0, self.backoff * (2**attempt))
                attempt += 1
                self.stats._add(retries=1)
                log.debug("SLM request failed (%s); retry %d in %.2f s", e, attempt, delay)
                time.sleep(delay)

    # ---------------------------------------------------------------- public calls

    def models(self) -> list[str]:
        """Model ids the server lists at ``/v1/models`` (with retries)."""
        out = self._with_retries(self._request, "GET", "/models", None, self.timeout)
        data = out.get("data")
        if not isinstance(data, list):
            raise LLMInvalidOutput(f"/v1/models has no 'data' list: {str(out)[:120]!r}")
        return [m["id"] for m in data if isinstance(m, dict) and "id" in m]

    def _model_name(self) -> str:
        if self.model is None:
            try:
                ids = self.models()
            except LLMError:
                # Not cached: the chat request that follows reports the real error, and the
                # next call asks again once the server is back.
                return "default"
            # llama.cpp servers serve one model and ignore the name; "default" is harmless.
            self.model = ids[0] if ids else "default"
        return self.model

    def _completion(
        self, messages: list[dict], max_tokens: int, response_format: dict | None, retry_http: bool = True
    ) -> tuple[str, dict]:
        body: dict[str, Any] = {
            "model": self._model_name(),
            "messages": messages,
            "max_tokens": int(max_tokens),
            "temperature": self.temperature,
        }
        if response_format is not None:
            body["response_format"] = response_format
        with self._sem:
            out = self._with_retries(
                self._request, "POST", "/chat/completions", body, self.timeout, retry_http=retry_http
            )
        try:
            content = out["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as e:
            raise LLMInvalidOutput(f"no choices[0].message.content in {str(out)[:120]!r}") from e
        usage = out.get("usage") or {}
        if isinstance(usage, dict):
            self.stats._add(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        if content is None:
            content = ""
        return content, out

    def chat(self, messages: list[dict], max_tokens: int = 256) -> str:
        """Plain chat completion; returns the reply text. Raises :class:`LLMError`."""
        _check_messages(messages)
        t0 = time.perf_counter()
        try:
            content, _ = self._completion(messages, max_tokens, None)
        except LLMError:
            self.stats._call_done(time.perf_counter() - t0, True)
            raise
        self.stats._call_done(time.perf_counter() - t0, False)
        return content

    def chat_json(self, messages: list[dict], schema: dict, max_tokens: int = 256) -> dict:
        """Chat completion constrained to ``schema``; returns the validated JSON object.

        Raises :class:`LLMUnreachable`, :class:`LLMTimeout`, :class:`LLMHTTPError` or
        :class:`LLMInvalidOutput` (the reply did not parse or did not match the schema).
        """
        _check_messages(messages)
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError("schema must be a JSON schema dict with type 'object'")
        t0 = time.perf_counter()
        try:
            value = self._chat_json(messages, schema, max_tokens)
        except LLMError:
            self.stats._call_done(time.perf_counter() - t0, True)
            raise
        self.stats._call_done(time.perf_counter() - t0, False)
        return value

    def _chat_json(self, messages: list[dict], schema: dict, max_tokens: int) -> dict:
        wire = _wire_schema(schema)
        mode = self._schema_mode
        if mode is None:
            content = self._detect(messages, wire, max_tokens)
        else:
            try:
                content, _ = self._completion(messages, max_tokens, _response_format(mode, wire))
            except LLMHTTPError as e:
                later = SCHEMA_MODES[SCHEMA_MODES.index(mode) + 1:]
                if e.status not in (400, 422) or not later or not self._detected:
                    raise
                # The server took this form before but refuses this schema (an OpenAI-strict
                # server and a keyword it does not support, e.g. prefixItems): this call
                # alone goes down the list; the remembered mode stays.
                log.debug("server refused this schema as %s (HTTP %d); trying %s for this call", mode, e.status, later)
                content = self._detect(messages, wire, max_tokens, modes=later, remember=False)
        value = parse_json_object(content)
        try:
            validate(value, schema)
        except SchemaError as e:
            raise LLMInvalidOutput(f"reply does not match the schema: {e}", content) from e
        return value

    def _detect(self, messages: list[dict], wire: dict, max_tokens: int,
                modes: tuple[str, ...] = SCHEMA_MODES, remember: bool = True) -> str:
        """Try each schema mode in turn; remember the first the server accepts.

        A server that rejects a response_format answers 4xx (OpenAI-strict servers) or 500
        (llama-cpp-python's pydantic validation error); both mean "try the next form". If the
        last form fails too the error is raised and nothing is remembered, so a server that
        was merely broken is probed again on the next call.
        """
        last: LLMHTTPError | None = None
        for mode in modes:
            probing = mode != modes[-1]
            try:
                content, _ = self._completion(
                    messages, max_tokens, _response_format(mode, wire), retry_http=not probing
                )
            except LLMHTTPError as e:
                if probing and e.status in (400, 404, 415, 422, 500, 501):
                    last = e
                    log.debug("server refused response_format %s (HTTP %d); trying the next", mode, e.status)
                    continue
                raise
            with self._lock:
                if remember and self._schema_mode is None:
                    self._schema_mode = mode
                    log.info("SLM server %s takes schemas as %r", self.base_url, mode)
            return content
        assert last is not None
        raise last


def _response_format(mode: str, schema: dict) -> dict | None:
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    return None


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with string 'role' and 'content', got {m!r:.80}")
