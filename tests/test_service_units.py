"""Pieces of the service that need no server: the keys file, the loopback rule, batching."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from clag_fast.server.auth import LOCAL, KeyRing
from clag_fast.server.batching import Coalescer
from clag_fast.server.settings import ServeConfig, is_loopback


def ring(tmp_path, text):
    p = tmp_path / "keys.toml"
    p.write_text(text)
    return KeyRing.load(p)


def test_keys_patterns_rights_and_expiry(tmp_path):
    r = ring(tmp_path, """
[[keys]]
name = "team"
key = "k-team-0123456789abc"
read = ["shared"]
write = ["team/*"]

[[keys]]
key_sha256 = "%s"
read = ["*"]
expires = 2030-01-01
""" % hashlib.sha256(b"k-reader-0123456789").hexdigest())
    team = r.lookup("k-team-0123456789abc")
    assert team.name == "team" and not team.unrestricted
    assert team.can_read("shared") and team.can_read("team/x") and not team.can_read("team")
    assert team.can_write("team/x") and not team.can_write("shared") and not team.can_read("other")
    assert team.default_namespace == "shared"
    reader = r.lookup("k-reader-0123456789")
    assert reader.unrestricted and not reader.can_write("anything") and not reader.admin
    later = dt.datetime(2031, 1, 1, tzinfo=dt.timezone.utc)
    assert "expired" in r.lookup("k-reader-0123456789", now=later)
    assert r.lookup(None).startswith("missing API key")
    assert r.lookup("k-team-0123456789abX") == "unknown API key"
    assert LOCAL.admin and LOCAL.can_write("any")


@pytest.mark.parametrize("text, fragment", [
    ("not toml [", "not valid TOML"),
    ("x = 1", "expected one or more [[keys]]"),
    ('[[keys]]\nkey = "short"\nread = ["a"]', "at least 16 characters"),
    ('[[keys]]\nkey = "k-0123456789abcdef"\nkey_sha256 = "00"\nread = ["a"]', "exactly one of key / key_sha256"),
    ('[[keys]]\nkey_sha256 = "zz"\nread = ["a"]', "64 hex digits"),
    ('[[keys]]\nkey = "k-0123456789abcdef"', "may read nothing"),
    ('[[keys]]\nkey = "k-0123456789abcdef"\nread = "a"\nrights = 1', "unknown field"),
    ('[[keys]]\nkey = "k-0123456789abcdef"\nread = ["a"]\ndefault_namespace = "b"', "default_namespace"),
    ('[[keys]]\nkey = "k-0123456789abcdef"\nread = ["a"]\n[[keys]]\nkey = "k-0123456789abcdef"\nread = ["b"]',
     "listed twice"),
])
def test_bad_keys_files_are_refused_naming_the_problem(tmp_path, text, fragment):
    with pytest.raises(ValueError, match="keys") as e:
        ring(tmp_path, text)
    assert fragment in str(e.value)


def test_only_loopback_without_keys(tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.1.2.3")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("example.org")
    with pytest.raises(ValueError, match="without a keys file"):
        ServeConfig(store=tmp_path, host="0.0.0.0")
    assert ServeConfig(store=tmp_path, host="0.0.0.0", keys=tmp_path / "k.toml").host == "0.0.0.0"


def test_coalescer_batches_concurrent_jobs_and_isolates_failures():
    calls = []
    gate = threading.Event()

    def run(group, payloads):
        gate.wait(5)
        calls.append((group, list(payloads)))
        return [ValueError(f"bad {p}") if p == "bad" else p.upper() for p in payloads]

    async def main():
        with ThreadPoolExecutor(2) as pool:
            c = Coalescer("test", run, pool, max_items=100, max_pending=1000)
            c.start()
            first = asyncio.create_task(c.submit("g", "first"))
            await asyncio.sleep(0.05)  # the first batch is running (blocked on the gate)
            rest = [asyncio.create_task(c.submit("g", p)) for p in ("a", "b", "bad", "c")]
            other = asyncio.create_task(c.submit("h", "z"))
            await asyncio.sleep(0.05)
            gate.set()
            results = await asyncio.gather(first, *rest, other, return_exceptions=True)
            await c.close()
            return results

    results = asyncio.run(main())
    assert results[:3] == ["FIRST", "A", "B"] and isinstance(results[3], ValueError) and results[4:] == ["C", "Z"]
    assert calls[0] == ("g", ["first"])
    assert calls[1] == ("g", ["a", "b", "bad", "c"])  # queued together -> one batch
    assert calls[2] == ("h", ["z"])                   # another group -> its own batch


def test_coalescer_runs_solo_groups_one_batch_at_a_time():
    """Batches of ``solo`` groups (text batches in the service: they embed) never overlap, not
    even two different solo groups; other groups' batches run side by side up to ``workers``,
    also beside a solo batch."""
    lock = threading.Lock()
    active = {"t": 0, "v": 0}
    most = {"t": 0, "v": 0}
    seen = []  # (solo batches running, vector batches running) at each batch's start

    def run(group, payloads):
        kind = group[0]
        with lock:
            active[kind] += 1
            most[kind] = max(most[kind], active[kind])
            seen.append((active["t"], active["v"]))
        threading.Event().wait(0.2)
        with lock:
            active[kind] -= 1
        return [p * 2 for p in payloads]

    async def main():
        with ThreadPoolExecutor(4) as pool:
            c = Coalescer("test", run, pool, max_items=100, max_pending=1000, workers=2,
                          solo=lambda group: group.startswith("t"))
            c.start()
            jobs = []
            # v3 and v4 take both workers; ta and tb queue; ta starts when v3 ends, tb waits
            # for ta although a worker is free, which runs v5 meanwhile.
            for wait, group, p in ((0.0, "v", 3), (0.05, "v", 4), (0.05, "ta", 1), (0.05, "tb", 2),
                                   (0.15, "v", 5)):
                await asyncio.sleep(wait)
                jobs.append(asyncio.create_task(c.submit(group, p)))
            results = await asyncio.gather(*jobs)
            await c.close()
            return results

    assert asyncio.run(main()) == [6, 8, 2, 4, 10]
    assert most["t"] == 1, "two solo batches ran at once"
    assert most["v"] == 2, "the vector batches did not run side by side"
    assert (1, 1) in seen, "no vector batch ran beside a solo one"


def test_search_group_joins_equal_options_only():
    from clag_fast.server.service import search_group

    def opts(**changes):
        base = {"k": 5, "namespace": "a", "kind": None, "since": None, "until": None, "mode": "two_stage",
                "n_probe": None, "lexical_weight": None, "where": None}
        return dict(base, **changes)

    assert search_group("text", opts()) == search_group("text", opts())
    assert search_group("text", opts()) != search_group("vector", opts())
    for change in ({"k": 6}, {"namespace": "b"}, {"namespace": None}, {"kind": "fact"}, {"since": 1.0},
                   {"until": 2.0}, {"mode": "flat"}, {"n_probe": 3}, {"lexical_weight": 0.0},
                   {"where": {"x": 1}}):
        assert search_group("text", opts(**change)) != search_group("text", opts()), change
    # A metadata filter compares as canonical JSON: key order does not matter, values do.
    assert search_group("text", opts(where={"a": 1, "b": {"$gt": 2}})) == \
        search_group("text", opts(where={"b": {"$gt": 2}, "a": 1}))
    assert search_group("text", opts(where={"a": 1})) != search_group("text", opts(where={"a": 2}))
    assert search_group("text", opts(where={"a": "1"})) != search_group("text", opts(where={"a": 1}))


def test_coalescer_refuses_beyond_max_pending():
    gate = threading.Event()

    async def main():
        with ThreadPoolExecutor(1) as pool:
            c = Coalescer("test", lambda g, ps: (gate.wait(5), ps)[1], pool, max_items=10, max_pending=3)
            c.start()
            jobs = [asyncio.create_task(c.submit("g", i)) for i in range(3)]
            await asyncio.sleep(0.05)
            with pytest.raises(Exception) as e:
                await c.submit("g", 99)
            gate.set()
            done = await asyncio.gather(*jobs)
            await c.close()
            return e.value, done

    err, done = asyncio.run(main())
    assert err.status == 503 and "queue is full" in err.message
    assert done == [0, 1, 2]


def test_store_errors_map_to_statuses_without_internals():
    from clag_fast.errors import ModelFilesError
    from clag_fast.server.http_errors import problem, store_error

    assert store_error(KeyError("no memory with id 7")) == (404, "not_found", "no memory with id 7")
    assert store_error(ValueError("k must be a positive integer"))[:2] == (400, "invalid")
    assert store_error(TypeError("memory id must be an int"))[:2] == (400, "wrong_type")
    assert store_error(PermissionError("read-only"))[:2] == (403, "forbidden")
    assert store_error(ModelFilesError("model package missing"))[:2] == (503, "model_unavailable")
    assert store_error(problem(413, "too_large", "big")) == (413, "too_large", "big")
    status, code, message = store_error(RuntimeError("/secret/path exploded"))
    assert (status, code) == (500, "internal") and "secret" not in message


def test_serve_process_runs_numpy_on_one_blas_thread():
    """``serve()`` sets numpy's OpenBLAS to one thread (``server.blas``): the count reads back
    as 1 (what is tested) and products still agree with the threaded ones to float32 rounding
    (not bit for bit: on some CPUs OpenBLAS' threaded kernels block the sums differently). In a
    child process, so this process keeps its own count."""
    import subprocess
    import sys

    code = """
import numpy as np
from clag_fast.server import blas
if blas.threads() is None:
    print("no-openblas")
    raise SystemExit(0)
rng = np.random.default_rng(0)
a, b = rng.random((300, 384), np.float32), rng.random((384, 700), np.float32)
before = a @ b
had = blas.limit_to_one_thread()
assert blas.threads() == 1, blas.threads()
np.testing.assert_allclose(a @ b, before, rtol=1e-5)
print("had", had)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("no-openblas"):
        pytest.skip("this numpy does not use OpenBLAS")
    assert out.stdout.startswith("had ")


@pytest.mark.parametrize("llm", ["off", "http://127.0.0.1:9"])
def test_service_store_reorganises_in_its_worker(tmp_path, llm):
    """The service's store re-organises in its worker thread with or without an SLM, so an
    add batch is answered before a re-organisation it made due."""
    from clag_fast.server.service import StoreService

    def organizers() -> int:
        return sum(t.name == "clag-fast-organizer" for t in threading.enumerate())

    before = organizers()
    svc = StoreService(ServeConfig(store=tmp_path / "s", embedder=False, dim=8, slm=llm))
    store = svc.open()
    try:
        assert organizers() == before + 1
        if llm == "off":
            assert store.config.slm.mode == "off" and store.config.slm.vector_in_background
    finally:
        store.close()
