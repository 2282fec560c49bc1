"""The service's settings, each defined once: ``ServeConfig(limits=Limits(...))``."""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from clag_fast._deprecated import renamed_fields
from clag_fast.config import valid_embed_cache


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; beyond these the service answers 4xx naming the limit.

    max_body_bytes: request body size (413 beyond; a 10 MB text never reaches the store).
    max_batch: memories in one add, queries in one batch search, ids in one get/delete.
    max_k: hits per query (a k of 10^9 is refused, not allocated).
    max_text_chars: characters of one memory text or query (MiniLM reads 256 tokens; longer
      texts are stored whole for BM25, so the limit is about memory, not the model).
    max_metadata_bytes: one memory's metadata as JSON.
    max_metadata_depth: nesting of metadata (objects in lists in objects...): deeper values
      could be stored but not written back out as JSON.
    max_list: memories in one listing page.
    max_pending: requests waiting in the add or search queue before the service answers 503.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_batch: int = 1000
    max_k: int = 1000
    max_text_chars: int = 32_768
    max_metadata_bytes: int = 16_384
    max_metadata_depth: int = 32
    max_list: int = 1000
    max_pending: int = 4096


@renamed_fields(llm="slm")
@dataclass(frozen=True)
class ServeConfig:
    """How ``clag-fast serve`` runs.

    store: the store directory (created when missing).
    host, port: where to listen. Without ``keys`` only a loopback host is accepted.
    keys: the keys file (TOML, see ``server.auth``); None = no authentication, loopback only.
    slm: the small language model that organises: "off" (vector-only organisation), "managed"
      (SmolLM2 when installed) or a server URL. ``llm`` is its deprecated spelling.
    embedder: False for bring-your-own-vector stores (text adds and queries are refused).
    dim: vector width when the store is created (an existing store keeps its own).
    fsync: sync vectors and the database on every write batch (power-loss safety; a process
      kill loses nothing answered either way).
    search_workers, add_workers: search and add batches run at once; of the batches that
      embed texts only one at a time (see ``batching``: two text batches side by side cost
      throughput, two vector batches gain it).
    search_batch: most queries coalesced into one ``search_many`` (adds: ``limits.max_batch``).
    embed_cache: vectors of recent texts the store keeps (``StoreConfig.embed_cache``; 0: none):
      a repeated query or label phrase is not embedded again.
    """

    store: Path
    host: str = "127.0.0.1"
    port: int = 8420
    keys: Path | None = None
    slm: str = "off"
    embedder: bool = True
    dim: int | None = None
    fsync: bool = False
    search_workers: int = 2
    add_workers: int = 2
    search_batch: int = 256
    embed_cache: int = 4096
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not valid_embed_cache(self.embed_cache):
            raise ValueError(f"embed_cache must be a non-negative number of vectors, got {self.embed_cache!r}")
        if self.keys is None and not is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host!r} without a keys file: anyone who can reach it could "
                f"read and delete every memory. Pass --keys KEYS.toml, or bind 127.0.0.1")

    def replace(self, **changes: object) -> "ServeConfig":
        return dataclasses.replace(self, **changes)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost" (names other than localhost count as public)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
