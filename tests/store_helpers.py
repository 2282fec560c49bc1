"""Synthetic data for store tests: topic-clustered unit vectors with texts to match."""

from __future__ import annotations

import numpy as np

DIM = 384


def topic_vectors(n: int, n_topics: int, *, seed: int = 0, spread: float = 0.35, dim: int = DIM):
    """``n`` unit vectors around ``n_topics`` random centres; returns (vectors, topic of each)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_topics, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    topics = rng.integers(0, n_topics, size=n)
    noise = rng.standard_normal((n, dim)).astype(np.float32) * spread / np.sqrt(dim) * 4
    v = centres[topics] + noise
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(np.float32), topics


def texts_for(topics: np.ndarray, start: int = 0) -> list[str]:
    return [f"memory {start + i} about topic {t}" for i, t in enumerate(topics.tolist())]


def exact_top(vectors: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Indices of the exact top-k rows by cosine (vectors are unit length)."""
    q = query / np.linalg.norm(query)
    return np.argsort(-(vectors @ q), kind="stable")[:k]


def run_until_killed(code: str, min_lines: int, after_s: float = 0.0, timeout_s: float = 120.0) -> list[str]:
    """Run ``code`` in a child Python, collect its stdout lines, and SIGKILL it ``after_s``
    seconds after it printed ``min_lines`` lines (or exited, or ``timeout_s`` passed). The
    writers in the crash tests print a line only after a call returned, so the lines are
    what the child was promised; a last line the kill cut mid-write (no newline) was not
    promised and is dropped."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    # Start-up time varies a lot on a loaded machine: kill relative to the first lines.
    deadline = time.monotonic() + timeout_s
    while len(lines) < min_lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(after_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(timeout=10)
    return [ln for ln in lines if ln.endswith("\n")]


def files_snapshot(path) -> dict[str, bytes]:
    """Every file under ``path`` (relative name -> bytes), to assert that a refused call left
    a store's directory exactly as it was: no file changed, created or removed."""
    from pathlib import Path

    root = Path(path)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def store_state(store) -> tuple:
    """What a caller can observe of an open store: its memories (id, text, metadata, cluster,
    archived), its clusters with their profiles, and its row and memory counts. Equal before
    and after a refused call means the call changed nothing."""
    st = store.stats()
    ids = sorted(int(m) for m in store._state.rows.memory_id[: store._state.rows.n] if m >= 0)
    memories = []
    for mid in ids:
        try:
            m = store.get(mid)
        except KeyError:
            continue
        memories.append((m.memory_id, m.text, m.kind, m.namespace, repr(m.metadata), tuple(m.clusters), m.archived))
    clusters = [(c.id, c.summary, tuple(c.tags), c.size) for c in store.clusters()]
    return (len(store), st["vector_rows"], st["archived"], tuple(memories), tuple(clusters))
