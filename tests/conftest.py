"""Shared pytest fixtures. Keep this file small: fixtures live in helper modules and are
re-exported here so every test module sees them (and their dependencies, e.g. ``real_llm``
needs ``managed_server``).

Markers: ``slow`` marks tests that take more than a few seconds, so ``pytest -m "not slow"``
is the fast loop; every ``slm`` test starts the real llama.cpp server and must be ``slow``
too (checked at collection)."""

import pytest

from llm_fixtures import fake_server, managed_server, real_llm  # noqa: F401


def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items
                if item.get_closest_marker("slm") and not item.get_closest_marker("slow")]
    if unmarked:
        raise pytest.UsageError("slm tests must also be marked slow: " + ", ".join(unmarked))
