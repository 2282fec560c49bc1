"""clag_fast: a fast adaptive memory store for SLM agents (CLAG, agent-driven clustering)."""

from clag_fast._clag_fast import __version__

__all__ = ["__version__"]
