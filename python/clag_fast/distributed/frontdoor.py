"""The Ray Serve front door: the same /v1 HTTP API as ``clag-fast serve``, over shard owners.

Nothing of the API is re-implemented: each replica builds the service's own FastAPI app
(``clag_fast.server.create_app``, same routes, models, auth, limits and errors) around a
``DistributedService``, the service with a ``ShardedStore`` in place of the local store.
Replicas hold no state (the shard owners do), so Serve may run as many as the load needs.

By default (``run``) the replica answers HTTP on the API's port itself, with Ray Serve's
throughput settings (``serve_env``): Serve's HTTP proxy, a second process hop per request
that cost more CPU than the whole single-process service, is out of the path.

Run it from Python (``run``), from the CLI (``clag-fast serve --ray auto --store ROOT``), or
with Serve's own CLI through the app builder:

    serve run clag_fast.distributed.frontdoor:app_builder root=/data/clag shards=4 port=8420
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Hashable

from clag_fast.distributed.backend import ShardedStore
from clag_fast.errors import ShardUnavailable
from clag_fast.server.batching import Coalescer
from clag_fast.server.service import AddPayload, StoreService
from clag_fast.server.settings import ServeConfig

log = logging.getLogger(__name__)

# A log line per request costs the proxy and the replica as much CPU as a small search.
QUIET = {"log_level": "WARNING", "enable_access_log": False}
FLIGHT_ADDS = 8  # add batches in flight at once (each for one shard)
FLIGHT_SEARCHES = 16  # search batches in flight at once


class DistributedService(StoreService):
    """``StoreService`` whose store is a ``ShardedStore``: coalescing, limits and tenancy as in
    the single-process service, with adds batched per owning shard (so every batch is one
    atomic ``add_many`` on one owner)."""

    def __init__(self, config: ServeConfig, shards: int | None = None, timeout_s: float = 30.0) -> None:
        super().__init__(config)
        # The base service runs few batches at once because its work is CPU on this machine;
        # here a batch is a wait on a remote owner, and owners work in parallel: more batches
        # in flight (each one shard's, for adds) keep every shard busy.
        self._executor.shutdown(wait=False)
        self._executor = ThreadPoolExecutor(max_workers=FLIGHT_ADDS + FLIGHT_SEARCHES + 4,
                                            thread_name_prefix="clag-front")
        limits = config.limits
        self.adds = Coalescer("add", self._add_batch, self._executor, max_items=limits.max_batch,
                              max_pending=limits.max_pending, workers=FLIGHT_ADDS)
        self.searches = Coalescer("search", self._search_batch, self._executor, max_items=config.search_batch,
                                  max_pending=limits.max_pending, workers=FLIGHT_SEARCHES)
        self._shards = shards
        self._timeout_s = timeout_s
        self.embedder_state = "in the shard owners" if config.embedder else "not used (bring-your-own vectors)"

    def open(self) -> Any:
        c = self.config
        self.store = ShardedStore(c.store, self._shards, dim=c.dim, embedder=c.embedder, slm=c.slm,
                                  timeout_s=self._timeout_s)
        return self.store

    def warm_up(self) -> None:
        """The model loads in each shard owner (on its first text); the front door embeds nothing."""

    async def add(self, payload: AddPayload) -> list[int]:
        shards = {self.store.shard_of(ns) for ns in payload.namespaces}
        kind = "vectors" if payload.vectors is not None else "texts"
        if len(shards) == 1:
            return await self.adds.submit((kind, shards.pop()), payload, len(payload.texts))
        # A request spanning shards: one part per shard, committed in parallel (atomic per shard).
        import asyncio

        parts: dict[int, list[int]] = {}
        for i, ns in enumerate(payload.namespaces):
            parts.setdefault(self.store.shard_of(ns), []).append(i)
        subs = {s: _subset(payload, idx) for s, idx in parts.items()}
        results = await asyncio.gather(*(self.adds.submit((kind, s), p, len(p.texts)) for s, p in subs.items()))
        out = [0] * len(payload.texts)
        for (s, idx), ids in zip(parts.items(), results):
            for i, mid in zip(idx, ids):
                out[i] = mid
        return out

    def _add_batch(self, group: Hashable, payloads: list[AddPayload]) -> list[Any]:
        try:
            ids = self._add_many(payloads)
        except ShardUnavailable as e:
            # Unlike a bad item, this failure may have left the batch committed (the owner
            # died after writing): retrying each request alone could store it twice.
            return [e] * len(payloads)
        except Exception:
            return super()._add_batch(group, payloads)  # the base class retries each request alone
        out, start = [], 0
        for p in payloads:
            out.append(ids[start:start + len(p.texts)])
            start += len(p.texts)
        return out

    async def close(self) -> None:
        await self.adds.close()
        await self.searches.close()
        self._executor.shutdown(wait=True)
        if self.store is not None:
            self.store.close()  # the owners keep running: they belong to the Ray cluster
            self.store = None


def _subset(p: AddPayload, idx: list[int]) -> AddPayload:
    return AddPayload([p.texts[i] for i in idx], None if p.vectors is None else p.vectors[idx],
                      [p.kinds[i] for i in idx], [p.namespaces[i] for i in idx],
                      [p.metadata[i] for i in idx], [p.keys[i] for i in idx])


class FrontDoor:
    """The Serve deployment's class: builds the service's ASGI app on the replica."""

    def __init__(self, config: ServeConfig, shards: int | None = None) -> None:
        self._config = config
        self._shards = shards

    def __serve_build_asgi_app__(self) -> Any:
        from clag_fast.server.app import create_app

        service = DistributedService(self._config, self._shards)
        service.open()
        return create_app(self._config, service=service)


def serve_env(port: int, replicas: int = 1) -> dict[str, str]:
    """The environment of the front door's Serve processes (controller, proxy, replicas) for
    a front door whose replicas answer HTTP themselves on ``port`` (then ``port + 1``, ...,
    one port per replica of a node).

    Why: a request through Serve's default path crosses two processes, the HTTP proxy and
    the replica, and each spends more CPU on it than the API does (measured with 4 shards
    and 16 clients: proxy 5.3 ms, replica 6.2 ms per request, the app ~4% of the replica).
    ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` is Serve's own bundle for that: the replica serves
    HTTP itself (direct ingress: no proxy hop), user code and the router run on the
    replica's main event loop (no thread hop), request-path logs are buffered and not
    copied to stderr, and the garbage collector is frozen after start-up. Set only through
    the environment, read when each Serve process imports Ray Serve: so it is passed to the
    controller (which starts the proxy) and to every replica as runtime_env env_vars.

    Measured (benches/bench_ray.py, 4 shards, 16 clients, 30% add / 70% search, 2 shared
    cores at load 11-15): the Ray side's CPU per request 12.1 ms through the proxy, 3.9-5.2 ms
    direct, against 3.7-4.4 ms for the single-process ``clag-fast serve``.

    The rest follows from serving directly: the replicas' ports are ``port`` onwards (Serve
    picks from 30000-31000 otherwise); ports are reused at once (the quarantine guards
    HAProxy's stale routes, and no HAProxy runs here); a deleted replica waits for its
    requests in flight but not for a load balancer to notice (the 30 s default drain).
    """
    if not 0 < port < 65536 - replicas:
        raise ValueError(f"port {port} leaves no room for {replicas} replica port(s)")
    return {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + replicas),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    }


def deployment(config: ServeConfig, shards: int | None = None, replicas: int = 1,
               env: dict[str, str] | None = None) -> Any:
    """The bound Serve application (pass to ``serve.run``). ``env``: the replicas' environment
    (``serve_env``), which must match the Serve controller's."""
    from ray import serve

    cls = serve.ingress()(FrontDoor)
    actor_options: dict[str, Any] = {"num_cpus": 0}
    if env:
        actor_options["runtime_env"] = {"env_vars": dict(env)}
    return serve.deployment(cls, name="clag_fast_front_door", num_replicas=replicas,
                            ray_actor_options=actor_options, max_ongoing_requests=256,
                            logging_config=QUIET).bind(config, shards)


def app_builder(args: dict[str, str]) -> Any:
    """For ``serve run clag_fast.distributed.frontdoor:app_builder root=DIR [shards=N]
    [dim=D] [embedder=false] [keys=KEYS.toml] [replicas=R]`` (host and port: Serve's own
    ``http_options``; a non-loopback host needs keys, as for ``clag-fast serve``).

    This path goes through Serve's HTTP proxy; for the faster direct path export the
    variables of ``serve_env(PORT)`` before ``ray start`` / ``serve run`` (every Serve
    process then reads them), or use ``clag-fast serve --ray``."""
    config = ServeConfig(store=Path(args["root"]), host=args.get("host", "127.0.0.1"),
                         port=int(args.get("port", 8000)), keys=Path(args["keys"]) if args.get("keys") else None,
                         embedder=str(args.get("embedder", "true")).lower() not in ("0", "false", "no", "off"),
                         dim=int(args["dim"]) if args.get("dim") else None)
    return deployment(config, int(args["shards"]) if args.get("shards") else None, int(args.get("replicas", 1)))


def _running_controller_port() -> int | None:
    """The HTTP port of the Serve controller already running in this Ray cluster (None: none
    runs). A front door started by ``run`` with direct ingress gave its proxy port 0."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return None
    return int(ray.get(controller.get_http_config.remote()).port)


def run(config: ServeConfig, *, address: str | None = "auto", shards: int | None = None, replicas: int = 1,
        blocking: bool = False, direct: bool = True) -> str:
    """Start the front door on a Ray cluster (``address``: "auto" = the local one, None = start
    one in-process) and return its URL. ``blocking`` serves until interrupted.

    ``direct`` (default): the replicas answer HTTP on ``config.port`` themselves, with Serve's
    throughput settings (``serve_env``); off: Serve's HTTP proxy listens there and forwards.
    The first front door of a Ray cluster fixes the Serve controller's mode: a later ``run``
    in the other mode is refused (restart Serve, ``serve.shutdown()``, to switch). With
    ``direct`` each replica of a node has its own port (``config.port``, ``config.port + 1``,
    ...): several replicas need a load balancer in front (or ``direct=False``, where Serve's
    proxy spreads requests over them at ~2.5x the CPU per request)."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, namespace="clag_fast", log_to_driver=False)
    env = serve_env(config.port, replicas) if direct else None
    running = _running_controller_port()
    if running is not None and (running == 0) != direct:
        raise RuntimeError(f"Ray Serve already runs {'with' if running == 0 else 'without'} direct ingress in "
                           f"this cluster; start the front door with direct={running == 0} or restart Serve")
    http = {"host": config.host, "port": 0 if direct else config.port}  # with direct ingress: the idle fallback proxy
    serve.start(http_options=http, logging_config=QUIET,
                controller_options={"runtime_env": {"env_vars": env}} if env else None)
    serve.run(deployment(config, shards, replicas, env), name="clag_fast", route_prefix="/", blocking=False)
    url = f"http://{config.host}:{config.port}"
    log.info("front door for %s listening on %s", config.store, url)
    if blocking:
        import time

        print(f"clag-fast serve --ray: {url} (the /v1 API; shards in {config.store})", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.delete("clag_fast")
    return url
