"""Locks: a readers-writer lock for one process, and the writer's lock file across processes."""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from clag_fast.errors import StoreLockedError


class RWLock:
    """Many concurrent readers or one writer; writers are not starved by a stream of readers.

    Searches take the read side so several run at once (the native search releases the GIL);
    every mutation of the index or the database takes the write side. Re-entrant for the
    writer thread, so write paths may call helpers that take the write side again.
    """

    def __init__(self) -> None:
        # The read side enters `_mutex` directly: entering the Condition runs its Python-level
        # __enter__/__exit__, two frames per use on the path of every search.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None
        self._depth = 0
        self._waiting_writers = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        nested = self.acquire_read()
        try:
            yield
        finally:
            self.release_read(nested)

    def acquire_read(self) -> bool:
        """Take the read side; returns True when the caller already holds the write side
        (then nothing was taken). Pass the result to ``release_read``. For hot paths: the
        ``read()`` context manager costs ~1.5 us more per use (a generator)."""
        if self._writer == threading.get_ident():  # a writer may read what it is writing
            return True
        with self._mutex:
            while self._writer is not None or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        return False

    def release_read(self, nested: bool) -> None:
        if nested:
            return
        with self._mutex:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                self._waiting_writers += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                except BaseException:
                    # An interrupted wait (Ctrl-C): a writer still counted as waiting would keep
                    # every later reader waiting behind it, forever.
                    self._waiting_writers -= 1
                    self._cond.notify_all()
                    raise
                self._waiting_writers -= 1
                self._writer, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._writer = None
                    self._cond.notify_all()


class WriterLock:
    """An exclusive ``flock`` on ``<store>/LOCK`` held while a process has the store open for
    writing. The kernel drops it when the process dies, so a SIGKILLed writer never leaves a
    stale lock behind."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            raise StoreLockedError(
                f"{path.parent} is open for writing by another process (pid {holder}); "
                "open it with read_only=True to read alongside"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
