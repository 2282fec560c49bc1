"""uvicorn's HTTP protocol, with each answer's head and body sent in one write.

uvicorn writes an answer's head (status line and headers) when the app sends
``http.response.start`` and its body at ``http.response.body``: two ``send`` system calls on
the event loop thread, with the GIL held, and on loopback two wake-ups of the client. The
service's answers are small (a search's hits, an add's ids), so both fit in one segment.
The protocol here hands uvicorn a transport that keeps a head back until the next write
(the body, which follows in the same turn of the loop) and sends them as one; a head no write
follows (an answer streamed later) goes out at the end of that turn, so nothing waits longer
than the loop's current round of callbacks.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeadWithBody:
    """A transport wrapper: a response head is written together with what follows it."""

    __slots__ = ("_transport", "_loop", "_head")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            # An answer's head (uvicorn writes it whole, then the body): keep it for the body.
            self._head = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            # The peer may have gone within the turn: uvloop raises on a write to a closed
            # transport (here a loop callback, or uvicorn's close()); the head has no reader.
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:  # the rest of the transport's interface, as it is
        return getattr(self._transport, name)


def protocol_class(base: type | None = None) -> type:
    """``base`` (default: the HTTP protocol uvicorn's ``http="auto"`` takes: httptools when
    installed, else h11) with its transport wrapped in ``HeadWithBody``."""
    if base is None:
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        except ImportError:  # httptools is optional (uvicorn[standard])
            from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class OneWriteProtocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(HeadWithBody(transport, self.loop))  # type: ignore[arg-type]

    OneWriteProtocol.__name__ = OneWriteProtocol.__qualname__ = f"OneWrite{base.__name__}"
    return OneWriteProtocol
