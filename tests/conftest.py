"""Shared pytest fixtures. Keep this file small: fixtures live in helper modules and are
re-exported here so every test module sees them (and their dependencies, e.g. ``real_llm``
needs ``managed_server``)."""

from llm_fixtures import fake_server, managed_server, real_llm  # noqa: F401
