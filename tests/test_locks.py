"""The store's readers-writer lock (``clag_fast.store.locks.RWLock``)."""

from __future__ import annotations

import threading

import pytest

from clag_fast.store.locks import RWLock


def _in_thread(fn, timeout: float = 5.0) -> bool:
    """Run ``fn`` in a thread; whether it finished within ``timeout`` seconds."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def test_readers_share_and_a_writer_excludes_them():
    lock = RWLock()
    with lock.read():
        assert _in_thread(lambda: lock.release_read(lock.acquire_read()))  # a second reader
        entered = threading.Event()

        def write():
            with lock.write():
                entered.set()

        t = threading.Thread(target=write, daemon=True)
        t.start()
        assert not entered.wait(0.2)  # the writer waits for the reader
    t.join(5)
    assert entered.is_set()


def test_the_writer_reenters_and_reads_what_it_writes():
    lock = RWLock()
    with lock.write():
        with lock.write():
            assert lock.acquire_read() is True  # nested: nothing taken
        assert not _in_thread(lambda: lock.release_read(lock.acquire_read()), timeout=0.2)
    assert _in_thread(lambda: lock.release_read(lock.acquire_read()))


def test_an_interrupted_writer_does_not_keep_readers_out(monkeypatch):
    """Ctrl-C while a writer waits for the readers to leave: the lock must not count it as
    waiting afterwards, or every later reader would wait behind a writer that is gone."""
    lock = RWLock()
    held = lock.acquire_read()  # the writer below has to wait for this reader

    def interrupted_wait(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lock._cond, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        with lock.write():
            pass
    monkeypatch.undo()
    assert _in_thread(lambda: lock.release_read(lock.acquire_read()))  # a new reader gets in
    lock.release_read(held)

    def write():
        with lock.write():
            pass

    assert _in_thread(write)  # and a writer, once it is alone
