"""``http_protocol``: an answer's head and body leave in one write, and nothing is held back
longer than the event loop's current turn (a head whose body comes later, a close)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from clag_fast.server.http_protocol import HeadWithBody, protocol_class

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:  # as uvloop's transport does
            raise RuntimeError("unable to perform operation on a closed transport")
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return 0


def test_head_and_body_are_one_write():
    async def main():
        raw = FakeTransport()
        t = HeadWithBody(raw, asyncio.get_running_loop())
        t.write(HEAD)
        assert raw.writes == []
        t.write(b"{}")
        assert raw.writes == [HEAD + b"{}"]
        await asyncio.sleep(0)  # the scheduled flush finds nothing left
        assert raw.writes == [HEAD + b"{}"]
    asyncio.run(main())


def test_a_head_without_a_body_leaves_at_the_end_of_the_turn():
    async def main():
        raw = FakeTransport()
        t = HeadWithBody(raw, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await asyncio.sleep(0)
        assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        t.write(b"body, later")  # not a head: written at once
        assert raw.writes[-1] == b"body, later"
    asyncio.run(main())


def test_close_sends_a_held_head_first_and_other_calls_pass_through():
    async def main():
        raw = FakeTransport()
        t = HeadWithBody(raw, asyncio.get_running_loop())
        t.write(HEAD)
        t.close()
        assert raw.writes == [HEAD] and raw.closed and t.is_closing()
        assert t.get_extra_info("peername") == ("127.0.0.1", 1)
        assert t.get_write_buffer_size() == 0  # anything else: the transport's own
    asyncio.run(main())


def test_a_head_held_when_the_peer_goes_is_dropped_without_an_error():
    async def main():
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        raw = FakeTransport()
        t = HeadWithBody(raw, loop)
        t.write(HEAD)
        raw.closed = True  # the connection is lost within the turn
        await asyncio.sleep(0)  # the scheduled flush: no write, no error
        t.write(HEAD)
        t.close()  # uvicorn closing it (again): no error either
        assert raw.writes == [] and errors == []
    asyncio.run(main())


def _bases():
    from uvicorn.protocols.http.h11_impl import H11Protocol
    out = [H11Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        out.append(HttpToolsProtocol)
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("base", _bases(), ids=lambda b: b.__name__)
def test_real_server_answers_whole_and_streams_without_delay(base):
    """uvicorn with the protocol: keep-alive answers arrive whole; a streamed answer's head
    arrives while its body is still being waited for."""
    import uvicorn

    release = threading.Event()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            while not release.is_set():
                await asyncio.sleep(0.005)
            await send({"type": "http.response.body", "body": b"late", "more_body": False})
            return
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=protocol_class(base), lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        deadline = time.time() + 10
        while not server.started and time.time() < deadline:
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            got = b""
            for path in ("/a", "/bb", "/ccc"):
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                while not got.endswith(path.encode()):
                    chunk = c.recv(4096)
                    assert chunk, "connection closed"
                    got += chunk
            answers = got.split(b"HTTP/1.1 200 OK")[1:]
            assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b"/a", b"/bb", b"/ccc"]
            c.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = c.recv(4096)
                assert chunk, "connection closed"
                head += chunk
            assert head.startswith(b"HTTP/1.1 200 OK") and b"late" not in head
            release.set()
            rest = head
            while b"late" not in rest:
                rest += c.recv(4096)
    finally:
        release.set()
        server.should_exit = True
        th.join(timeout=10)
