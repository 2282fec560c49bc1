"""Coalescing concurrent requests into batches (group commit for adds, one native call for
searches).

Requests that arrive while a batch is running wait in a queue; when the batch is done the
worker takes everything queued for the same group (same search options, say) up to
``max_items`` and runs it as one call in a worker thread. Nothing waits on a timer: under
light load a request runs alone at once, under heavy load the batches grow by themselves,
which is where one embedding call for 64 texts and one SQLite commit for 64 adds pay off.

Batches that embed texts run one at a time (``solo``); other batches run side by side, up to
``workers``. A second text batch beside the first only splits the queue into smaller batches
that contend for the same cores (11-15% less throughput under benches/bench_service.py), while
vector batches are native work with the GIL released, for which a second one uses the second
core (~24% more with 32 namespaces): BENCHMARKS.md, fourteenth and fifteenth sessions.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from clag_fast.server.http_errors import problem

log = logging.getLogger(__name__)

#: run(group, payloads) -> one result (or exception instance) per payload, in order.
BatchRunner = Callable[[Hashable, list[Any]], list[Any]]


@dataclass
class _Job:
    group: Hashable
    payload: Any
    size: int
    future: asyncio.Future = field(repr=False)


class Coalescer:
    """A queue of jobs and ``workers`` tasks that run them in batches on ``executor``.
    ``solo(group)``: true for groups of which one batch at a time may run (the others still
    run beside it, up to ``workers`` batches in all)."""

    def __init__(self, name: str, run: BatchRunner, executor: Executor, *, max_items: int,
                 max_pending: int, workers: int = 1, solo: Callable[[Hashable], bool] | None = None) -> None:
        self.name = name
        self._run = run
        self._executor = executor
        self._max_items = max_items
        self._max_pending = max_pending
        self._n_workers = workers
        self._solo = solo
        self._solo_running = False
        self._queue: deque[_Job] = deque()
        self._pending = 0
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.batches = 0
        self.items = 0

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._tasks = [asyncio.create_task(self._worker(), name=f"{self.name}-{i}") for i in range(self._n_workers)]

    async def submit(self, group: Hashable, payload: Any, size: int = 1) -> Any:
        """Queue ``payload`` and wait for its result (raises what its batch raised for it)."""
        if self._closing or self._wake is None:
            raise problem(503, "shutting_down", "the service is shutting down")
        if self._pending + size > self._max_pending:
            raise problem(503, "busy", f"{self.name} queue is full ({self._pending} items waiting); retry later")
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Job(group, payload, size, future))
        self._pending += size
        self._wake.set()
        try:
            # shield: a client that hangs up does not cancel a write already queued for commit
            return await asyncio.shield(future)
        finally:
            self._pending -= size

    async def close(self) -> None:
        """Finish what is queued, then stop the workers."""
        self._closing = True
        while self._queue and self._tasks:
            await asyncio.sleep(0.01)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []

    def _may_run(self, group: Hashable) -> bool:
        return not (self._solo_running and self._solo is not None and self._solo(group))

    def _take(self) -> list[_Job] | None:
        """The next batch: the first queued job that may run now, with the jobs of its group
        queued after it (up to ``max_items``); None when nothing queued may run now."""
        first = next((job for job in self._queue if self._may_run(job.group)), None)
        if first is None:
            return None
        batch, n = [first], first.size
        keep: deque[_Job] = deque()
        for job in self._queue:
            if job is first:
                continue
            if job.group == first.group and n + job.size <= self._max_items:
                batch.append(job)
                n += job.size
            else:
                keep.append(job)
        self._queue = keep
        return batch

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            # No await between the look and clear(): workers share one event loop, so nothing
            # is queued or finishes in between.
            batch = self._take() if self._queue else None
            while batch is None:
                self._wake.clear()
                await self._wake.wait()
                batch = self._take() if self._queue else None
            solo = self._solo is not None and self._solo(batch[0].group)
            self._solo_running |= solo
            self.batches += 1
            self.items += sum(j.size for j in batch)
            try:
                results = await loop.run_in_executor(self._executor, self._run, batch[0].group,
                                                     [j.payload for j in batch])
            except Exception as e:  # the runner maps per-job errors itself; this is a bug or a crash
                log.exception("%s batch failed", self.name)
                results = [e] * len(batch)
            finally:
                if solo:
                    self._solo_running = False
                    self._wake.set()  # a solo job may be waiting for this batch to end
            for job, result in zip(batch, results):
                if job.future.done():
                    continue
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)
