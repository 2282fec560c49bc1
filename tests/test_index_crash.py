"""Crash safety and hostile files: SIGKILL mid-append, torn tails, corrupt / foreign /
other-version headers and cluster state (clear OSError, no crash, file untouched)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from clag_fast.index import VectorIndex

DIM = 8

WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from clag_fast.index import VectorIndex
    path, dim = sys.argv[1], int(sys.argv[2])
    ix = VectorIndex.open(path, dim=dim)
    i = len(ix)
    while True:
        n = 1 + i % 7
        rows = np.arange(i, i + n, dtype=np.float64)[:, None] + np.arange(1, dim + 1)
        ix.append(rows)              # row j = (j+1, j+2, ..., j+dim), normalised
        i += n
        if i % 5 == 0:
            ix.flush()
        print(i, flush=True)         # everything below i has been committed
    """
)


def expected(rows: int) -> np.ndarray:
    x = np.arange(rows, dtype=np.float64)[:, None] + np.arange(1, DIM + 1)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 0.7, 1.1])
def test_sigkill_mid_append_leaves_an_exact_prefix(tmp_path, delay):
    path = tmp_path / "ix"
    acknowledged = 0
    for round_ in range(2):  # the second writer resumes on the file the first one left
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(DIM)], stdout=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + delay + 5
        start = None
        assert proc.stdout is not None
        for line in proc.stdout:
            acknowledged = max(acknowledged, int(line))
            start = start or time.monotonic()
            if time.monotonic() - start > delay or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        with VectorIndex.open(path, dim=DIM) as ix:
            n = len(ix)
            # Every acknowledged append survived; nothing beyond the committed count is read.
            assert n >= acknowledged > 0
            np.testing.assert_allclose(ix.vectors(), expected(n), atol=1e-6)
            assert (ix.cluster_of(np.arange(n)) == -1).all()
        acknowledged = n


def test_torn_tail_bytes_are_ignored_and_overwritten(tmp_path):
    path = tmp_path / "ix"
    with VectorIndex.open(path, dim=DIM) as ix:
        ix.append(expected(3))
    vf = path / "vectors.f32"
    with open(vf, "ab") as f:  # half a row of garbage, as a crash mid-write would leave
        f.write(b"\xff" * (DIM * 2))
    with VectorIndex.open(path, dim=DIM) as ix:
        assert len(ix) == 3
        ix.append(expected(5)[3:])
        np.testing.assert_allclose(ix.vectors(), expected(5), atol=1e-6)
    assert vf.stat().st_size == 64 + 5 * DIM * 4  # close() trims spare capacity


def _header(dim=DIM, version=1, count=0):
    magic = b"CLAGVEC\0"

    def fnv(b: bytes) -> int:
        h = 0xCBF29CE484222325
        for x in b:
            h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return h

    slot = struct.pack("<QQ", 1, count)
    body = magic + struct.pack("<II", version, dim)
    return body + slot + struct.pack("<Q", fnv(body + slot)) + bytes(24)


def test_header_layout_is_what_we_document(tmp_path):
    path = tmp_path / "ix"
    VectorIndex.open(path, dim=DIM).close()
    assert (path / "vectors.f32").read_bytes() == _header()


@pytest.mark.parametrize(
    "name, data, msg",
    [
        ("empty", b"", "truncated header"),
        ("short", _header()[:40], "truncated header"),
        ("foreign", b"PK\x03\x04" + bytes(200), "not a clag_fast vector file"),
        ("version", _header(version=2), "version 2 is not supported"),
        ("checksum", _header()[:24] + b"\x01" + _header()[25:], "corrupt header"),
        ("dim0", _header(dim=0), "corrupt header"),
        ("truncated rows", _header(count=10) + bytes(DIM * 4 * 3), "truncated or corrupt"),
    ],
)
def test_bad_vector_file_is_a_clear_oserror_and_untouched(tmp_path, name, data, msg):
    path = tmp_path / "ix"
    path.mkdir()
    (path / "vectors.f32").write_bytes(data)
    for ro in (False, True):
        with pytest.raises(OSError, match=msg):
            VectorIndex.open(path, dim=DIM, read_only=ro)
    assert (path / "vectors.f32").read_bytes() == data
    assert not (path / "clusters.bin").exists()


@pytest.mark.parametrize("where", ["magic", "middle", "checksum", "truncate"])
def test_bad_cluster_state_is_a_clear_oserror_and_untouched(tmp_path, where):
    path = tmp_path / "ix"
    with VectorIndex.open(path, dim=DIM) as ix:
        ix.append(expected(30))
        ix.kmeans(3)
    cb = path / "clusters.bin"
    data = bytearray(cb.read_bytes())
    if where == "magic":
        data[0] ^= 1
    elif where == "middle":
        data[len(data) // 2] ^= 0x10
    elif where == "checksum":
        data[-1] ^= 1
    else:
        data = data[: len(data) // 2]
    cb.write_bytes(bytes(data))
    before = (path / "vectors.f32").read_bytes()
    with pytest.raises(OSError, match="clusters.bin"):
        VectorIndex.open(path, dim=DIM)
    assert cb.read_bytes() == bytes(data)
    assert (path / "vectors.f32").read_bytes() == before


def test_state_newer_than_vectors_is_repaired(tmp_path):
    """If the vector file lost rows the cluster state knew (power loss before a sync), the
    missing rows leave their clusters and the sums are rebuilt from what remains."""
    path = tmp_path / "ix"
    with VectorIndex.open(path, dim=DIM) as ix:
        ix.append(expected(40))
        ix.kmeans(2, seed=0)
    vf = path / "vectors.f32"
    raw = bytearray(vf.read_bytes())
    raw[16:40] = _header(count=30)[16:40]  # slot 0 commits 30 rows
    raw[40:64] = bytes(24)  # slot 1 invalid
    vf.write_bytes(bytes(raw))
    with VectorIndex.open(path, dim=DIM) as ix:
        assert len(ix) == 30
        assert ix.cluster_sizes().sum() == 30
        v = ix.vectors().astype(np.float64)
        for cid, cen in zip(ix.cluster_ids(), ix.centres()):
            m = ix.members(cid)
            if len(m):
                s = v[m].sum(0)
                np.testing.assert_allclose(cen, s / np.linalg.norm(s), atol=1e-5)


def test_reader_process_sees_committed_rows_while_writer_is_open(tmp_path):
    path = tmp_path / "ix"
    w = VectorIndex.open(path, dim=DIM)
    w.append(expected(12))
    code = f"from clag_fast.index import VectorIndex; print(len(VectorIndex.open({str(path)!r}, read_only=True)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "12"
    w.close()
    assert os.path.exists(path / "clusters.bin")
