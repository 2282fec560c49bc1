"""One BLAS thread in the service process.

numpy's OpenBLAS starts a worker thread per extra core at import and splits every matrix
product over them; between products the workers spin waiting for the next one. In-process
that spreads a caller's product over the cores. In the service the cores are already shared
out by the requests (batches run side by side in worker threads), and the products are small
(a query batch against a few hundred rows, label phrases against the cluster centres), so
the split buys nothing and the spinning takes a core from the requests: under the bench's
load (``benches/bench_service.py``) OpenBLAS' thread server was ~4% of the server's CPU
samples (perf), with only ~2% spent in its products. Products on one thread agree with the
threaded ones to float32 rounding; they are not always bit-identical (on an AVX-512 EPYC the
threaded sgemm blocks its sums differently: 1e-6 relative), which nothing in the service
relies on (the bit-equal vectors of its tests come from ONNX Runtime, not numpy).

numpy reads ``OPENBLAS_NUM_THREADS`` only when it is first imported, before ``clag_fast``
runs, so the count is set through OpenBLAS' own call on the library numpy loaded.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

#: The setter's name in the OpenBLAS builds numpy ships (scipy-openblas, 64-bit ints) and in
#: plain OpenBLAS.
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def _call(lib: ctypes.CDLL, names: tuple[str, ...], *args: int) -> int | None:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn(*args)
    return None


def limit_to_one_thread() -> int | None:
    """Set numpy's OpenBLAS to one thread; returns the count it had (None: no OpenBLAS
    found, nothing changed)."""
    import numpy  # noqa: F401 - loads the library whose threads are set

    before = None
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        had = _call(lib, _GETTERS)
        if _call(lib, _SETTERS, 1) is None and had is None:
            continue
        before = had if before is None else before
        log.debug("%s: OpenBLAS threads %s -> 1", path, had)
    return before


def threads() -> int | None:
    """numpy's OpenBLAS thread count (None: no OpenBLAS found)."""
    for path in _loaded_openblas():
        try:
            got = _call(ctypes.CDLL(path), _GETTERS)
        except OSError:
            continue
        if got is not None:
            return got
    return None
