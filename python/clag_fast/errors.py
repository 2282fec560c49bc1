"""Every public exception of clag_fast, in one place (all exported from ``clag_fast``).

Each subclasses the built-in its callers would already catch: a malformed store is a
``ValueError``, missing model files an ``OSError``, a locked store a ``RuntimeError``. Errors
raised by the native core map onto built-ins in ``rust/py/errors.rs`` (ValueError for bad
shapes, dtypes and NaN; KeyError for unknown ids; OSError for I/O and corrupt files).
"""

from __future__ import annotations

__all__ = [
    "DimensionMismatchError",
    "FilterError",
    "LLMError",
    "LLMHTTPError",
    "LLMInvalidOutput",
    "LLMTimeout",
    "LLMUnreachable",
    "MalformedRecordError",
    "ModelFilesError",
    "SchemaError",
    "ServerUnavailable",
    "ServiceBusy",
    "ServiceError",
    "ServiceForbidden",
    "ServiceUnauthorized",
    "ShardUnavailable",
    "StoreFormatError",
    "StoreLockedError",
]


# -- the store ---------------------------------------------------------------------------
class StoreFormatError(ValueError):
    """The directory holds something that is not a clag_fast store we can open (another
    application's database, a newer schema, a database missing or emptied beside vectors)."""


class StoreLockedError(RuntimeError):
    """Another process has the store open for writing."""


class DimensionMismatchError(ValueError):
    """Vectors of the wrong width for a store, or a store reopened with another dimension or
    another embedder than it was created with; the message names both."""


class MalformedRecordError(ValueError):
    """A record of an import (a JSONL line, a Parquet row, an item of an importer) cannot be
    stored; the message names its position. Every record before it is imported, nothing from
    it on. ``position`` is that position ("line 12", "row 3"); ``imported``, the records this
    run imported before it."""

    def __init__(self, message: str, position: str = "", imported: int = 0) -> None:
        super().__init__(message)
        self.position = position
        self.imported = imported


class FilterError(ValueError):
    """A ``where=`` metadata filter is malformed: an unknown operator, a value of an
    unsupported type, an empty ``$and``/``$or``. The message names the offending part."""


# -- model files -------------------------------------------------------------------------
class ModelFilesError(OSError):
    """The model's source package is missing, has the wrong version, or fails its checksum."""


# -- the SLM -----------------------------------------------------------------------------
class LLMError(Exception):
    """Base class of every error raised by ``LLMClient``."""


class LLMUnreachable(LLMError):
    """The server refused the connection, or the host does not resolve."""


class LLMTimeout(LLMError):
    """The server did not answer within the client's timeout."""


class LLMHTTPError(LLMError):
    """The server answered with a non-2xx status."""

    def __init__(self, status: int, body: str):
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body[:200]}")


class LLMInvalidOutput(LLMError):
    """The server answered, but not with a JSON object matching the schema."""

    def __init__(self, message: str, text: str = ""):
        self.text = text
        super().__init__(message)


class SchemaError(ValueError):
    """A value does not match a JSON schema; the message names the path (``$.tags[2]``)."""


class ServerUnavailable(RuntimeError):
    """llama-cpp-python or the SmolLM2 model package is missing, or the server did not start."""


# -- the service (``clag-fast serve`` and its client) ---------------------------------------
class ServiceError(RuntimeError):
    """The memory service answered with an error that maps to no built-in exception (or the
    answer was not the service's JSON). ``status`` is the HTTP status, ``code`` the service's
    stable error code (``"internal"``, ``"conflict"``, ...)."""

    def __init__(self, status: int, code: str, message: str):
        self.status = status
        self.code = code
        super().__init__(f"{code} (HTTP {status}): {message}")


class ServiceBusy(ServiceError):
    """HTTP 503: the service's queues are full or it is shutting down; retry later."""


class ServiceUnauthorized(PermissionError):
    """HTTP 401: the API key is missing, unknown or expired."""


class ServiceForbidden(PermissionError):
    """HTTP 403: the API key may not read or write that namespace (or run that operation)."""


# -- the sharded store on Ray ---------------------------------------------------------------
class ShardUnavailable(RuntimeError):
    """A shard's owner actor is restarting or did not answer in time (HTTP 503 with
    Retry-After through the front door). A write that failed this way may or may not have been
    committed: retry it with a key to make the retry idempotent."""
