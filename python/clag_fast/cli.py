"""The ``clag-fast`` command: demo, ingest, search, clusters, stats, export, import, topic, serve, mcp, eval."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Sequence

from clag_fast._deprecated import renamed_option

#: Hits shown per demo question: what an agent would put in its prompt.
DEMO_K = 3
DEMO_CONTEXT = "an agent planning a two-week trip to Japan for a user and their partner"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        print(f"clag-fast {args.command}: error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clag-fast", description="Adaptive clustered memory for SLM agents.")
    sub = p.add_subparsers(dest="command")
    _store_commands(sub)
    _data_commands(sub)
    _service_commands(sub)
    try:
        from clag_fast.eval.runner import add_eval_parser
    except ImportError:  # the evaluation needs optional extras; the rest of the CLI does not
        pass
    else:
        add_eval_parser(sub)
    return p


def _store_opts(sp: argparse.ArgumentParser, default: str | None = "clag_store") -> None:
    sp.add_argument("--store", default=default, help=f"store directory (default: {default})")
    sp.add_argument("--slm", default=None,
                    help="SLM server base URL; 'managed' (default) starts SmolLM2 when installed; 'off'")
    renamed_option(sp, "--llm", "--slm")


def _store_commands(sub: Any) -> None:
    """demo, ingest, search, clusters, stats: the commands that open a store in-process."""
    store_opts = _store_opts
    d = sub.add_parser("demo", help="ingest the bundled trip-planning conversation, organise, query")
    d.add_argument("--plot", metavar="FILE.png", default=None,
                   help="where to draw the cluster map (default: ./clag_fast_demo_clusters.png)")
    store_opts(d, default=None)
    d.set_defaults(func=cmd_demo)

    i = sub.add_parser("ingest", help="add memories from a JSON/JSONL file (texts or LoCoMo format)")
    i.add_argument("file")
    i.add_argument("--namespace", default="default")
    i.add_argument("--organize", action="store_true", help="organise after ingesting")
    store_opts(i)
    _ray_opts(i)
    i.add_argument("--key-column", default=None, help="with --ray: the column with each row's unique key")
    i.add_argument("--namespace-column", default=None, help="with --ray: the column with each row's namespace")
    i.add_argument("--embedders", type=int, default=1, help="with --ray: embedding actors")
    i.set_defaults(func=cmd_ingest)

    s = sub.add_parser("search", help="search the store")
    s.add_argument("query")
    s.add_argument("-k", type=int, default=5)
    s.add_argument("--namespace", default=None)
    s.add_argument("--mode", choices=["two_stage", "flat"], default="two_stage")
    s.add_argument("--n-probe", type=int, default=None)
    s.add_argument("--json", action="store_true", help="print hits as JSON")
    store_opts(s)
    s.set_defaults(func=cmd_search)

    c = sub.add_parser("clusters", help="list clusters with their profiles")
    c.add_argument("--plot", metavar="FILE.png", default=None,
                   help="also draw the cluster map (centres in 2-D, sized by members, labelled)")
    c.add_argument("--quality", action="store_true",
                   help="also measure the labels: copy rate, groundedness, self@1 (embeds each label)")
    store_opts(c)
    c.set_defaults(func=cmd_clusters)

    st = sub.add_parser("stats", help="print store statistics")
    store_opts(st)
    st.set_defaults(func=cmd_stats)


def _data_commands(sub: Any) -> None:
    """export, import, topic: data in and out, and operations on one cluster."""
    ex = sub.add_parser("export", help="write the store's memories and clusters to a .jsonl or .parquet file")
    ex.add_argument("out", help="the file to write (.jsonl or .parquet)")
    ex.add_argument("--store", required=True, help="store directory")
    ex.add_argument("--namespace", default=None, help="only the memories of this namespace")
    ex.add_argument("--cluster", type=int, default=None, help="only the members of this cluster (a topic)")
    ex.set_defaults(func=cmd_export)

    im = sub.add_parser("import", help="add the records of an export (or of another store's data) to a store; "
                                       "re-running it skips what is stored")
    im.add_argument("source", help="a .jsonl or .parquet export; with --from: the other store's data")
    im.add_argument("--store", required=True, help="store directory (created when missing)")
    im.add_argument("--from", dest="origin", choices=["export", "chroma", "mem0", "langgraph"], default="export",
                    help="export (default); chroma: SOURCE is a Chroma persistent directory (with --collection); "
                         "mem0: a JSON file of Memory.get_all(); langgraph: a JSON file of items (Item.dict())")
    im.add_argument("--collection", default=None, help="with --from chroma: the collection to read")
    im.add_argument("--namespace", default=None, help="put every record in this namespace")
    im.add_argument("--clusters", choices=["keep", "route"], default="keep",
                    help="keep the export's clusters (default) or route each record by its vector")
    im.add_argument("--no-embedder", action="store_true",
                    help="records must bring vectors (no model is loaded to embed texts)")
    im.set_defaults(func=cmd_import)

    tp = sub.add_parser("topic", help="act on one cluster (a topic): show, forget, move or merge it "
                                      "(export one: clag-fast export --cluster ID)")
    tsub = tp.add_subparsers(dest="action", required=True)
    t_show = tsub.add_parser("show", help="the cluster's profile and members")
    t_show.add_argument("cluster", type=int)
    t_show.add_argument("--limit", type=int, default=20, help="members shown (default 20)")
    t_forget = tsub.add_parser("forget", help="archive (or --delete) every member of the cluster")
    t_forget.add_argument("cluster", type=int)
    t_forget.add_argument("--delete", action="store_true", help="delete the members instead of archiving them")
    t_move = tsub.add_parser("move", help="move the cluster's members to another cluster")
    t_move.add_argument("cluster", type=int)
    t_move.add_argument("--to", type=int, required=True, help="the cluster that receives them")
    t_merge = tsub.add_parser("merge", help="merge cluster OTHER into cluster KEEP (which keeps its profile)")
    t_merge.add_argument("cluster", type=int, metavar="KEEP")
    t_merge.add_argument("other", type=int, metavar="OTHER")
    for sp in (t_show, t_forget, t_move, t_merge):
        sp.add_argument("--store", required=True, help="store directory")
        if sp is not t_merge:
            sp.add_argument("--namespace", default=None, help="only the members of this namespace")
    tp.set_defaults(func=cmd_topic)


def _service_commands(sub: Any) -> None:
    """serve and mcp: the store behind HTTP or MCP."""
    sv = sub.add_parser("serve", help="run the store as an HTTP service (JSON API under /v1)")
    sv.add_argument("--store", required=True, help="store directory (created when missing)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (non-loopback needs --keys)")
    sv.add_argument("--port", type=int, default=8420)
    sv.add_argument("--keys", default=None, help="keys file (TOML): API keys and the namespaces each may use")
    sv.add_argument("--embed-cache", type=int, default=4096, metavar="N",
                    help="vectors of recent texts kept, so a repeated query is not embedded again (0: none)")
    _service_store_opts(sv)
    _ray_opts(sv)
    sv.set_defaults(func=cmd_serve)

    m = sub.add_parser("mcp", help="serve one namespace of the store as MCP tools (stdio, or --http)")
    m.add_argument("--store", required=True, help="store directory (created when missing)")
    m.add_argument("--namespace", default="default", help="the one namespace the tools read and write")
    m.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    m.add_argument("--host", default="127.0.0.1", help="with --http: address (loopback only)")
    m.add_argument("--port", type=int, default=8421, help="with --http: port")
    _service_store_opts(m)
    m.set_defaults(func=cmd_mcp)


# -- commands ---------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from clag_fast.locomo import conversation, load_dataset

    data_path = resources.files("clag_fast") / "data" / "demo_trip.json"
    with resources.as_file(data_path) as p:
        sample = load_dataset(p)[0]
    with _store_dir(args.store) as path:
        store = _open(path, args.slm, must_exist=False)
        with store:
            print(f"clag-fast demo: store {path}")
            print(f"SLM: {store.stats()['slm']}")
            clock = _DemoClock(store)
            texts = [t.memory_text() for t in sample.turns]
            meta = [t.metadata() for t in sample.turns]
            kinds = [t.kind for t in sample.turns]
            # Not flushed before organize(): a flush would have the SLM label the ingest's
            # young clusters, most of which the task's topics then change.
            _add_with_progress(store, texts, kinds, meta, "default", conversation(sample.turns), flush=False)
            ingest = clock.lap()
            print(f"ingested {len(texts)} turns in {ingest[0]:.1f} s")
            report = store.organize(task_context=DEMO_CONTEXT)
            # The SLM work still queued and the profiles organize() left to the background are
            # shown below: waited for.
            store.flush()
            organise = clock.lap()
            print(f"organised in {organise[0]:.1f} s: {_short_report(report)}")
            print()
            _print_clusters(store)
            answered = sum(_ask_demo(store, sample, q) for q in sample.qa)
            searches = clock.lap()
            print(f"\nthe turns holding the answer are in the top {DEMO_K} for {answered} of {len(sample.qa)} "
                  "questions (marked *)")
            print()
            stats = store.stats()
            _print_stats(stats)
            _print_label_quality(store.label_quality())
            print(f"demo timings: ingest {ingest[0]:.1f} s (SLM calls meanwhile {ingest[1]:.1f} s), organise and the "
                  f"SLM's remaining work {organise[0]:.1f} s (SLM calls {organise[1]:.1f} s), {len(sample.qa)} searches "
                  f"with their output {searches[0]:.2f} s; total {clock.total():.1f} s")
            plot = Path(args.plot) if args.plot else Path.cwd() / "clag_fast_demo_clusters.png"
            _plot(store, plot)
    return 0


class _DemoClock:
    """The demo's stages, each timed with the time its SLM calls took (the client's latency,
    which the background worker's calls add to while the stage waits for them)."""

    def __init__(self, store) -> None:
        self._store = store
        self._start = self._at = time.perf_counter()
        self._slm = self._slm_s()

    def _slm_s(self) -> float:
        return float(self._store.stats().get("slm_usage", {}).get("latency_s", 0.0))

    def lap(self) -> tuple[float, float]:
        """(seconds, SLM seconds) since the last lap."""
        now, slm = time.perf_counter(), self._slm_s()
        out = (now - self._at, slm - self._slm)
        self._at, self._slm = now, slm
        return out

    def total(self) -> float:
        return time.perf_counter() - self._start


def _ask_demo(store, sample, q) -> bool:
    """Search one of the demo's questions and print its hits, marking those that hold the
    answer (its evidence turns); whether any does."""
    evidence = sample.resolve_evidence(q)
    print(f"\n? {q.question}")
    hits = store.search(q.question, k=DEMO_K)
    found = False
    for h in hits:
        holds = (h.metadata or {}).get("dia_id") in evidence
        found |= holds
        label = h.cluster_summary or "(unlabelled)"
        tags = ", ".join(h.cluster_tags)
        print(f"  {'*' if holds else ' '} {h.score:.3f}  [{h.cluster_id}: {_clip(label, 60)} | {tags}]")
        print(f"           {_clip(h.text, 110)}")
    print(f"  (scanned {hits.scanned} of {hits.candidates} memories, {hits.latency_s * 1000:.1f} ms)")
    return found


def cmd_ingest(args: argparse.Namespace) -> int:
    if args.ray is not None:
        return _ingest_ray(args)
    texts, kinds, meta = _read_ingest_file(Path(args.file))
    with _open(Path(args.store), args.slm, must_exist=False) as store:
        _add_with_progress(store, texts, kinds, meta, args.namespace)
        print(f"added {len(texts)} memories to {args.store} ({len(store)} in total)")
        if args.organize:
            print(_short_report(store.organize()))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    with _open(Path(args.store), args.slm) as store:
        hits = store.search(args.query, k=args.k, namespace=args.namespace, mode=args.mode, n_probe=args.n_probe)
        if args.json:
            print(json.dumps([_hit_dict(h) for h in hits], ensure_ascii=False, indent=2))
            return 0
        for h in hits:
            print(f"{h.score:.3f}  #{h.memory_id}  [{h.cluster_id}: {_clip(h.cluster_summary, 50)}]  {_clip(h.text, 100)}")
        print(f"({hits.mode}: scanned {hits.scanned} of {hits.candidates}, {hits.latency_s * 1000:.1f} ms)")
    return 0


def cmd_clusters(args: argparse.Namespace) -> int:
    with _open(Path(args.store), "off") as store:
        _print_clusters(store)
        if args.quality:
            _print_label_quality(store.label_quality())
        if args.plot:
            _plot(store, Path(args.plot))
    return 0


def _plot(store, path: Path) -> None:
    from clag_fast.cluster_map import plot_cluster_map

    if path.suffix.lower() != ".png":
        raise ValueError(f"--plot writes a PNG file; {path} does not end in .png")
    n = plot_cluster_map(store, path)
    print(f"cluster map ({n} clusters) written to {path}")


def _print_label_quality(q: dict[str, Any]) -> None:
    line = (f"labels: {q['clusters']} clusters of 2+ members, copies {q['copies']} "
            f"({q['copy_rate']:.2f}), grounded {q['grounded']:.2f}")
    if "self_at_1" in q:
        line += f", self@1 {q['self_at_1']:.2f}"
    if "generic" in q:
        line += f", generic {q['generic']} ({q['generic_rate']:.2f})"
    print(line + f", neutral {q['neutral']}")


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(Path(args.store), "off") as store:
        print(json.dumps(store.stats(), indent=2, default=str))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from clag_fast.store import MemoryStore

    path = Path(args.store)
    if not (path / "memories.db").exists():
        raise FileNotFoundError(f"no store at {path}")
    with MemoryStore.open(path, embedder=False, slm=False) as store, _bar("export") as bar:
        report = store.export(args.out, namespace=args.namespace, cluster=args.cluster, progress=bar)
    print(f"exported {report['memories']} memories and {report['clusters']} clusters to {args.out} "
          f"in {report['seconds']:.1f} s")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from clag_fast.config import StoreConfig
    from clag_fast.store import MemoryStore, transfer

    source: Any = args.source
    if args.origin == "chroma":
        if not args.collection:
            raise ValueError("--from chroma needs --collection NAME")
        import chromadb

        source = transfer.from_chroma(chromadb.PersistentClient(path=args.source).get_collection(args.collection),
                                      namespace=args.namespace or "default")
    elif args.origin == "mem0":
        source = transfer.from_mem0(Path(args.source), namespace=args.namespace or "mem0")
    elif args.origin == "langgraph":
        source = transfer.from_langgraph(Path(args.source))
    embedder: Any = False if args.no_embedder else None
    with MemoryStore.open(Path(args.store), config=StoreConfig(slm="off"), embedder=embedder, slm=False) as store, \
            _bar("import") as bar:
        report = store.import_(source, namespace=args.namespace, clusters=args.clusters, progress=bar)
        total = len(store)
    print(f"read {report['read']} records: imported {report['imported']}, {report['skipped']} already stored, "
          f"{report['clusters']} clusters, in {report['seconds']:.1f} s ({total} memories in {args.store})")
    return 0


def cmd_topic(args: argparse.Namespace) -> int:
    from clag_fast.config import StoreConfig
    from clag_fast.store import MemoryStore

    path = Path(args.store)
    if not (path / "memories.db").exists():
        raise FileNotFoundError(f"no store at {path}")
    # No embedder: nothing here embeds, and embedder=False opens a store made with any.
    with MemoryStore.open(path, config=StoreConfig(slm="off"), embedder=False, slm=False) as store:
        if args.action == "show":
            page = store.cluster(args.cluster, namespace=args.namespace, limit=args.limit)
            c = page.info
            print(f"cluster {c.id} ({c.size} members, {c.source}): {c.summary or '(no profile yet)'} | {', '.join(c.tags)}")
            for m in page.members:
                print(f"  #{m.memory_id}  [{m.namespace}]  {_clip(m.text, 100)}")
            if page.next_cursor:
                print(f"  ... (more: --limit {args.limit * 2})")
        elif args.action == "forget":
            n = store.forget_cluster(args.cluster, action="delete" if args.delete else "archive",
                                     namespace=args.namespace)
            print(f"{'deleted' if args.delete else 'archived'} {n} memories of cluster {args.cluster}")
        elif args.action == "move":
            n = store.move_cluster(args.cluster, args.to, namespace=args.namespace)
            print(f"moved {n} memories from cluster {args.cluster} to cluster {args.to}")
        else:
            n = store.merge_clusters(args.cluster, args.other)
            print(f"merged cluster {args.other} into cluster {args.cluster} ({n} members joined)")
    return 0


class _bar:
    """A tqdm progress bar on stderr as a ``progress(done, total)`` callback."""

    def __init__(self, what: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(unit="mem", desc=what, file=sys.stderr, disable=None, unit_scale=True)

    def __call__(self, done: int, total: int | None) -> None:
        if total is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()
        self._bar.update(done - self._bar.n)

    def __enter__(self) -> "_bar":
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()


def _service_store_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--slm", default="off",
                    help="SLM organiser: 'off' (default: vector-only), 'managed' (SmolLM2 when installed) or a URL")
    renamed_option(sp, "--llm", "--slm")
    sp.add_argument("--no-embedder", action="store_true",
                    help="bring-your-own-vector store: text adds and text queries are refused")
    sp.add_argument("--dim", type=int, default=None, help="vector width of a new store (default: the embedder's, 384; without one, the first vectors')")
    sp.add_argument("--fsync", action="store_true", help="sync to disk on every write batch (power-loss safety)")


def cmd_serve(args: argparse.Namespace) -> int:
    from clag_fast.server import ServeConfig, serve

    if args.ray is not None:
        from clag_fast.distributed.frontdoor import run

        if args.embed_cache != ServeConfig.embed_cache:
            raise ValueError("--embed-cache is not passed to the Ray shard owners (they keep the default): "
                             "leave it out with --ray")
        run(ServeConfig(store=Path(args.store), host=args.host, port=args.port,
                        keys=Path(args.keys) if args.keys else None, slm=args.slm, embedder=not args.no_embedder,
                        dim=args.dim), address=args.ray, shards=_ray_shards(args), replicas=args.replicas, blocking=True)
        return 0
    serve(ServeConfig(store=Path(args.store), host=args.host, port=args.port,
                      keys=Path(args.keys) if args.keys else None, slm=args.slm,
                      embedder=not args.no_embedder, dim=args.dim, fsync=args.fsync,
                      embed_cache=args.embed_cache))
    return 0


def _ray_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ray", metavar="ADDRESS", default=None,
                    help="run on a Ray cluster ('auto': the local one): --store is then a sharded store's root")
    sp.add_argument("--shards", type=int, default=None, help="with --ray: shards of a new sharded store (default 4)")
    sp.add_argument("--replicas", type=int, default=1,
                    help="with --ray (serve): front door replicas, each answering on its own port "
                         "(PORT, PORT+1, ...; put a load balancer in front of several)")


def _ray_shards(args: argparse.Namespace) -> int | None:
    """--shards, or 4 for a new sharded store (an existing one keeps its own)."""
    if args.shards is not None:
        return args.shards
    return None if (Path(args.store) / "cluster.json").exists() else 4


def _ingest_ray(args: argparse.Namespace) -> int:
    import ray

    from clag_fast.distributed import ingest

    if not ray.is_initialized():
        ray.init(address=args.ray, namespace="clag_fast", log_to_driver=False)
    report = ingest(args.file, args.store, shards=_ray_shards(args), namespace=args.namespace, key_column=args.key_column,
                    namespace_column=args.namespace_column, embedders=args.embedders)
    print(f"read {report.rows} rows: added {report.added}, {report.skipped} already stored "
          f"({report.rate:.0f} rows/s) into {args.store}")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from clag_fast.server.mcp_tools import run_mcp

    run_mcp(Path(args.store), args.namespace, http=args.http, host=args.host, port=args.port, slm=args.slm,
            embedder=not args.no_embedder, dim=args.dim)
    return 0


# -- helpers ----------------------------------------------------------------------------------
def _open(path: Path, slm: str | None, must_exist: bool = True):
    from clag_fast.config import StoreConfig
    from clag_fast.store import MemoryStore

    if must_exist and not (path / "memories.db").exists():
        raise FileNotFoundError(f"no store at {path} (create one with `clag-fast ingest FILE --store {path}`)")
    if slm in (None, "managed"):
        return MemoryStore.open(path)
    if slm == "off":
        return MemoryStore.open(path, slm=False, config=StoreConfig(slm="off"))
    return MemoryStore.open(path, slm=slm)


class _store_dir:
    """The given store directory, or a temporary one removed afterwards."""

    def __init__(self, path: str | None) -> None:
        self._tmp = None if path else tempfile.TemporaryDirectory(prefix="clag-fast-demo-")
        self.path = Path(path) if path else Path(self._tmp.name) / "store"

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _add_with_progress(store, texts, kinds, meta, namespace, turns: dict | None = None, batch: int = 32,
                       flush: bool = True) -> None:
    """Add in batches with a progress bar, then ``flush()`` (unless ``flush`` is off);
    ``turns``: ``add_many``'s per-item conversation arguments (threads, speakers), or None."""
    from tqdm import tqdm

    with tqdm(total=len(texts), unit="mem", desc="ingest", file=sys.stderr, disable=None) as bar:
        for start in range(0, len(texts), batch):
            end = start + batch
            store.add_many(texts[start:end], kinds=kinds[start:end], namespaces=namespace,
                           metadata=meta[start:end], **{k: v[start:end] for k, v in (turns or {}).items()})
            bar.update(len(texts[start:end]))
    if flush:
        store.flush()


def _read_ingest_file(path: Path) -> tuple[list[str], list[str], list[dict | None]]:
    """JSON list of strings / {"text", "kind", "metadata"} objects, JSONL of the same, or a
    LoCoMo-format dataset (every turn of every sample)."""
    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in raw.splitlines() if line.strip()]
    if isinstance(data, list) and data and isinstance(data[0], dict) and "conversation" in data[0]:
        from clag_fast.locomo import parse_samples

        turns = [t for s in parse_samples(data) for t in s.turns]
        return ([t.memory_text() for t in turns], [t.kind for t in turns],
                [t.metadata() for t in turns])
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list (or JSONL) of texts or objects")
    texts, kinds, meta = [], [], []
    for i, item in enumerate(data):
        if isinstance(item, str):
            texts.append(item)
            kinds.append("user_input")
            meta.append(None)
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            texts.append(item["text"])
            kinds.append(str(item.get("kind", "user_input")))
            meta.append(item.get("metadata"))
        else:
            raise ValueError(f"{path}: item {i} is neither a string nor an object with a 'text' string")
    return texts, kinds, meta


def _print_clusters(store) -> None:
    clusters = store.clusters()
    print(f"{len(clusters)} clusters")
    print(f"{'id':>4}  {'size':>4}  {'source':<9}  summary | tags")
    for c in clusters:
        print(f"{c.id:>4}  {c.size:>4}  {c.source:<9}  {_clip(c.summary or '(no profile yet)', 70)} | {', '.join(c.tags)}")


def _print_stats(stats: dict[str, Any]) -> None:
    usage = stats.get("slm_usage", {})
    print(f"memories {stats['memories']}, clusters {stats['clusters']} "
          f"(sizes min {stats['cluster_size']['min']}, median {stats['cluster_size']['median']}, max {stats['cluster_size']['max']})")
    print(f"routing: {stats['routing']}")
    n = max(1, stats["memories"])
    print(f"SLM calls {usage.get('calls', 0)} ({stats['slm_calls_per_memory']:.3f} per memory), "
          f"prompt tokens {usage.get('prompt_tokens', 0)} ({usage.get('prompt_tokens', 0) / n:.1f} per memory), "
          f"completion tokens {usage.get('completion_tokens', 0)} ({usage.get('completion_tokens', 0) / n:.1f} per memory), "
          f"errors {usage.get('errors', 0)}")
    if usage.get("decisions"):
        d = usage["decisions"]
        print(f"SLM work: {d.get('route_slm', 0)} routes, {d.get('topics', 0)} topic proposals, "
              f"{usage.get('profiles', {}).get('slm', 0)} cluster labels picked in {d.get('profile_calls', 0)} calls")
    t = stats["timings_s"]
    print(f"time: embedding {t['embed']:.2f} s, adds {t['add']:.2f} s, organisations {t['organize']:.2f} s, "
          f"searches {t['search']:.3f} s")


def _short_report(report: dict[str, Any]) -> str:
    keep = ("reason", "kmeans_k", "topics", "split", "merged", "reassigned", "clusters", "profiles")
    return ", ".join(f"{k}={report[k]}" for k in keep if k in report and report[k] not in ([], 0, None))


def _hit_dict(h) -> dict[str, Any]:
    return {f: getattr(h, f) for f in h.__slots__}


def _clip(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
