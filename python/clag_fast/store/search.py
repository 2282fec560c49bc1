"""Two-stage retrieval for a store: filters to a row mask, the probe rule, the native search,
and hits with their cluster labels.

Per query the work outside the native search is constant: the filter mask is cached per
(filters, write version) in the row table, decay weights per write version and minute, and
the k hits' texts come from SQLite in one statement.

Hybrid search (a text query with a lexical weight > 0): the BM25 top rows among the eligible
rows (MaxScore in the core; term statistics from the query's namespace only, kept
incrementally), the vector search widened to ``HYBRID_POOL`` hits, and in two-stage mode a
cluster-aware stage 1: besides the clusters nearest the query by centre (the native probe),
the cluster of the best lexical match is scanned too (``LEXICAL_CLUSTERS``). The candidates (vector hits,
lexical top hits, members of the lexical clusters) are scored by ``lexical.fuse``. A query
with no indexable word (punctuation, emoji, stopwords) is searched by vectors only.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import NamedTuple

import numpy as np

from clag_fast.index import SearchResult
from clag_fast.results import Hit, Hits, Turn, make_hit
from clag_fast.store import context as context_mod
from clag_fast.store import filters as filters_mod
from clag_fast.store import reflections
from clag_fast.store import threads
from clag_fast.store.lexical import LexicalIndex
from clag_fast.store.rowtable import RowTable
from clag_fast.store.state import StoreState

#: Vector and lexical hits each taken as hybrid candidates (at least k). 30 against 50: LoCoMo
#: through the store Recall@10 0.661 vs 0.663, the docstrings set 0.815 vs 0.823 (flat), for a
#: hybrid search a third cheaper at 100k (1.89x vector-only instead of 2.66x; BENCHMARKS.md).
HYBRID_POOL = 30
#: Clusters scanned because a lexical top hit lives there. One keeps LoCoMo's two-stage hybrid
#: Recall@10 (0.645 at 17.6% scanned; a quarter of the probe budget: 0.645 at 18.3%), and each
#: more gathers ~100 scattered rows at 100k memories (0.2 ms for the four a quarter gave).
LEXICAL_CLUSTERS = 1
#: A flat search over at most this many eligible rows scores just those rows (their list
#: cached per filter and write version) instead of scanning the whole row range with a mask:
#: at 100k rows a 1% filter's masked scan cost 3x the dot products it needed
#: (benches/bench_filters.py).
SUBSET_ROWS = 8192
#: Gathered vectors the filter cache may hold (a 1% filter of 100k memories at dim 384: 1.5 MB).
SUBSET_CACHE_BYTES = 64 << 20


class _FilterEntry:
    """What the filter cache keeps per filter until the next write: the row mask (None when
    every row is eligible), the eligible count, and the eligible rows with their gathered
    vectors once a flat search needed them (``Searcher._subset``)."""

    __slots__ = ("mask", "count", "n", "subset")

    def __init__(self, mask: np.ndarray | None, count: int, n: int) -> None:
        self.mask = mask
        self.count = count
        self.n = n  # the rows it covers (the mask's length; the row table's when mask is None)
        self.subset: tuple[np.ndarray, np.ndarray] | None = None


class Searcher:
    """Searches one store's state; owns the per-write caches the search path reuses."""

    def __init__(self, state: StoreState, lexical: LexicalIndex | None = None) -> None:
        self.state = state
        self.lexical = lexical if lexical is not None else LexicalIndex()
        self._weights: tuple[int, float, np.ndarray] | None = None
        self._filters: dict[tuple, _FilterEntry] = {}
        self._filters_version: tuple[int, int] = (-1, -1)
        self._subset_bytes = 0
        self._subsets_lock = threading.Lock()
        # probe_plan's answers by (n_probe, hybrid, cluster count): a pure function of them
        # (the config is frozen), asked on every search.
        self._plans: dict[tuple, tuple[int, dict]] = {}
        self._speakers = context_mod.SpeakerNames()
        self._sources = reflections.Sources()

    def eligible(self, filters: tuple) -> tuple[np.ndarray | None, int]:
        """(row mask or None, eligible count) for (namespace, kind, since, until, where), the
        last a parsed ``where=`` filter (``store.filters.parse``) or None; cached until the next
        write: counting a mask is O(rows), which at 1M rows would cost more than the search.
        None when every row is eligible, so the native scan skips the mask."""
        entry = self._entry(filters)
        return entry.mask, entry.count

    def _entry(self, filters: tuple) -> _FilterEntry:
        """The cache entry of ``filters``, its subset filled by ``_subset``."""
        rows = self.state.rows
        version = (rows.version, self.state.fields.version)
        if self._filters_version != version:
            self._follow_writes(version)
        entry = self._filters.get(filters)
        if entry is None and filters == _NO_FILTER:
            # Every live row: the live column itself (a view: writes, which change it, run
            # under the write lock and drop this entry) and its kept count. Building it anew
            # after each write cost a copy and a count of every row (0.06 ms at 1M).
            n = rows.n
            entry = _FilterEntry(None if rows.n_live == n else rows.live[:n], rows.n_live, n)
            self._filters[filters] = entry
        elif entry is None:
            mask = rows.mask(*filters[:4])
            if filters[4] is not None:
                table = self.state.field_table(filters_mod.fields_of(filters[4]))
                mask &= filters_mod.mask(filters[4], table, rows.n)
            count = int(np.count_nonzero(mask))
            entry = _FilterEntry(None if count == len(mask) else mask, count, len(mask))
            if len(self._filters) > 64:  # many distinct filters: keep memory bounded
                self._drop_filters()
            # Building a metadata column (a field's first where=) bumps their version: key
            # the cache by the version after it.
            self._filters_version = (rows.version, self.state.fields.version)
            self._filters[filters] = entry
        return entry

    def _follow_writes(self, version: tuple[int, int]) -> None:
        """Bring the filter cache to ``version`` (row table, metadata columns). Entries of
        namespace/kind/time filters are carried over with their rows that writes changed
        recomputed (a copy of the mask and those rows: at 1M rows a namespace filter's mask
        rebuilt per write cost ~1 ms per search in a read/write mix); the rest are dropped
        and rebuilt when asked for."""
        rows = self.state.rows
        old_rows = self._filters_version[0]
        changed = rows.changed_since(old_rows) if old_rows >= 0 else None
        if changed is None:
            self._drop_filters()
            self._filters_version = version
            return
        carried = {}
        for key, entry in list(self._filters.items()):
            # Metadata columns changed with the rows or alone (an update of metadata): the
            # entries that read them are rebuilt; the others do not depend on them.
            if key != _NO_FILTER and key[4] is None:
                carried[key] = entry if len(changed) == 0 else _carried(entry, rows, key, changed)
        with self._subsets_lock:
            self._filters = carried
            self._subset_bytes = sum(e.subset[1].nbytes for e in carried.values() if e.subset is not None)
        self._filters_version = version

    def _drop_filters(self) -> None:
        with self._subsets_lock:
            self._filters = {}
            self._subset_bytes = 0

    def probe_plan(self, n_probe: int | None, hybrid: bool = False, n_clusters: int | None = None) -> tuple[int, dict]:
        """(cap, probe-rule arguments) for the native two-stage search.

        Default: adaptive probing; the automatic count is only the cap, the core probes the
        best ``min_probe`` clusters, then each further one whose centre score is within
        ``probe_gap`` of the best. A count given per call (or ``StoreConfig.n_probe``) is a
        floor: exactly those clusters, and the next ones only while the probed lists hold
        fewer than k rows, so a store of small clusters never falls back to a flat scan and a
        larger count never scans less. ``hybrid``: the default cap is a quarter of the automatic
        one, since the lexical side finds much of what the far clusters would (LoCoMo hybrid
        Recall@10 0.644 flat, 0.644 at cap 8 scanning 25%, vs 46% at the full cap)."""
        if n_clusters is None:
            n_clusters = self.state.index.n_clusters()
        key = (n_probe, hybrid, n_clusters)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(n_probe, hybrid, n_clusters)
            if len(self._plans) > 256:  # cluster counts move with organisation: stay bounded
                self._plans = {}
            self._plans[key] = plan
        return plan

    def _plan(self, n_probe: int | None, hybrid: bool, n_clusters: int) -> tuple[int, dict]:
        cfg = self.state.config
        auto = self.auto_probe(n_clusters)
        fixed = n_probe if n_probe is not None else cfg.n_probe
        if fixed is not None:
            return max(fixed, auto), {"probe_gap": 0.0, "min_probe": fixed}
        cap = max(4, auto // 4) if hybrid else auto
        if cfg.probe_gap is None:
            return cap, {}
        return cap, {"probe_gap": cfg.probe_gap, "min_probe": cfg.min_probe}

    def auto_probe(self, n_clusters: int | None = None) -> int:
        """The automatic cap: ``probe_fraction`` of the clusters (``n_clusters`` when the
        caller has counted them), at least 4 and at most ``max_probe``."""
        cfg = self.state.config
        if n_clusters is None:
            n_clusters = self.state.index.n_clusters()
        return int(min(max(4, math.ceil(cfg.probe_fraction * n_clusters)), cfg.max_probe))

    def search(self, qvecs: np.ndarray, k: int, filters: tuple, mode: str, n_probe: int | None,
               selected: list[int] | None = None, texts: list[str] | None = None,
               lexical_weight: float = 0.0, context: int = 0) -> list[Hits]:
        """One ``Hits`` per query row of ``qvecs`` (q, dim). Call under the read lock.

        ``texts`` (the query texts, or None for vector queries) with ``lexical_weight`` > 0
        make it a hybrid search (module docstring). ``context``: each hit carries its
        neighbours up to this many turns away in its thread."""
        state = self.state
        entry = self._entry(filters)
        mask, candidates = entry.mask, entry.count
        if candidates == 0:
            return [Hits([], candidates=0, scanned=0, mode=mode) for _ in range(len(qvecs))]
        weights = self._decay_weights()
        shown = _Shown(mask, context)
        if selected:
            return [self._search_selected(qvecs, k, mask, candidates, selected, weights, shown)]
        idx = state.index
        n_clusters = idx.n_clusters()
        eff_mode = mode if n_clusters else "flat"
        if eff_mode == "two_stage" and mask is not None and candidates <= n_clusters:
            # A selective filter leaves fewer eligible rows than stage 1 has centres to score:
            # scoring them all is cheaper than probing, and exact (nothing can starve).
            eff_mode = "flat"
        hybrid = texts is not None and lexical_weight > 0
        if eff_mode == "flat" and mask is not None and candidates <= SUBSET_ROWS and not hybrid:
            res = self._subset_search(qvecs, k, entry, weights)
            return [Hits(self._hits(res, q, shown), scanned=candidates, candidates=candidates, mode="flat")
                    for q in range(len(qvecs))]
        probe, adaptive = self.probe_plan(n_probe, hybrid, n_clusters)
        if hybrid:
            out = []
            for q, text in enumerate(texts):
                hits = self._hybrid(qvecs[q], text, k, filters, mask, candidates, eff_mode, probe, weights,
                                    lexical_weight, adaptive, shown)
                out.append(hits if hits is not None else
                           self.search(qvecs[q:q + 1], k, filters, mode, n_probe, context=context)[0])
            return out
        res = idx.search(qvecs, k=k, n_probe=probe, mode=eff_mode, mask=mask, weights=weights, **adaptive)
        out = []
        want = min(k, candidates)
        # Python lists, not numpy ops: for one query each numpy call cost more than the loop.
        counts, scanned = res.counts.tolist(), res.scanned.tolist()
        short = [q for q, c in enumerate(counts) if c < want] if eff_mode == "two_stage" else []
        flat = None
        if short:
            # A selective filter (a small namespace) can leave the probed clusters short of k
            # eligible rows: the eligible rows are few, so scanning them all is cheap.
            flat = idx.search(qvecs[short], k=k, mode="flat", mask=mask, weights=weights)
        where = {q: i for i, q in enumerate(short)}
        for q in range(len(qvecs)):
            if q in where:
                i = where[q]
                out.append(Hits(self._hits(flat, i, shown), scanned=int(flat.scanned[i]), candidates=candidates,
                                mode="flat"))
                continue
            probed = _probed(res.probed[q].tolist()) if eff_mode == "two_stage" else []
            out.append(Hits(self._hits(res, q, shown), scanned=scanned[q], candidates=candidates,
                            clusters_probed=probed, mode=eff_mode))
        return out

    def search_vector(self, q: np.ndarray, k: int, filters: tuple, mode: str, n_probe: int | None,
                      context: int = 0) -> Hits:
        """``search`` of one vector query (float32[dim], its shape checked; NaN and infinity
        are refused here: by the native search on the fast path). Call under the read lock.

        The common case, a two-stage search whose filters leave more rows than there are
        clusters, is one ``VectorIndex.search_one`` call (hits as lists, memory ids mapped in
        the same native call): none of ``search``'s batch set-up, padded result arrays or
        per-hit numpy indexing. Anything else (an unclustered store, a selective filter, the
        probed clusters short of k eligible rows) goes through ``search``."""
        entry = self._entry(filters)
        candidates = entry.count
        if mode == "two_stage" and candidates:
            state = self.state
            n_clusters = state.index.n_clusters()
            if n_clusters and (entry.mask is None or candidates > n_clusters):
                probe, adaptive = self.probe_plan(n_probe, n_clusters=n_clusters)
                rows, scores, clusters, mids, scanned, probed = state.index.search_one(
                    q, state.rows.memory_id, k, probe, mode, entry.mask, self._decay_weights(), **adaptive)
                if len(rows) >= min(k, candidates):
                    return Hits(self._hit_list(rows, scores, clusters, mids, _Shown(entry.mask, context)),
                                scanned=scanned, candidates=candidates, clusters_probed=probed, mode=mode)
        check_finite_query(q)  # an empty filter or store answers without the native check
        return self.search(q[None, :], k, filters, mode, n_probe, context=context)[0]

    def _hybrid(self, q: np.ndarray, text: str, k: int, filters: tuple, mask: np.ndarray | None,
                candidates: int, mode: str, probe: int, weights: np.ndarray | None,
                weight: float, adaptive: dict | None, shown: "_Shown") -> Hits | None:
        """Hybrid search of one query; None when the query has no word in scope (vectors only).
        ``adaptive``: the probe rule's arguments for the native two-stage search."""
        state = self.state
        idx, rows = state.index, state.rows
        pool = max(HYBRID_POOL, k)
        # The pool is wide (k = HYBRID_POOL) but only k rows need to be reachable: probing small
        # clusters until 50 rows were listed scanned 46% of a conversation store for the
        # recall that 15% gives.
        rule = dict(adaptive or {}, min_rows=k) if adaptive else {}
        res = idx.search(q[None, :], k=pool, n_probe=probe, mode=mode, mask=mask, weights=weights, **rule)
        count = int(res.counts[0])
        if mode == "two_stage" and count < min(k, candidates):
            mode = "flat"  # a selective filter left the probed clusters short (see search())
            res = idx.search(q[None, :], k=pool, mode="flat", mask=mask, weights=weights)
            count = int(res.counts[0])
        v_rows, v_cos = res.ids[0, :count], res.scores[0, :count]
        lexical = self.lexical
        lexical.sync(rows.live[: rows.n], rows.version)  # a no-op unless rows died since the last sync
        # Term statistics are the namespace's (kept per namespace in the core: no mask, no
        # counting); the row mask is passed only when kind/time filters narrow the rows further.
        narrowed = any(f is not None for f in filters[1:])
        m = lexical.score(text, filters[0], mask if narrowed else None, pool, v_rows)
        if m.terms == 0 or len(m.rows) == 0:
            return None
        scanned = int(res.scanned[0])
        probed = _probed(res.probed[0].tolist()) if mode == "two_stage" else []
        extra = [m.rows]
        if mode == "two_stage":
            lex_clusters = self._lexical_clusters(m.rows, set(probed), LEXICAL_CLUSTERS)
            for c in lex_clusters:
                members = np.concatenate([idx.members(c), idx.secondary_members(c)])
                members = members[rows.live[members]] if mask is None else members[mask[members]]
                scanned += len(members)
                extra.append(members)
            probed += lex_clusters
        scanned += len(m.rows)
        others = np.concatenate(extra) if len(extra) > 1 else m.rows
        # A few hundred rows: Python sets beat np.unique + np.isin (~0.1 ms of sorting and
        # hashing per query); sorted, so ties resolve the same way every time.
        seen = set(v_rows.tolist())
        others = np.asarray(sorted(set(others.tolist()) - seen), dtype=np.int64)
        cand = np.concatenate([v_rows, others])
        # einsum, not `@`: a (rows x dim) @ (dim,) product goes to multithreaded BLAS, which on
        # busy cores took 4-7 ms for 1,350 rows (einsum: 0.1 ms; benches/bench_hybrid.py).
        cos = np.concatenate([v_cos, np.einsum("ij,j->i", idx.vectors()[others], q)]).astype(np.float32)
        bm = np.zeros(len(cand), np.float32)
        bm[:count] = m.looked
        if len(others):
            # BM25 of the other candidates: the lexical top rows carry theirs; members of the
            # lexical clusters outside the top count 0 (at most the smallest top score).
            order = np.argsort(m.rows)
            pos = np.minimum(np.searchsorted(m.rows[order], others), len(order) - 1)
            hit = m.rows[order[pos]] == others
            bm[count:][hit] = m.scores[order[pos[hit]]]
        if weights is not None:
            cos[count:] *= weights[others]
            bm *= weights[cand]
        query = context_mod.Query(q, text, filters[0], mask, narrowed, weights, weight, state.config.lexical_fusion,
                                  m.max_possible)
        ranked = context_mod.rank(state.config.ranking, rows, idx.vectors(), lexical, query, cand, cos, bm,
                                  self._speakers, state.catalog.texts, self._sources)
        scanned += ranked.scored
        top = np.argsort(-ranked.scores, kind="stable")[:k]
        hit_rows = ranked.rows[top]
        res = SearchResult(hit_rows[None, :], ranked.scores[top][None, :],
                           idx.cluster_of(hit_rows)[None, :], np.asarray([len(top)]),
                           np.asarray([scanned]), np.asarray([probed], np.int64).reshape(1, -1))
        return Hits(self._hits(res, 0, _Shown(shown.mask, shown.context, ranked.superseded)), scanned=min(scanned, candidates),
                    candidates=candidates, clusters_probed=probed, mode=mode)

    def _subset(self, entry: _FilterEntry) -> tuple[np.ndarray, np.ndarray]:
        """The eligible rows of a filter cache entry (uint32, ascending) and their vectors
        gathered contiguous, kept in the entry (so cached like ``eligible``) while the
        entries' gathered vectors fit in ``SUBSET_CACHE_BYTES``."""
        sub = entry.subset
        if sub is None:
            rows = np.flatnonzero(entry.mask).astype(np.uint32)
            sub = (rows, self.state.index.gather(rows))
            with self._subsets_lock:  # searches run concurrently under the read lock
                if self._subset_bytes + sub[1].nbytes > SUBSET_CACHE_BYTES:
                    for other in list(self._filters.values()):  # other searches may add entries
                        other.subset = None
                    self._subset_bytes = 0
                self._subset_bytes += sub[1].nbytes
                entry.subset = sub
        return sub

    def _subset_search(self, qvecs: np.ndarray, k: int, entry: _FilterEntry, weights: np.ndarray | None) -> SearchResult:
        """Exact top-k over the few eligible rows: the native search scores exactly the
        listed rows (their dot products alone, no pass over every row's mask), from a
        contiguous copy of their vectors gathered once per filter and write (scattered rows
        cost 1.5x a flat store of just those rows; benches/bench_filters.py)."""
        rows, block = self._subset(entry)
        return self.state.index.search(qvecs, k=k, mode="flat", weights=weights, rows=rows, rows_vectors=block)

    def _lexical_clusters(self, best_rows: np.ndarray, exclude: set[int], n: int) -> list[int]:
        """The ``n`` clusters (outside ``exclude``) whose best member matches the query best:
        the primary clusters of the lexical top rows, in the rows' order (best first)."""
        out: list[int] = []
        for c in self.state.index.cluster_of(best_rows).tolist():
            if c >= 0 and c not in exclude and c not in out:
                out.append(c)
                if len(out) == n:
                    break
        return out

    def _search_selected(self, qvecs, k, mask, candidates, selected: list[int], weights, shown: "_Shown") -> Hits:
        """Stage 2 over the clusters the SLM selected (query-time cluster selection)."""
        idx = self.state.index
        live = set(idx.cluster_ids().tolist())
        members = [m for c in selected if c in live for m in (idx.members(c), idx.secondary_members(c))]
        in_clusters = np.zeros(len(idx), bool)
        if members:
            in_clusters[np.concatenate(members)] = True
        sub = in_clusters if mask is None else mask & in_clusters
        res = idx.search(qvecs[:1], k=k, mode="flat", mask=sub, weights=weights)
        return Hits(self._hits(res, 0, shown), scanned=int(sub.sum()), candidates=candidates,
                    clusters_probed=list(selected), mode="two_stage")

    def _hits(self, res, q: int, shown: "_Shown") -> list[Hit]:
        """Hits for query ``q`` of a native result, with texts and labels; records the access."""
        state = self.state
        count = int(res.counts[q])
        if count == 0:
            return []
        hit_rows = res.ids[q, :count]
        return self._hit_list(hit_rows.tolist(), res.scores[q, :count].tolist(), res.clusters[q, :count].tolist(),
                              state.rows.memory_id[hit_rows].tolist(), shown)

    def _hit_list(self, rows: list[int], scores: list[float], clusters: list[int], mids: list[int],
                  shown: "_Shown") -> list[Hit]:
        """Hits of one query from its hit rows, scores, primary clusters (-1: none) and memory
        ids, with texts and cluster labels (and what ``shown`` adds); records the access."""
        state = self.state
        label = state.profiles.get
        unlabelled = ("", ())
        hits = [make_hit(mid, text, score, cid if cid >= 0 else None, (p := label(cid, unlabelled))[0], list(p[1]),
                         kind_, ns, created, meta, key)
                for mid, score, cid, (text, kind_, ns, created, meta, key)
                in zip(mids, scores, clusters, state.catalog.details_list(mids))]
        state.access.record(state.rows, rows, clusters, time.time())
        r = state.rows
        if r.successor_rows or shown.context:
            hits = self._with_context(hits, rows, shown)
        return hits

    def _with_context(self, hits: list[Hit], rows: list[int], shown: "_Shown") -> list[Hit]:
        """The hits with their ``superseded_by`` (where the newer memory is eligible) and, when
        ``shown.context`` > 0, their neighbouring turns."""
        r = self.state.rows
        eligible = r.live if shown.mask is None else shown.mask
        superseded = shown.superseded
        if superseded is None:
            found = context_mod.successors_in_effect(r, np.asarray(rows, np.int64), r.successor_rows, eligible)
            superseded = {row: int(r.memory_id[new]) for row, new in found.items()}
            if found:
                hits, rows = self._newer_first(hits, rows, found, shown)
        turns: list[tuple[Turn, ...]] = [()] * len(rows)
        if shown.context:
            turns = self._turns(np.asarray(rows, np.int64), shown.context, eligible)
        return [dataclasses.replace(h, superseded_by=superseded.get(row), context=t) if (row in superseded or t) else h
                for h, row, t in zip(hits, rows, turns)]

    def _newer_first(self, hits: list[Hit], rows: list[int], found: dict[int, int],
                     shown: "_Shown") -> tuple[list[Hit], list[int]]:
        """Hits (and their rows) with each newer memory ahead of the one it supersedes: moved
        up when it is a hit too, else put in its place with its score, the list kept at its
        length. Hybrid search ranks them so already; this orders the other searches."""
        hits, rows = list(hits), list(rows)
        for old_row, new_row in found.items():
            if old_row not in rows:
                continue  # dropped off the end by an earlier insertion
            i = rows.index(old_row)
            if new_row in rows:
                j = rows.index(new_row)
                if j > i:
                    hits.insert(i, hits.pop(j))
                    rows.insert(i, rows.pop(j))
                continue
            cid = int(self.state.index.cluster_of(np.asarray([new_row]))[0])
            newer = self._hit_list([new_row], [hits[i].score], [cid], [int(self.state.rows.memory_id[new_row])],
                                   _Shown(shown.mask, 0, {}))
            hits.insert(i, newer[0])
            rows.insert(i, new_row)
            hits.pop()
            rows.pop()
        return hits, rows

    def _turns(self, rows: np.ndarray, n: int, eligible: np.ndarray) -> list[tuple[Turn, ...]]:
        """Per hit row, its live neighbours up to ``n`` turns before and after, in thread order."""
        r = self.state.rows
        around = threads.neighbours(r, rows, n)
        picked = []
        for i in range(len(rows)):
            before = [(-(d + 1), int(around[2 * d][i])) for d in range(n)]
            after = [(d + 1, int(around[2 * d + 1][i])) for d in range(n)]
            picked.append([(off, row) for off, row in sorted(before) + after if row >= 0 and eligible[row]])
        mids = sorted({int(r.memory_id[row]) for p in picked for _, row in p})
        details = self.state.catalog.details(mids) if mids else {}
        speakers = r.names("speaker")
        out = []
        for p in picked:
            out.append(tuple(Turn(int(r.memory_id[row]), off, details[int(r.memory_id[row])][0],
                                  speakers.get(int(r.speaker[row])))
                             for off, row in p if int(r.memory_id[row]) in details))
        return out

    def _decay_weights(self) -> np.ndarray | None:
        """Per-row decay weights: every row's once a minute, and in between those of the rows
        that writes changed (at the same clock), so a write costs its rows, not the store's.

        A half-life is measured in days, so a minute-old weight is off by < 0.05% even at a
        one-day half-life, while recomputing costs ~2 ms per 100k rows: several times a
        two-stage search. Accesses by searches count at the next full recomputation.
        """
        policy = self.state.config.forgetting
        if not policy.active:
            return None
        now = time.time()
        rows = self.state.rows
        cached = self._weights
        if cached is not None and now - cached[1] < 60.0:
            version, t, buf = cached
            if version == rows.version:
                return buf[: rows.n]
            # Writes since: recompute the rows they changed (same clock), not every row; an
            # add into a 1M store recomputed 1M weights for the next search (6.8 ms).
            changed = rows.changed_since(version)
            if changed is not None:
                if rows.n > len(buf):
                    grown = np.empty(max(rows.n, 2 * len(buf)), np.float32)  # doubling: amortised
                    grown[: len(buf)] = buf
                    buf = grown
                if len(changed):
                    buf[changed] = rows.weights(policy, t, changed)
                self._weights = (rows.version, t, buf)
                return buf[: rows.n]
        w = rows.weights(policy, now)
        self._weights = (rows.version, now, w)
        return w


_NO_FILTER = (None, None, None, None, None)  # (namespace, kind, since, until, where)


class _Shown(NamedTuple):
    """What a search's hits show besides their text and labels: the eligible rows (None: every
    live row), how many neighbouring turns (``context``), and the superseded hits already
    found (row -> newer memory id; None: look them up)."""

    mask: np.ndarray | None
    context: int = 0
    superseded: dict[int, int] | None = None


def _carried(entry: _FilterEntry, rows: RowTable, filters: tuple, changed: np.ndarray) -> _FilterEntry:
    """A namespace/kind/time filter's entry after writes to the ``changed`` rows (distinct):
    a new mask (searches may still read the old one) with those rows recomputed."""
    n, old_n = rows.n, entry.n
    mask = np.empty(n, bool)
    mask[:old_n] = True if entry.mask is None else entry.mask
    mask[old_n:] = False  # rows added since are among the changed ones
    before = int(np.count_nonzero(mask[changed]))
    now = rows.mask(*filters[:4], rows=changed)
    mask[changed] = now
    count = entry.count - before + int(np.count_nonzero(now))
    return _FilterEntry(None if count == n else mask, count, n)


def check_finite_query(q: np.ndarray) -> None:
    """Refuse a float32 query vector holding NaN or infinity."""
    # A NaN or infinity makes the sum non-finite (cheaper than isfinite(q).all()); a huge
    # finite vector whose sum overflows gets the full check.
    if not math.isfinite(float(q.sum())) and not np.isfinite(q).all():
        raise ValueError("query vector holds NaN or infinity")


def _probed(padded: list[int]) -> list[int]:
    """The probed clusters of one native result row (best first, padded with -1 to the cap:
    a default search's cap is 5% of the clusters, so the padding is most of the row)."""
    return padded[:padded.index(-1)] if padded and padded[-1] < 0 else padded
