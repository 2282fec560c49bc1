"""The ASGI application and ``serve()``, which runs it with uvicorn.

Why FastAPI on uvicorn: FastAPI (on Starlette) turns the pydantic request models into both
validation and the OpenAPI document that clients and the fuzzing tests read, and is the most
widely used Python ASGI stack, so its failure modes are known; uvicorn is its reference server
(uvloop + httptools when installed). The store's work is CPU-bound and runs in threads
(``service.StoreService``), so one process with an event loop that only parses and answers is
the shape that fits: several worker processes could not share the store (one writer per store).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request

from clag_fast._clag_fast import __version__
from clag_fast.server import http_errors, routes
from clag_fast.server.auth import KeyRing
from clag_fast.server.hotpaths import HotPaths
from clag_fast.server.models import Health
from clag_fast.server.service import StoreService
from clag_fast.server.settings import ServeConfig

log = logging.getLogger(__name__)


def create_app(config: ServeConfig, service: StoreService | None = None,
               listening: Callable[[], bool] | None = None) -> Any:
    """The service as an ASGI app (the body-size guard around ``hotpaths.HotPaths`` around
    FastAPI). The store is
    opened here, so a locked or foreign directory fails before anything listens.

    listening: tells when the server accepts connections; the embedding model starts loading
    then, so loading it does not slow the start (None: at once)."""
    keyring = KeyRing.load(config.keys) if config.keys is not None else None
    if service is None:
        service = StoreService(config)
        service.open()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        warm = asyncio.create_task(_warm_when(listening, service))
        try:
            yield
        finally:
            warm.cancel()
            await service.close()
            log.info("stopped: queued requests answered, store %s closed", config.store)

    app = FastAPI(title="clag_fast memory service", version=__version__, lifespan=lifespan,
                  description="A clustered memory store for agents: add, search (hits with cluster labels), "
                              "list, update, delete. Errors: {\"error\": {\"code\", \"message\"}}.")
    app.state.service = service
    app.state.keyring = keyring
    http_errors.install(app)
    app.include_router(routes.router)

    @app.get("/healthz", response_model=Health, summary="Liveness, and whether the models are loaded")
    async def healthz(request: Request) -> Health:
        svc: StoreService = request.app.state.service
        store = svc.store
        slm = (await svc.call(store.stats))["slm"] if store is not None else "closed"
        # Unauthenticated: with keys, the store's path is nobody's business.
        return Health(status="ok" if store is not None else "starting",
                      store=str(config.store) if keyring is None else "",
                      embedder=svc.embedder_state, slm=slm,
                      auth="api keys" if keyring is not None else "none (loopback only)")

    wrapped = http_errors.BodyLimit(HotPaths(app), config.limits.max_body_bytes)
    wrapped.fastapi = app  # for tests and the OpenAPI document
    return wrapped


async def _warm_when(listening: Callable[[], bool] | None, service: StoreService) -> None:
    while listening is not None and not listening():
        await asyncio.sleep(0.01)
    service.warm_up()


def serve(config: ServeConfig) -> None:
    """Run the service until interrupted (SIGINT/SIGTERM close the store cleanly)."""
    import os

    import uvicorn

    from clag_fast.server import blas, http_protocol

    # The process is ours: its native thread pools stop splitting small work over the cores,
    # which the requests already share out (see ``blas``). The tokenizer reads its switch
    # at every call: a batch of a few texts is then tokenised in the calling worker instead
    # of being handed to a pool thread and back.
    blas.limit_to_one_thread()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    server: uvicorn.Server | None = None
    app = create_app(config, listening=lambda: server is not None and server.started)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=10,
                                           http=http_protocol.protocol_class()))
    if config.keys is None:
        print(f"clag-fast serve: no --keys file, so no authentication: listening on {config.host} only "
              f"(a non-loopback --host needs --keys)", flush=True)
    if not logging.getLogger().handlers:  # the process is ours: say what the service does
        logging.basicConfig(level=logging.WARNING, format="clag-fast serve: %(levelname)s %(name)s: %(message)s")
        logging.getLogger("clag_fast.server").setLevel(logging.INFO)
    server.run()
