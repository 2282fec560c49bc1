"""The store's side of the SLM: when to ask it, what to ask, and how answers are applied.

The organiser (``slm.organizer.Organizer``) owns the prompts and turns SLM answers into decisions;
this module owns their scheduling for one store: ambiguous routes queue up and go to the SLM
in batches, triggers (periodic, confusion, drift) start re-organisation, cluster profiles are
written after structural changes. With ``SLMConfig.background`` (the default) all SLM work runs
in one worker thread, so ``add()`` returns after vector routing and the decisions are applied
when they arrive; ``flush()``/``close()`` wait for them. SLM calls are made without holding the
store's lock; their answers are applied under it. No SLM failure escapes from here: the
organiser falls back to vector decisions and counts the error, and a managed server that
cannot start is reported once (a warning and ``stats()["slm"]``).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from clag_fast.labels import keyphrases
from clag_fast.store import organize as org_ops
from clag_fast.store.cluster_phrases import MAX_MEMBERS, cluster_phrases
from clag_fast.store.label_budget import EMBED_COST, PASS_COST, LabelBudget
from clag_fast.store import placement as place_ops
from clag_fast.store.state import StoreState

if TYPE_CHECKING:
    from clag_fast.store.placement import Placement

log = logging.getLogger(__name__)


#: Clusters a periodic organisation labels at most (explicit ones label every cluster that
#: needs it). Keyphrase labels read members' texts: relabelling every cluster that grew at
#: every periodic pass cut ingest of 8-30-word texts into a 40k store to 1.0k/s.
LABELS_PER_PASS = 32
# Phrases a cluster's label embeds in the first look (its ``profile_candidates`` and the label
# variants ``labels.keyphrases.TRIES``): what the label budget expects a cluster to cost.
PHRASES_PER_LABEL = 12


class SLMScheduler:
    """The SLM side of one open store.

    Args:
        state: the store's state.
        slm_arg: what ``MemoryStore.open(slm=...)`` was given (None, a URL, a client, False).
        embed: embeds texts for the store (topics become centres); raises ValueError when the
            store has no embedder.
        same_space: whether ``embed`` embeds into the space of the store's vectors. When it
            does not (vectors from another model), label phrases are ranked by document counts
            and the SLM's choice alone, and topics do not become centres.
    """

    def __init__(self, state: StoreState, slm_arg: Any, embed: Callable[[list[str]], np.ndarray],
                 same_space: Callable[[], bool] = lambda: True) -> None:
        from clag_fast.slm.connection import SLMConnection
        from clag_fast.slm.triggers import Triggers

        self._state = state
        self._embed = embed
        self._same_space = same_space
        #: The label work the write path has earned and spent (``store.label_budget``).
        self.labels = LabelBudget()
        cfg = state.config
        self.config = cfg.slm
        self._labels = list(cfg.labels) if cfg.labels else None
        #: The organiser and the SLM behind it (connected on first need).
        self.connection = SLMConnection(slm_arg, self.config, labels=self._labels)
        self._triggers = Triggers(self.config, organize_every=cfg.organize_period(len(state)))
        self._pending: list[tuple[int, int, str, list[int], list[float]]] = []
        self._pending_lock = threading.Lock()
        self._evolve: list[tuple[int, int, str]] = []  # (memory id, row, text) awaiting evolution
        self._updates: list[tuple[int, int, str]] = []  # (memory id, row, text) awaiting the update judge
        self._deferred: str | None = None  # a re-organisation a search asked for
        # A re-organisation that fell due during deferred adds
        # (``add_many(defer_organize=True)``) and has not run yet. Kept in the database too
        # (``organize.OWED_META``), so a bulk load whose process died before it organised
        # still owes it after a reopen.
        self._owed: str | None = state.catalog.meta(org_ops.OWED_META) or None
        self._jobs: queue.Queue | None = None
        # Job kinds queued and not started yet: one of each is enough (a route job takes every
        # pending route when it runs, an organisation covers the adds before it). Without this
        # every add() while the worker was busy queued another route job (273 queued jobs
        # after 300 adds in bench_add_latency.py).
        self._queued: set[str] = set()
        self._worker: threading.Thread | None = None
        # A pass left the labels of young clusters to a later SLM pass (``write_profiles``'s
        # ``slm_only``): ``drain`` asks for them if no pass has by then.
        self._labels_owed = False
        # Each memory's keyphrases, kept across profile passes (labels/keyphrases).
        self._phrases = keyphrases.PhraseCache()
        # Profiles written, by source: "slm" (an SLM answer accepted) or "vector" (the vector
        # profile, for no SLM, a failed call or an unusable answer). stats() shows them so a
        # caller can tell SLM decisions from fallbacks.
        self._label_counts: dict[str, int] = {"vector": 0, "slm": 0, "neutral": 0, "slm_not_distinct": 0}
        # Only SLM work needs a worker: vector-only organisation is bounded and amortised
        # (``StoreConfig.organize_period``), so it runs inline and stays deterministic, unless
        # the caller asks for it in the background (``SLMConfig.vector_in_background``).
        slm_worker = self.config.background and self.enabled
        # True when the worker exists only for vector-only organisations (no SLM to ask).
        self._vector_worker = not slm_worker and self.config.vector_in_background
        if (slm_worker or self._vector_worker) and not state.read_only:
            self._jobs = queue.Queue()
            # Background SLM work yields the cores to the caller's (add()'s embedding).
            self.connection.niceness = 10
            self._worker = threading.Thread(target=self._work, name="clag-fast-organizer", daemon=True)
            self._worker.start()

    # -- the SLM connection (lazy: a managed server starts on first need) ------------------
    def organizer(self):
        """The organiser, connected to the SLM once one is first needed."""
        return self.connection.organizer()

    @property
    def enabled(self) -> bool:
        return self.connection.enabled

    def describe(self) -> str:
        return self.connection.describe()

    def _space_embed(self) -> Callable[[list[str]], np.ndarray] | None:
        """The embedder that puts texts in the space of the store's vectors, or None."""
        return self._embed if self._same_space() else None

    def pending(self) -> dict[str, int]:
        """SLM work not applied yet: queued ambiguous routes and background jobs."""
        with self._pending_lock:
            routes = len(self._pending)
        return {"routes": routes, "jobs": self._jobs.unfinished_tasks if self._jobs is not None else 0}

    def label_stats(self) -> dict[str, int]:
        """Profiles written so far by kind: "slm" (the SLM's pick of keyphrases), "vector"
        (the top keyphrases), "neutral" (a "misc:" label: members share no content word, or
        hold no topic phrase, small talk); "slm_not_distinct":
        SLM picks replaced by the vector label because they read as another cluster."""
        return dict(self._label_counts)

    def usage(self) -> dict[str, Any]:
        """The client's call / token counts, and what the SLM decided: ``organizer_errors``
        (failed calls and unusable answers), ``decisions`` (accepted SLM decisions and vector
        fallbacks by kind: ``route_slm``, ``route_fallback``, ``profile``, ...), ``profiles``
        (profiles written by source, ``slm`` or ``vector``) and ``unavailable`` (why there is
        no SLM: a server that would not start, a missing package; None otherwise)."""
        stats = self.connection.stats()
        unavailable = stats.pop("unavailable")
        lc = self._label_counts  # profiles by source, from the label counters
        stats["profiles"] = {"slm": lc["slm"], "vector": lc["vector"] + lc["neutral"]}
        stats["unavailable"] = unavailable
        return stats

    # -- hooks from the store ----------------------------------------------------------------
    def note_routes(self, ids: list[int], rows: np.ndarray, texts: list[str], placement: "Placement") -> None:
        """Called under the write lock after vector routing: remember what the SLM should see."""
        if placement.scores is None:
            return
        n = len(ids)
        opened = np.zeros(n, bool)
        opened[list(placement.opened_rows)] = True  # placed in a cluster this batch opened
        # A memory that opened (or joined) a new cluster counts as an add, but its stale best
        # score says nothing about the drift of the existing clusters.
        best = placement.scores[:, 0].astype(np.float64)
        self._triggers.on_add_batch(np.where(opened | ~np.isfinite(best), np.nan, best))
        if not self.enabled:
            return
        if self.config.evolution:
            with self._pending_lock:
                self._evolve.extend((ids[i], int(rows[i]), texts[i]) for i in range(n))
        if self.config.updates:
            with self._pending_lock:
                self._updates.extend((ids[i], int(rows[i]), texts[i]) for i in range(n))
        # The vector rule, not ``needs_slm``: the organiser connects to the SLM lazily, so
        # before its first call (a reopened store that needs no cold start) it has no client
        # yet, and ``needs_slm`` would turn SLM routing off until then.
        scores = np.where(placement.candidates >= 0, placement.scores, -np.inf)
        ask = np.flatnonzero(self.connection.decisions.ambiguous(scores) & ~opened)
        if len(ask) == 0:
            return
        with self._pending_lock:
            for i in ask.tolist():
                ok = placement.candidates[i] >= 0
                self._pending.append((ids[i], int(rows[i]), texts[i], placement.candidates[i][ok].tolist(),
                                      placement.scores[i][ok].tolist()))

    def after_add(self, defer: bool = False) -> None:
        """After a write: start the re-organisation that is due, if any. ``defer`` (a bulk
        load's write): the cold start still runs (every later row is routed into its clusters),
        labelling at most ``LABELS_PER_PASS`` clusters as a periodic pass does, but a
        periodic, drift or confusion pass that falls due is only recorded as owed, for
        ``run_owed`` or the next write without ``defer``."""
        state = self._state
        if (state.config.labels is None and len(state.index.cluster_ids()) == 0
                and len(state) >= state.config.min_memories_to_cluster):
            # A bulk load's cold start sees its first batch only (341 clusters of 6 for
            # 2,048 rows), clusters the load then grows and splits: labelling each of them
            # (2.4 s of an owner's CPU, on cores the embedder needs) was mostly wasted.
            self._submit(("organize", None, "cold_start", LABELS_PER_PASS if defer else None))
            return
        with self._pending_lock:
            n_pending = max(len(self._pending), len(self._updates))
        if n_pending >= self.config.route_batch:
            self._submit(("route",))
        reason = self._triggers.due() or self._deferred or self._owed
        if reason and defer:
            self._owe(reason)
            return
        self._deferred = None
        if reason:
            self._rearm()
            self._submit(("organize", None, reason))

    def _rearm(self) -> None:
        """A periodic/drift/confusion pass is starting: the triggers count from here, the
        period from the store's size now."""
        self._triggers.reset()
        self._triggers.organize_every = self._state.config.organize_period(len(self._state))

    def _owe(self, reason: str) -> None:
        """Record (in memory and, once, in the database) that a pass is owed."""
        self._deferred = None  # a pass a search asked for is owed from now on
        if self._owed is None:
            with self._state.lock.write():
                self._state.catalog.set_meta(org_ops.OWED_META, reason)
            self._owed = reason

    def run_owed(self) -> dict[str, Any] | None:
        """Run, on the caller's thread, the re-organisation deferred writes left owed (one
        pass, as the write that found it due would have run); None when nothing is owed."""
        if self._state.read_only:
            return None
        reason = self._owed
        if reason is None:
            return None
        self._rearm()
        return self.organize(None, reason)

    def after_search(self, best_score: float) -> None:
        if self._state.read_only:
            return
        # due() can only say "confusion" when on_search says it holds; a search that leaves it
        # unset needs no look at the other triggers (they act on the next write).
        if self._triggers.on_search(best_score) and self._triggers.due() == "confusion":
            self._triggers.reset()
            if self._jobs is not None:
                self._submit(("organize", None, "confusion"))
            else:
                # Without a worker, a search never blocks on re-organisation: the next write
                # runs it.
                self._deferred = "confusion"

    # -- jobs ------------------------------------------------------------------------------
    def _submit(self, job: tuple) -> None:
        if self._jobs is None:
            self._run(job)
            return
        with self._pending_lock:
            if job[0] in self._queued:
                return
            self._queued.add(job[0])
        self._jobs.put(job)

    def _work(self) -> None:
        assert self._jobs is not None
        if not self._vector_worker:
            # SLM calls yield the cores to the callers. Vector-only work does not: it takes the
            # store's locks in turn with the callers' writes, and a starved holder would
            # stall them.
            _lower_thread_priority()
        while True:
            job = self._jobs.get()
            with self._pending_lock:
                self._queued.discard(job[0])
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
            self.organize(job[1], job[2], label_limit=job[3] if len(job) > 3 else None)
        elif job[0] == "profiles":
            self.write_profiles(use_slm=True)

    def drain(self) -> None:
        """Wait until background jobs are done, then route whatever is still pending and ask
        the SLM for the labels passes left to it (young clusters' labels)."""
        if self._jobs is not None:
            self._jobs.join()
        self.route_pending()
        if self._labels_owed and self.enabled and not self._state.read_only:
            self._labels_owed = False
            self.write_profiles(use_slm=True)

    def close(self) -> None:
        if self._worker is not None and self._jobs is not None:
            self._jobs.put(("stop",))
            self._worker.join(timeout=60)
            self._worker = None
        self.connection.close()

    # -- the decisions -----------------------------------------------------------------------
    def route_pending(self) -> None:
        """Ask the SLM to place the queued ambiguous memories; apply choices among candidates.
        Then run localized evolution for queued new memories (when enabled)."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
        if pending:
            self._route(pending)
        self._run_evolution()
        self._run_updates()

    def _route(self, pending: list) -> None:
        state = self._state
        org = self.organizer()
        with state.lock.read():
            briefs = self._briefs({c for p in pending for c in p[3]})
        # A candidate merged away or dropped since the route was queued (an organisation on
        # another thread) is no longer offered; its score goes with it.
        items = []
        for _, _, text, cands, scores in pending:
            kept = [(briefs[c], x) for c, x in zip(cands, scores) if c in briefs]
            items.append((text, [b for b, _ in kept], [x for _, x in kept]))
        routes = org.route(items)
        moves = [(p[0], p[1], r.cluster_id) for p, r in zip(pending, routes)
                 if r.by == "slm" and r.cluster_id is not None and r.cluster_id != p[3][0]]
        for r in routes:
            key = f"routed_{r.by}" if r.by in ("slm", "fallback") else None
            if key:
                state.count(key)
        if moves:
            with state.lock.write():
                _, rows, targets = zip(*moves)
                place_ops.move_rows(state, np.asarray(rows, np.int64), list(targets))
                state.cache.clear()

    def _run_updates(self) -> None:
        """The update judge: each new memory against the most similar older memory of its
        namespace in its cluster; a yes marks the older one superseded by it."""
        with self._pending_lock:
            todo, self._updates = self._updates, []
        if not todo:
            return
        state = self._state
        org = self.organizer()
        for mid, row, text in todo:
            with state.lock.read():
                older = org_ops.update_candidate(state, row, self.config.update_similarity) \
                    if state.rows.memory_id[row] == mid and state.rows.live[row] else None
            if older is None:
                continue
            if org.judge_update(older[1], text):
                with state.lock.write():
                    org_ops.apply_superseded(state, [(older[0], mid)])

    def _run_evolution(self) -> None:
        """Localized evolution: the SLM links each new memory to neighbours in its cluster and
        tags it; links and tags are written in one transaction per memory."""
        with self._pending_lock:
            todo, self._evolve = self._evolve, []
        if not todo:
            return
        state = self._state
        org = self.organizer()
        for mid, row, text in todo:
            with state.lock.read():
                neighbours = org_ops.cluster_neighbours(state, row, 5)
            result = org.evolve(text, neighbours)
            if result is None or (not result.links and not result.tags):
                continue
            with state.lock.write():
                org_ops.apply_evolution(state, mid, result.links, result.tags)

    def select_clusters(self, query: str, qvec: np.ndarray, n_probe: int) -> list[int] | None:
        """Query-time cluster selection by the SLM among the 2 * n_probe nearest clusters;
        None when it is off, there is no SLM, or the store is not clustered."""
        state = self._state
        if not self.config.select_clusters or not self.enabled:
            return None
        with state.lock.read():
            ids = state.index.cluster_ids()
            if len(ids) == 0:
                return None
            order = np.argsort(-(state.index.centres() @ qvec), kind="stable")[: 2 * n_probe]
            candidates = [int(ids[i]) for i in order]
            briefs = self._briefs(set(candidates))
        org = self.organizer()
        return org.select_clusters(query, [briefs[c] for c in candidates if c in briefs])

    def organize(self, task_context: str | None, reason: str,
                 progress: Callable[[str, int, int], None] | None = None,
                 label_limit: int | None = None) -> dict[str, Any]:
        """One re-organisation, then the profiles it calls for: every cluster that needs one
        for an explicit pass and the cold start, else (and with ``label_limit``) at most that
        many (``LABELS_PER_PASS``)."""
        t0 = time.perf_counter()
        try:
            return self._organize(task_context, reason, progress, label_limit)
        finally:
            self._state.count("organize_s", time.perf_counter() - t0)

    def _organize(self, task_context: str | None, reason: str,
                  progress: Callable[[str, int, int], None] | None,
                  label_limit: int | None) -> dict[str, Any]:
        state = self._state
        self.route_pending()
        with state.lock.read():
            before = state.catalog.meta("last_organized")
        topics: list[str] = []
        vectors = None
        # Topics become centres: only an embedder of the store's vector space can place them
        # (without one the SLM is not asked for them).
        space = self._space_embed()
        if reason == "explicit" and task_context and self._labels is None and space is not None:
            org = self.organizer()
            with state.lock.read():
                samples = self._sample_texts(20)
            topics = org.propose_topics(task_context, samples)
            if topics:
                try:
                    vectors = space(topics)
                except ValueError:  # the embedder refused them: topics cannot become centres
                    topics, vectors = [], None
        with state.lock.write():
            report = org_ops.organize(state, reason=reason, topics=topics, topic_vectors=vectors)
            # Any pass settles what deferred writes owed (``organize`` cleared the record in
            # its transaction).
            self._owed = None
        # Without a worker, periodic and drift re-organisations run inside add(): profiles
        # written there come from vectors (free), and the SLM writes them at explicit
        # organize() calls, the cold start, and in background mode, so an SLM call never
        # blocks add() for longer than a routing batch. An explicit organize() on the
        # caller's thread spends at most ``profile_budget_s`` on SLM profiles; the rest are
        # vector profiles now and SLM ones later, in the worker (or at the next pass).
        in_worker = threading.current_thread() is self._worker
        use_slm = reason in ("explicit", "cold_start") or (self._jobs is not None and not self._vector_worker)
        budget = None if in_worker else self.config.profile_budget_s
        # Only an explicit pass asks the SLM to label young clusters (opened, split or made by
        # the cold start since the pass before the last): while adds keep coming most of them
        # are split, merged or grown past their label before anyone reads it (on the demo
        # conversation none of the cold start's 7 SLM labels and 8 of the 25 written during
        # the ingest were still there at its end). Their vector labels stand until a later
        # pass, ``flush()`` or ``close()`` asks the SLM (``drain``).
        settled = None
        if reason != "explicit" and use_slm:
            with state.lock.read():
                settled = state.catalog.clusters_created_before(float(before)) if before else set()
        report["profiles"], report["profiles_deferred"] = self.write_profiles(
            use_slm=use_slm, budget_s=budget, progress=progress, recheck=reason == "explicit", slm_only=settled,
            # The cold start labels its clusters unbudgeted, so a small store has every cluster
            # labelled: once per store, about two texts read per row of the first batch
            # (a few milliseconds per hundred rows), less than its k-means costs.
            budgeted=reason not in ("explicit", "cold_start"),
            limit=label_limit if label_limit is not None or reason in ("explicit", "cold_start")
            else LABELS_PER_PASS)
        if report["profiles_deferred"] and self._jobs is not None and not in_worker:
            self._submit(("profiles",))
        return report

    def write_profiles(self, use_slm: bool = True, budget_s: float | None = None,
                       progress: Callable[[str, int, int], None] | None = None,
                       recheck: bool = False, limit: int | None = None,
                       slm_only: set[int] | None = None, budgeted: bool = False) -> tuple[int, int]:
        """Write a profile for each new or drifted cluster: SLM summary + tags, or the vector
        profile when there is no SLM, ``use_slm`` is off, or the SLM failed for that cluster.
        A vector profile written because ``use_slm`` was off, or because the server failed,
        is redone by the next SLM pass; one written because the SLM's answer was unusable
        keeps the usual inertia (redone when the cluster drifts), so it is not asked for
        again at every re-organisation. ``budget_s`` bounds the time spent on SLM calls; the
        clusters it did not reach count as deferred. ``recheck`` (explicit organisations) also
        gives a new vector label to every cluster whose label no longer points at it (its
        embedding nearer another centre: members moved since it was written). ``limit``
        (periodic organisations) labels at most that many clusters, unlabelled ones and then
        the largest first; the others keep their labels until a later pass. ``slm_only``: the
        clusters the SLM may label in this pass (None: any); the others it would have been
        asked for get their vector label and stay marked for a later SLM pass. ``budgeted``
        (passes inside the write path): only the clusters the label budget covers
        (``store.label_budget``), unlabelled ones first; their work is charged to it. Returns
        (profiles written, deferred)."""
        t0 = time.perf_counter()
        try:
            return self._write_profiles(use_slm, budget_s, progress, recheck, limit, slm_only, budgeted)
        finally:
            self._state.count("label_s", time.perf_counter() - t0)

    def _write_profiles(self, use_slm: bool, budget_s: float | None,
                        progress: Callable[[str, int, int], None] | None, recheck: bool, limit: int | None,
                        slm_only: set[int] | None, budgeted: bool) -> tuple[int, int]:
        todo = self._profile_todo(limit, ordered=budgeted)
        reads = None
        if budgeted:
            todo, reads = self._affordable(todo)
        relabel = self._stale_labels(set(todo)) if recheck else []
        misses = self._phrases.misses
        look = self._look(todo, relabel, reads)
        # Texts read for the first time (new members, rows new to the namespace's sample; each
        # row about once in its life) count once more: they were fetched and their phrases
        # extracted.
        fresh = self._phrases.misses - misses
        # Clusters merged or dropped between the two looks are gone.
        todo = [c for c in todo if c in look.briefs]
        relabel = [c for c in relabel if c in look.phrases]
        if not todo and not relabel:
            return 0, 0
        embed, best, embedded = self._rank_phrases(look)
        units = (PASS_COST + sum(min(ph.members, MAX_MEMBERS) for ph in look.phrases.values()) + fresh
                 + EMBED_COST * embedded)
        self._state.count("label_units", units)
        if budgeted:
            self.labels.spend(units)
        # The SLM's pick is kept only if it points at its cluster, and the best vector label is
        # the best of the top candidates' combinations: where even it does not point at its
        # cluster, an SLM pick almost never does (27 of 53 picks lost on a LoCoMo conversation).
        # Nor is the SLM asked where only the wide look found a label pointing home (a chat
        # cluster no topic phrase names): its choices are the few phrases and clause openings
        # of that exhaustive search, so a pick adds a call and no topic (asking them cost
        # conv-26 8 profile calls instead of 6 once clause openings let the wide look succeed).
        big = [c for c in todo if look.briefs[c].size >= self.config.profile_min_size and best.get(c, 1.0) > 0
               and not (c in look.phrases and look.phrases[c].wide)]
        later = set() if slm_only is None else {c for c in big if c not in slm_only}
        big = [c for c in big if c not in later]
        profiles: dict[int, tuple[str, list[str]]] = {}
        retry: set[int] = set()
        if self.enabled and big and use_slm:
            profiles, retry = self._slm_profiles(look, big, embed, budget_s, progress)
        slm_done = list(profiles)
        self._vector_profiles(profiles, todo, relabel, look.phrases)
        self._label_counts["slm"] += len(slm_done)
        # Clusters that deserved an SLM profile but were not asked, or whose call failed on
        # the server's side (down, timeout, HTTP 408/429/5xx), stay marked as unprofiled
        # (profiled_size 0) so the next SLM pass picks them up. Clusters whose answer was
        # unusable are not: in background mode (an SLM pass at every re-organisation)
        # SmolLM2's invalid answers were asked again and again, 65 of 135 calls on a 663-turn
        # conversation (BENCHMARKS.md).
        if not self.enabled:
            pending_slm: set[int] = set()
        elif use_slm:
            pending_slm = retry | later
            # A pass open to every cluster settles what earlier passes left.
            self._labels_owed = bool(later) or (self._labels_owed and slm_only is not None)
        else:
            pending_slm = set(big) - set(slm_done)
        with self._state.lock.write():
            # Sizes as the labels saw them: in background mode adds keep coming while the SLM
            # answers, and a cluster that grew meanwhile must be profiled again.
            # A label ranked against part of the namespace's sample (a bounded pass) is redone
            # by the next pass that gets to it, as a first label is.
            partial = {c for c in profiles if c in look.phrases and not look.phrases[c].complete}
            org_ops.save_profiles(self._state, profiles, time.time(), unprofiled=pending_slm | partial,
                                  sizes_then=look.sizes_then)
        if progress is not None:
            progress("profiles", len(profiles), len(todo))
        return len(profiles), len(pending_slm) if use_slm else 0

    def _profile_todo(self, limit: int | None, ordered: bool = False) -> list[int]:
        """The clusters that need a profile; with ``limit``, at most that many, unlabelled
        ones and then the largest first (that order too when ``ordered``)."""
        state = self._state
        with state.lock.read():
            todo = org_ops.clusters_needing_profiles(state, self.config.profile_drift_share)
            if ordered or (limit is not None and len(todo) > limit):
                _, size_now = state.cluster_table()
                todo = sorted(todo, key=lambda c: (bool(state.profiles.get(c, ("", []))[0]), -size_now.get(c, 0)))
            if limit is not None:
                todo = todo[:limit]
        return todo

    def _affordable(self, todo: list[int]) -> tuple[list[int], int]:
        """The first clusters of ``todo`` the label budget covers, and how many rows of the
        namespace samples the pass may read for the first time with the credit they leave.
        A cluster is taken at the most it can cost: its members ranked and each read for the
        first time (at most ``MAX_MEMBERS``), and, with an embedder of the store's space, its
        phrases embedded (``PHRASES_PER_LABEL``); the first one also pays ``PASS_COST``. The
        pass then charges what it did, so it never spends more than the credit it started
        with. No cluster covered: no pass."""
        state = self._state
        with state.lock.read():
            _, size = state.cluster_table()
        per = EMBED_COST * PHRASES_PER_LABEL if self._space_embed() is not None else 0.0
        costs = [2 * min(size.get(c, 0), MAX_MEMBERS) + per for c in todo]
        if costs:
            costs[0] += PASS_COST  # the pass itself comes with its first cluster
        n = self.labels.affordable(costs)
        if n == 0:
            return [], 0
        return todo[:n], max(0, int(self.labels.credit - sum(costs[:n])))

    def _look(self, todo: list[int], relabel: list[int], reads: int | None = None) -> "_ProfileLook":
        """What the labels are made from, read under the read lock in one look (``reads``:
        ``cluster_phrases``'s ``background_reads``)."""
        state = self._state
        with state.lock.read():
            briefs = self._briefs(set(todo))
            phrases = cluster_phrases(state, todo + relabel, self._phrases, background_reads=reads)
            _, sizes_then = state.cluster_table()
            ids = state.index.cluster_ids().tolist()
            centres = np.array(state.index.centres(), np.float32)
        return _ProfileLook(briefs, phrases, sizes_then, ids, centres)

    def _rank_phrases(self, look: "_ProfileLook") -> tuple[Callable[[list[str]], np.ndarray] | None,
                                                           dict[int, float], int]:
        """Rank each cluster's phrases by distinctness (the embedder, when there is one that
        embeds them into the space of the store's vectors) and set the SLM's candidates and
        choices on the briefs. Returns the embedder used (None: document counts alone), each
        cluster's best label margin, and how many phrases were embedded."""
        space = self._space_embed()
        embedded = 0

        def embed(texts: list[str]) -> np.ndarray:
            nonlocal embedded
            embedded += len(texts)
            return space(texts)

        best: dict[int, float] = {}
        used: Callable[[list[str]], np.ndarray] | None = embed if space is not None else None
        if used is not None:
            try:
                best = keyphrases.by_distinctness(look.phrases, look.ids, look.centres, used,
                                                  top=self.config.profile_candidates)
            except Exception as e:  # noqa: BLE001 - a label never fails an organisation
                # No embedder (embedder=False: ValueError), or a user's embedder that only
                # knows its own texts: document counts alone rank the phrases.
                log.debug("label phrases not embedded (%s: %s): ranked by document counts", type(e).__name__, e)
                used = None
        embed = used
        for cid, ph in look.phrases.items():
            if cid in look.briefs and ph.neutral is None:  # a neutral label is not the SLM's to change
                # Tags come from these: phrases, not clause openings (an SLM may still pick one
                # of those among its choices).
                look.briefs[cid].candidates = ph.tag_phrases()
                # The SLM picks among the topic phrases that, embedded alone, point at this
                # cluster: a pick among all candidates pointed elsewhere two times in three (102
                # of 148 picks replaced on three LoCoMo conversations), one among these almost
                # never (0 of 67), at less than half the calls; common words ("plan", "Ready")
                # are never offered. With fewer than two there is nothing to choose and the
                # vector label stays, without a call.
                look.briefs[cid].choices = ph.pointing(self.config.profile_candidates) if embed is not None else None
        return embed, best, embedded

    def _slm_profiles(self, look: "_ProfileLook", big: list[int], embed: Callable[[list[str]], np.ndarray] | None,
                      budget_s: float | None, progress: Callable[[str, int, int], None] | None,
                      ) -> tuple[dict[int, tuple[str, list[str]]], set[int]]:
        """The SLM's picks for clusters ``big`` (those that read as another cluster dropped)
        and the clusters worth asking again soon."""
        org = self.organizer()
        if progress is not None:
            progress("slm profiles", 0, len(big))
        deadline = None if budget_s is None else time.monotonic() + budget_s
        batch = org.profile_batch([look.briefs[c] for c in big], deadline=deadline)
        picked = dict(batch.profiles)
        if embed is not None and picked:
            # The SLM chooses among the candidates; a choice that reads as another cluster
            # (its embedding nearer another centre) loses to the vector label.
            slot = {c: i for i, c in enumerate(look.ids)}
            keep = [c for c in picked if c in slot]
            try:
                m = keyphrases.margins(embed([picked[c].summary for c in keep]), [slot[c] for c in keep],
                                       look.centres).tolist()
            except Exception:  # noqa: BLE001 - an embedder that cannot embed them: keep the picks
                m = [1.0] * len(keep)
            for c, margin in zip(keep, m):
                if margin <= 0:
                    picked.pop(c)
                    self._label_counts["slm_not_distinct"] += 1
        return {cid: (prof.summary, list(prof.tags)) for cid, prof in picked.items()}, batch.retry

    def _vector_profiles(self, profiles: dict[int, tuple[str, list[str]]], todo: list[int], relabel: list[int],
                         phrases: dict[int, keyphrases.ClusterPhrases]) -> None:
        """The vector label of every cluster of ``todo`` and ``relabel`` the SLM did not
        label (a relabelled cluster only when its phrases were read), into ``profiles``."""
        for cid in todo + relabel:
            if cid not in profiles and (cid in phrases or cid not in relabel):
                ph = phrases.get(cid, keyphrases.ClusterPhrases(neutral=keyphrases.NEUTRAL_MIXED))
                profiles[cid] = keyphrases.phrases_label(ph)
                self._label_counts["neutral" if ph.neutral is not None else "vector"] += 1

    def _stale_labels(self, skip: set[int]) -> list[int]:
        """Clusters (outside ``skip``) with a neutral label or one without a topic phrase, or
        whose label, embedded, is nearer another cluster's centre than its own (not checked
        without an embedder). One embedding per labelled cluster."""
        state = self._state
        with state.lock.read():
            ids = state.index.cluster_ids().tolist()
            centres = np.array(state.index.centres(), np.float32)
            templates = state.catalog.template_clusters()
            labels = {c: state.profiles.get(c, ("", []))[0] for c in ids}
        neutral = keyphrases.NEUTRAL_LABELS
        # A neutral label is looked at again as well: its members may share a topic by now; so
        # is a label of common words only (an SLM topic such as "April", a label written before
        # its cluster had a topic phrase).
        mine = [c for c in ids if c not in skip and c not in templates and labels[c]]
        again = [c for c in mine if labels[c] in neutral
                 or not any(map(keyphrases.topic_phrase, labels[c].split(" · ")))]
        done = set(again)
        check = [c for c in mine if c not in done]
        if not check or len(ids) < 2:
            return again
        slot = {c: i for i, c in enumerate(ids)}
        space = self._space_embed()
        if space is None:  # labels cannot be placed among the centres
            return again
        try:
            m = keyphrases.margins(space([labels[c] for c in check]), [slot[c] for c in check], centres)
        except Exception:  # noqa: BLE001 - no embedder, or one that cannot embed labels
            return again
        return again + [c for c, x in zip(check, m.tolist()) if x <= 0]

    def _briefs(self, cids: set[int]):
        from clag_fast.slm.organizer import ClusterBrief

        state = self._state
        ids = state.index.cluster_ids().tolist()
        sizes = dict(zip(ids, state.index.cluster_sizes().tolist()))
        slot = {c: i for i, c in enumerate(ids)}
        centres = state.index.centres()
        picked = {cid: org_ops.example_ids(state, cid, self.config.profile_examples, centres[slot[cid]])
                  for cid in cids if cid in slot}
        texts = state.catalog.texts([m for mids in picked.values() for m in mids])  # one statement
        out = {}
        for cid, mids in picked.items():
            summary, tags = state.profiles.get(cid, ("", []))
            out[cid] = ClusterBrief(id=cid, summary=summary, tags=list(tags),
                                    examples=[texts[m] for m in mids if m in texts], size=sizes.get(cid, 0))
        return out

    def _sample_texts(self, n: int) -> list[str]:
        state = self._state
        live = state.rows.live_rows()
        if len(live) == 0:
            return []
        pick = live[np.linspace(0, len(live) - 1, num=min(n, len(live))).astype(np.int64)]
        mids = state.rows.memory_id[pick].tolist()
        texts = state.catalog.texts(mids)
        return [texts[m] for m in mids if m in texts]


@dataclass
class _ProfileLook:
    """One look at the clusters to label: their briefs (for the SLM), their ranked phrases,
    every cluster's size then, the cluster ids and their centres (in the same order)."""

    briefs: dict[int, Any]
    phrases: dict[int, keyphrases.ClusterPhrases]
    sizes_then: dict[int, int]
    ids: list[int]
    centres: np.ndarray


def _lower_thread_priority() -> None:
    """Linux: the worker thread's nice value +10 (per thread there), so the caller's threads
    run first when the cores are busy; elsewhere nothing (it would renice the process)."""
    if sys.platform != "linux":
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass
