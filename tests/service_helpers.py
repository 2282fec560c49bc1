"""Running ``clag-fast serve`` in a child process for the service tests: a free loopback
port, a wait for /healthz, a clean stop (SIGTERM) or a SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


class ServiceProcess:
    """``clag-fast serve --store STORE ...`` on a free port until ``stop()`` / ``kill()``.

    Vector-only by default (``--no-embedder --slm off``), so tests need no model."""

    def __init__(self, store: Path, *args: str, embedder: bool = False, keys: Path | None = None,
                 timeout_s: float = 90.0) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(store), "--port", str(self.port),
               "--slm", "off", *args]
        if not embedder:
            cmd.append("--no-embedder")
        if keys is not None:
            cmd += ["--keys", str(keys)]
        self.log = store.parent / f"serve-{self.port}.log"
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
        self.started_s = self._wait(timeout_s)

    def _wait(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the service did not answer /healthz within {timeout_s} s: {self.output()}")

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        """SIGTERM (uvicorn finishes requests, the store is closed) and wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._log.close()

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
