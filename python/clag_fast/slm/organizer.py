"""Organizer: the small language model's decisions about how memory is organised.

Each decision is one prompt plus one answer schema (see :mod:`clag_fast.slm.prompts`). Vectors
decide first and the SLM is asked only where vectors are unsure, so most memories cost no SLM
call. Any SLM failure or unusable answer (server down, timeout, HTTP error, garbage, an id that
was not offered, empty topic lists) degrades to the vector decision: the error is counted in
:attr:`Organizer.errors`, logged once per kind at WARNING (then at DEBUG), and never raised.

The organiser holds no store state: the caller passes cluster briefs and similarity scores in
and applies the decisions it gets back. That keeps it testable with a fake server and lets the
store call it without holding its own lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from clag_fast._deprecated import renamed_fields
from clag_fast.config import SLMConfig
from clag_fast.slm import prompts
from clag_fast.labels import keyphrases
from clag_fast.labels.profiles import BAD_TAGS as _BAD_TAGS
from clag_fast.labels.profiles import STOPWORDS as _STOPWORDS
from clag_fast.labels.profiles import TAG_WORD_RE as _WORD_RE
from clag_fast.slm.client import LLMClient, LLMError, is_transient

log = logging.getLogger(__name__)

__all__ = ["Organizer", "OrganizerConfig", "ClusterBrief", "Profile", "ProfileBatch", "Route", "Evolution"]


# The organiser's knobs live in one place, ``clag_fast.config.SLMConfig``; this name stays for
# code written against the organiser alone.
OrganizerConfig = SLMConfig


@dataclass
class ClusterBrief:
    """What the SLM is shown about a cluster: its profile, a few member texts, its size."""

    id: int
    summary: str = ""
    tags: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    size: int = 0
    candidates: list[str] = field(default_factory=list)  # ranked keyphrases (labels/keyphrases)
    # The candidates the SLM may pick from (None: the first ``profile_candidates``); the tags
    # still come from all candidates.
    choices: list[str] | None = None


@dataclass
class Profile:
    """A cluster's description: a label of keyphrases ("Kyoto hotel · kitchen") and tags
    (the next keyphrases)."""

    summary: str
    tags: list[str]


@dataclass
class ProfileBatch:
    """Outcome of :meth:`Organizer.profile_batch`: the profiles written, and the clusters
    worth asking again soon: the server failed transiently (unreachable, timeout, HTTP 408 /
    429 / 5xx) on their call or an earlier one of the batch. An unusable answer, or a
    permanent error (another 4xx, a client's own exception), is not retried."""

    profiles: dict[int, Profile]
    retry: set[int]


@dataclass
class Route:
    """Where a memory goes. ``cluster_id`` None means "open a new cluster".

    ``by``: "vector" (clear vector choice, or no SLM), "slm" (the SLM picked among the
    candidates), "new" (nothing related: new cluster), "fallback" (the SLM was asked but
    failed or answered outside the candidates: vector choice).
    """

    cluster_id: int | None
    by: str


@dataclass
class Evolution:
    """Localized evolution of one new memory: neighbour ids to link, tags for the memory."""

    links: list[int]
    tags: list[str]


def _picks(raw: Any, candidates: Sequence[str]) -> list[str]:
    """The offered phrases in an SLM's answer list, in its order, repeats dropped (llama.cpp's
    grammar does not enforce ``uniqueItems``); anything not offered is ignored, which only a
    client that skips schema validation can return."""
    if not isinstance(raw, list):
        return []
    offered = set(candidates)
    out: list[str] = []
    for p in raw:
        if isinstance(p, str) and p in offered and p not in out:
            out.append(p)
    return out


def topic_candidates(task_context: str | None, samples: Sequence[str], limit: int = 16) -> list[str]:
    """Phrases the SLM may pick topics from: the topic phrases (``keyphrases.topic_phrase``; not
    "April", "plan") of the task context (first, they say what the memories are for), then those
    at least two sampled memories share, best first."""
    out: list[str] = []
    seen: set[str] = set()
    task = keyphrases.rank([keyphrases.extract(task_context)]).phrases(6) if task_context else []
    shared = keyphrases.rank([keyphrases.extract(s) for s in samples]).phrases() if len(samples) >= 2 else []
    for p in task + shared:
        if p.casefold() not in seen and keyphrases.topic_phrase(p):
            seen.add(p.casefold())
            out.append(p)
    return out[:limit]


def _clean_tag(tag: Any) -> str | None:
    words = _WORD_RE.findall(str(tag).lower().replace("_", " "))
    for w in words:
        if len(w) >= 2 and w not in _BAD_TAGS and w not in _STOPWORDS:
            return w[:24]
    return None


@renamed_fields(llm="slm")
class Organizer:
    """The SLM's decisions on memory organisation, with vector fallbacks.

    Args:
        slm: an :class:`~clag_fast.slm.client.LLMClient`, or None for vector-only decisions
          (``llm`` is its deprecated spelling).
        config: thresholds (:class:`~clag_fast.config.SLMConfig`); default ``SLMConfig()``.
        labels: templated labels mode: memories never open a new cluster.

    Thread-safe: decisions may be taken from a background worker while the store searches.
    """

    def __init__(self, slm: LLMClient | None, config: SLMConfig | None = None,
                 labels: Sequence[str] | None = None):
        self.slm = slm
        self.config = config if config is not None else SLMConfig()
        self.labels = list(labels) if labels else None
        # A fixed label set (templated labels mode): every memory goes under one of the
        # labels, none opens a new cluster.
        self.new_cluster_threshold = None if self.labels else self.config.new_cluster_threshold
        self._lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._decisions: Counter[str] = Counter()
        self._diagnostics: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"Organizer(slm={self.slm!r}, errors={self.errors})"

    # ------------------------------------------------------------------ bookkeeping

    @property
    def errors(self) -> int:
        """SLM failures and unusable answers so far (each fell back to vectors)."""
        with self._lock:
            return sum(self._errors.values())

    def stats(self) -> dict[str, Any]:
        """Counts of decisions by kind ("route_vector", "route_slm", ...), errors by kind, and
        diagnostics ("route_slm_agrees": SLM routes that equal the vectors' first choice, a
        subset of "route_slm")."""
        with self._lock:
            return {
                "errors": sum(self._errors.values()),
                "errors_by_kind": dict(self._errors),
                "decisions": dict(self._decisions),
                "diagnostics": dict(self._diagnostics),
            }

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._decisions[key] += n

    def _fail(self, decision: str, err: BaseException | str) -> None:
        """Count an error; the first of each kind is a WARNING, repeats are DEBUG."""
        kind = f"{decision}:{type(err).__name__ if isinstance(err, BaseException) else 'invalid'}"
        with self._lock:
            first = self._errors[kind] == 0
            self._errors[kind] += 1
        msg = "SLM %s failed, using the vector decision (%s); further failures of this kind are logged at DEBUG"
        if first:
            log.warning(msg, decision, err)
        else:
            log.debug("SLM %s failed again: %s", decision, err)

    def _ask(self, decision: str, system: str, user: str, schema: dict, max_tokens: int) -> dict | None:
        """One SLM call; None (error counted) when it fails."""
        return self._ask_result(decision, system, user, schema, max_tokens)[0]

    def _ask_result(self, decision: str, system: str, user: str, schema: dict,
                    max_tokens: int) -> tuple[dict | None, Exception | None]:
        """One SLM call: (answer, None), or (None, the error, counted)."""
        if self.slm is None:
            return None, None
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        try:
            return self.slm.chat_json(messages, schema, max_tokens=max_tokens), None
        except Exception as e:  # a user-supplied client may raise anything; never propagate
            self._fail(decision, e)
            return None, e

    # ------------------------------------------------------------------ routing

    def _slm_options(self, scores: Sequence[float]) -> list[int]:
        """Indices (into the candidate list, best first) worth offering to the SLM."""
        cfg = self.config
        if not scores:
            return []
        best = scores[0]
        thr = self.new_cluster_threshold if self.new_cluster_threshold is not None else float("-inf")
        out = [i for i, s in enumerate(scores) if s >= best - cfg.slm_window and s >= thr]
        return out[: cfg.slm_max_options]

    def vector_route(self, scores: Sequence[float]) -> str:
        """The vector-only verdict for candidates with these scores (sorted best first):
        "new" (open a cluster), "clear" (take the best), or "ambiguous" (the SLM may pick)."""
        cfg = self.config
        if len(scores) == 0:
            return "new"
        best = float(scores[0])
        if self.new_cluster_threshold is not None and best < self.new_cluster_threshold:
            return "new"
        second = float(scores[1]) if len(scores) > 1 else float("-inf")
        if best >= cfg.assign_threshold and best - second >= cfg.assign_margin:
            return "clear"
        if len(self._slm_options(list(map(float, scores)))) < 2:
            return "clear"
        return "ambiguous"

    def ambiguous(self, scores: "np.ndarray") -> "np.ndarray":
        """``vector_route(row) == "ambiguous"`` for every row of an (n, K) score matrix
        (sorted best first; -inf where a row has fewer candidates), without a Python loop."""
        import numpy as np

        cfg = self.config
        s = np.asarray(scores, dtype=np.float64)
        if s.ndim != 2 or s.shape[1] == 0:
            return np.zeros(len(s), bool)
        best = s[:, 0]
        second = s[:, 1] if s.shape[1] > 1 else np.full(len(s), -np.inf)
        thr = -np.inf if self.new_cluster_threshold is None else self.new_cluster_threshold
        opens = best < thr
        clear = (best >= cfg.assign_threshold) & (best - second >= cfg.assign_margin)
        options = (s >= np.maximum(best - cfg.slm_window, thr)[:, None]).sum(axis=1)
        return np.isfinite(best) & ~opens & ~clear & (options >= 2)

    def needs_slm(self, scores: Sequence[float]) -> bool:
        """True when these candidate scores (best first) leave the choice to the SLM."""
        return self.slm is not None and self.vector_route(scores) == "ambiguous"

    def route(self, items: Sequence[tuple[str, Sequence[ClusterBrief], Sequence[float]]]) -> list[Route]:
        """Route new memories: ``items`` are (text, candidate briefs, their similarities).

        Candidates may come in any order; they are sorted by similarity. Clear cases and
        new clusters are decided by vectors; ambiguous ones go to the SLM ``route_batch`` at
        a time, which must answer one of the offered candidates for each (else: fallback to
        the nearest).
        """
        out: list[Route | None] = [None] * len(items)
        ambiguous: list[tuple[int, str, list[ClusterBrief], list[float]]] = []
        for i, item in enumerate(items):
            text, cands, scores = item
            if len(cands) != len(scores):
                raise ValueError(f"route item {i}: {len(cands)} candidates but {len(scores)} scores")
            order = sorted(range(len(cands)), key=lambda j: -float(scores[j]))
            cands = [cands[j] for j in order][: self.config.route_candidates]
            scores = [float(scores[j]) for j in order][: self.config.route_candidates]
            verdict = self.vector_route(scores)
            if verdict == "new":
                out[i] = Route(None, "new")
                self._count("route_new")
            elif verdict == "clear" or self.slm is None:
                out[i] = Route(cands[0].id, "vector")
                self._count("route_vector")
            else:
                ambiguous.append((i, text, cands, scores))
        step = self.config.route_batch
        for b in range(0, len(ambiguous), step):
            batch = ambiguous[b : b + step]
            for (i, _, _, _), route in zip(batch, self._route_batch(batch)):
                out[i] = route
        return [r for r in out if r is not None]

    def _route_batch(self, batch: list[tuple[int, str, list[ClusterBrief], list[float]]]) -> list[Route]:
        cfg = self.config
        # Number the union of offered clusters 1..n, in order of first appearance.
        number: dict[int, int] = {}
        briefs: dict[int, ClusterBrief] = {}
        options: list[list[int]] = []
        for _, _, cands, scores in batch:
            opts = []
            for j in self._slm_options(scores):
                c = cands[j]
                if c.id not in number:
                    number[c.id] = len(number) + 1
                    briefs[c.id] = c
                opts.append(number[c.id])
            options.append(opts)
        by_number = {n: cid for cid, n in number.items()}
        # Group lines without their tags: replaying the demo conversation's routing prompts,
        # the SLM chose the same for all 66 notes without them and with notes cut to 80
        # characters, at 18% fewer prompt tokens.
        lines = [
            prompts.group_line(n, briefs[cid].summary, [],
                               briefs[cid].examples[0] if briefs[cid].examples else "",
                               cfg.max_group_chars)
            for cid, n in number.items()
        ]
        notes = [
            prompts.note(text, cfg.route_note_chars, str(k + 1)) + f" (groups {', '.join(map(str, opts))})"
            for k, ((_, text, _, _), opts) in enumerate(zip(batch, options))
        ]
        schema = prompts.route_schema(options)
        answer = self._ask("routing", prompts.ROUTE_SYSTEM, prompts.route_user(lines, notes), schema,
                           max_tokens=6 * len(batch) + 16)
        choices = answer.get("choices") if answer is not None else None
        if not isinstance(choices, list):
            choices = []
        routes = []
        for k, (_, _, cands, _) in enumerate(batch):
            picked = choices[k] if k < len(choices) else None
            if isinstance(picked, int) and picked in options[k]:
                routes.append(Route(by_number[picked], "slm"))
                self._count("route_slm")
                if by_number[picked] == cands[0].id:
                    # How often the SLM agrees with the vectors' first choice: near 100% would
                    # mean the call buys nothing.
                    with self._lock:
                        self._diagnostics["route_slm_agrees"] += 1
            else:
                if answer is not None:
                    # Only reachable with a client that skips validation: count it all the same.
                    self._fail("routing", f"note {k + 1}: {picked!r} is not among {options[k]}")
                routes.append(Route(cands[0].id, "fallback"))
                self._count("route_fallback")
        return routes

    # ------------------------------------------------------------------ topics

    def propose_topics(self, task_context: str | None, samples: Sequence[str]) -> list[str]:
        """``min_topics``..``max_topics`` topics for a sample of memories; [] when the SLM fails.

        The SLM chooses among keyphrases of the task context and of the sample (phrases two
        or more sampled memories share), so every topic is grounded in one or the other; the
        answer schema admits nothing else. Their embeddings become cluster centres. Fewer than
        two distinct topics count as a failure.
        """
        cfg = self.config
        samples = [s for s in samples if str(s).strip()][: cfg.topic_samples]
        if self.slm is None or not samples:
            return []
        candidates = topic_candidates(task_context, samples)
        if len(candidates) < 2:
            self._fail("topics", f"only {len(candidates)} candidate phrase(s) in the task and the sample")
            return []
        notes = [prompts.note(s, cfg.max_note_chars) for s in samples]
        answer = self._ask(
            "topics", prompts.TOPICS_SYSTEM, prompts.topics_user(task_context, notes, 300, candidates),
            prompts.topics_schema(candidates, cfg.min_topics, cfg.max_topics),
            max_tokens=16 * cfg.max_topics + 16,
        )
        if answer is None:
            return []
        topics = _picks(answer.get("categories"), candidates)
        if len(topics) < 2:
            self._fail("topics", f"only {len(topics)} usable topic(s) in {answer.get('categories')!r:.120}")
            return []
        self._count("topics")
        return topics

    # ------------------------------------------------------------------ profiles

    def write_profiles(self, clusters: Sequence[ClusterBrief]) -> dict[int, Profile]:
        """A profile per cluster (one SLM call each) chosen from its ``choices`` (default: its
        ``candidates``): the SLM picks and orders two or three of them as the label, the tags
        are the next candidates. Ids where the SLM failed, or with fewer than two choices
        (nothing to choose), are missing: the caller keeps their vector label.
        """
        return self.profile_batch(clusters).profiles

    def profile_batch(self, clusters: Sequence[ClusterBrief], deadline: float | None = None) -> ProfileBatch:
        """:meth:`write_profiles`, also telling which failures are worth retrying soon.
        ``deadline`` (``time.monotonic()``): clusters not reached by then are returned in
        ``retry`` unasked, so a caller can bound how long one pass blocks."""
        out: dict[int, Profile] = {}
        retry: set[int] = set()
        if self.slm is None:
            return ProfileBatch(out, retry)
        cfg = self.config
        # Clusters with something to choose between; the others keep their vector label.
        todo = []
        for c in clusters:
            examples = [e for e in c.examples if str(e).strip()][: cfg.profile_examples]
            offered = c.candidates if c.choices is None else c.choices
            candidates = list(dict.fromkeys(offered))[: cfg.profile_candidates]
            if examples and len(candidates) >= 2:
                todo.append((c, examples, candidates))
        step = cfg.profile_batch
        for b in range(0, len(todo), step):
            if deadline is not None and time.monotonic() > deadline:
                retry.update(c.id for c, _, _ in todo[b:])
                break
            batch = todo[b:b + step]
            user = prompts.profile_user([([prompts.note(e, cfg.profile_note_chars) for e in ex], cands)
                                         for _, ex, cands in batch])
            self._count("profile_calls")
            answer, err = self._ask_result("profile", prompts.PROFILE_SYSTEM, user,
                                           prompts.profile_schema([cands for _, _, cands in batch]),
                                           max_tokens=40 * len(batch) + 16)
            if err is not None and is_transient(err):
                # The server, not the answer, failed: retry these clusters at the next pass, and
                # do not spend a timeout on each of the others now.
                retry.update(c.id for c, _, _ in todo[b:])
                break
            if not isinstance(answer, dict):  # failed, or a user client that skips validation
                continue
            lists = answer.get("groups")
            lists = lists if isinstance(lists, list) else []
            for k, (c, _, cands) in enumerate(batch):
                picked = _picks(lists[k] if k < len(lists) else None, cands)
                if not picked:
                    self._fail("profile", f"cluster {c.id}: no offered phrase in {lists[k] if k < len(lists) else None!r:.80}")
                    continue
                summary, tags = keyphrases.label(c.candidates, picked)
                out[c.id] = Profile(summary=summary, tags=tags)
                self._count("profile")
        return ProfileBatch(out, retry)

    def needs_profile_refresh(
        self,
        *,
        has_profile: bool,
        size_at_profile: int,
        members_added: int,
        centre_similarity: float = 1.0,
    ) -> bool:
        """Inertia for profiles: rewrite only a missing profile, or one whose cluster gained
        ``profile_drift_share`` of its members since (relative to the size it had then), or
        whose centre moved below ``profile_centre_similarity`` of where it was."""
        if not has_profile:
            return True
        cfg = self.config
        base = max(1, size_at_profile)
        if members_added / base >= cfg.profile_drift_share:
            return True
        return centre_similarity < cfg.profile_centre_similarity

    # ------------------------------------------------------------------ labels

    def choose_label(self, text: str, labels: Sequence[str], scores: Sequence[float] | None = None) -> int | None:
        """Index of the label ``text`` belongs under (templated labels mode).

        With ``scores`` (similarities of the text to each label's embedding) a clear vector
        winner is taken without a call; otherwise the SLM picks. Without an SLM, or when it
        fails, the best-scoring label; None when there are neither scores nor an SLM answer.
        """
        labels = list(labels)
        if not labels:
            raise ValueError("choose_label needs at least one label")
        if scores is not None and len(scores) != len(labels):
            raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
        best = max(range(len(labels)), key=lambda i: scores[i]) if scores is not None else None
        if scores is not None and (self.slm is None or self.vector_route(sorted(map(float, scores), reverse=True)) != "ambiguous"):
            self._count("label_vector")
            return best
        if self.slm is None:
            return None
        cfg = self.config
        lines = "\n".join(f"Label {i + 1}: {prompts.clip(l, 80)}" for i, l in enumerate(labels))
        user = f"Labels:\n{lines}\n\n{prompts.note(text, cfg.max_note_chars)}"
        answer = self._ask("label", prompts.LABEL_SYSTEM, user, prompts.label_schema(len(labels)), max_tokens=16)
        n = answer.get("label") if answer is not None else None
        if isinstance(n, int) and 1 <= n <= len(labels):
            self._count("label_slm")
            return n - 1
        if answer is not None:
            self._fail("label", f"{n!r} is not a label number 1..{len(labels)}")
        return best

    # ------------------------------------------------------------------ query-time selection

    def select_clusters(self, query: str, candidates: Sequence[ClusterBrief]) -> list[int]:
        """Cluster ids a query should search, from ``candidates`` (best vector match first).

        Default (``slm_select_clusters`` off, or no SLM, or it fails): all candidates, i.e.
        the vector choice, with no SLM call. With it on, the SLM's picks first; the vector
        order is kept for ties and the best vector candidate is always included so a weak
        SLM cannot make recall collapse.
        """
        ids = [c.id for c in candidates]
        if not self.config.select_clusters or self.slm is None or len(ids) <= 1:
            return ids
        lines = [
            prompts.group_line(i + 1, c.summary, c.tags, c.examples[0] if c.examples else "",
                               self.config.max_group_chars)
            for i, c in enumerate(candidates)
        ]
        user = "Groups:\n" + "\n".join(lines) + f"\n\nQuestion: {prompts.note(query, self.config.max_note_chars)}"
        answer = self._ask("select", prompts.SELECT_SYSTEM, user, prompts.select_schema(len(ids)),
                           max_tokens=8 * len(ids) + 16)
        if answer is None:
            return ids
        picked: list[int] = []
        for n in answer.get("groups", []):
            # Re-checked although the schema enforces it: a user-supplied client may not validate.
            if isinstance(n, int) and 1 <= n <= len(ids) and ids[n - 1] not in picked:
                picked.append(ids[n - 1])
        if ids[0] not in picked:
            picked.append(ids[0])
        self._count("select_slm")
        return picked

    # ------------------------------------------------------------------ updates

    def judge_update(self, older: str, newer: str) -> bool | None:
        """Whether ``newer`` updates a fact ``older`` states (a constrained yes/no). None when
        judging is off, there is no SLM, or the SLM failed or answered out of its schema: the
        caller then changes nothing."""
        if not self.config.updates or self.slm is None:
            return None
        cfg = self.config
        user = (f"Older note: {prompts.note(older, cfg.max_note_chars)}\n"
                f"Newer note: {prompts.note(newer, cfg.max_note_chars)}\n"
                "Does the newer note change or correct a fact of the older note?")
        answer = self._ask("update", prompts.UPDATE_SYSTEM, user, prompts.update_schema(), max_tokens=12)
        verdict = None if answer is None else answer.get("updates")
        if verdict not in ("yes", "no"):
            return None
        self._count("update_yes" if verdict == "yes" else "update_no")
        return verdict == "yes"

    # ------------------------------------------------------------------ evolution

    def evolve(self, text: str, neighbours: Sequence[tuple[int, str]]) -> Evolution | None:
        """Localized evolution (paper, optional): which ``neighbours`` (memory id, text) of a
        new memory in its cluster it should link to, and tags for it.

        None when evolution is off, there is no SLM, no neighbours, or the SLM failed: the
        caller then changes nothing.
        """
        if not self.config.evolution or self.slm is None or not neighbours:
            return None
        cfg = self.config
        neighbours = list(neighbours)[:5]
        older = "\n".join(prompts.note(t, 150, str(i + 1)) for i, (_, t) in enumerate(neighbours))
        user = f"Older notes:\n{older}\n\nNew note: {prompts.note(text, cfg.max_note_chars)}"
        answer = self._ask("evolution", prompts.EVOLVE_SYSTEM, user, prompts.evolve_schema(len(neighbours)),
                           max_tokens=60)
        if answer is None:
            return None
        links: list[int] = []
        for n in answer.get("links", []):
            if isinstance(n, int) and 1 <= n <= len(neighbours) and neighbours[n - 1][0] not in links:
                links.append(neighbours[n - 1][0])
        tags: list[str] = []
        for t in answer.get("tags", []):
            w = _clean_tag(t)
            if w and w not in tags:
                tags.append(w)
        self._count("evolution")
        return Evolution(links=links, tags=tags[:3])
