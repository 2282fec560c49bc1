"""Embedder: all-MiniLM-L6-v2 sentence embeddings through ONNX Runtime, without torch.

>>> emb = Embedder()                       # fp32; CUDA only with onnxruntime-gpu + a device
>>> v = emb.encode(["hello world", "bye"])  # float32 (2, 384), rows L2-normalised

Vectors match sentence-transformers (cosine >= 0.9999 on the golden set): the same WordPiece
tokenisation (lower-cased, truncated at 256 tokens), mean pooling over the attention mask and
L2 normalisation, both inside the ONNX graph (one batched MatMul: no (batch, seq, 384)
tensor leaves the graph). A numba pooling kernel on the graph's hidden states measured no
faster (640 LoCoMo turns, best of 3: 17.8 s in-graph vs 18.4 s numba at batch 32, 7.7 vs 7.8 s
at batch 1, on a loaded 2-core machine) and would add numba's import and JIT time.

Input rules (defined behaviour, never a silent wrong vector): every item must be a ``str``
with at least one token after BERT normalisation. Empty or whitespace-only strings, strings
of only control / zero-width characters, non-str items and strings holding lone surrogates
raise ``ValueError`` naming the index of the first bad item; nothing is encoded then.
Texts longer than 256 tokens are truncated like sentence-transformers does; pass
``return_truncated=True`` to learn which.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np

from clag_fast.embed import modelfiles
from clag_fast.embed.cpu import has_vnni

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda", "auto")
#: Most padded tokens per ONNX call (batch x width). Smaller calls keep a call's activations
#: in the core's cache: at 1 thread on 1,000 LoCoMo turns, batches of 8-16 texts (~250-500
#: tokens) ran fp32 7% faster than batches of 32 (~1,000 tokens).
MAX_CALL_TOKENS = 512
#: ``"auto"``: int8 on a CPU with VNNI, else fp32 (see ``Embedder``).
PRECISIONS = ("auto",) + modelfiles.PRECISIONS
#: onnxruntime graph transformers every session turns off. SkipLayerNormFusion would fuse the
#: graph's Add + LayerNormalization back into SkipLayerNormalization, whose CPU kernel measured
#: ~10x slower than the pair in onnxruntime 1.32 (see ``_model_build.fused_graph``).
SESSION_DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]

# Sessions and tokenisers are process-wide: each session holds its own copy of the weights
# (90 MB fp32, 69 MB int8 on disk) and ORT's run() is thread-safe, so every Embedder with
# the same (model, precision, device, threads) shares one.
_lock = threading.Lock()
_sessions: dict[tuple, object] = {}
_tokenizers: dict[str, object] = {}
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    """Process-wide worker threads for spreading one encode() over ``workers`` cores.

    Keyed by pid too: a forked child inherits the parent's executor without its threads.
    """
    key = (os.getpid(), workers)
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ThreadPoolExecutor(workers - 1, thread_name_prefix="clag_fast_embed")
        return pool


def _chunks(order: np.ndarray, lengths: np.ndarray, batch_size: int, max_tokens: int | None) -> list[np.ndarray]:
    """Split length-sorted ``order`` into ONNX calls: at most ``batch_size`` texts and at most
    ``max_tokens`` padded tokens each (a single longer text still gets its own call; None:
    no token cap)."""
    if max_tokens is None:
        max_tokens = np.iinfo(np.int64).max
    chunks = []
    start, n = 0, len(order)
    while start < n:
        stop = start + 1
        while stop < n and stop - start < batch_size and (stop - start + 1) * lengths[order[stop]] <= max_tokens:
            stop += 1
        chunks.append(order[start:stop])
        start = stop
    return chunks


# Only on a CPU with VNNI was int8 measured faster than fp32; elsewhere ``precision="auto"``
# picks fp32. A module name of its own, so tests can say which CPU this is.
_cpu_has_vnni = has_vnni


def resolve_precision(precision: str = "auto", device: str = "auto") -> str:
    """The concrete precision ``Embedder(precision, device)`` runs: "auto" becomes int8 only
    where it was measured faster than fp32 (a CPU with VNNI); CUDA is fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    on_cpu = device == "cpu" or (device == "auto" and not _cuda_available())
    return "int8" if on_cpu and _cpu_has_vnni() else "fp32"


def usable_cpus() -> int:
    """CPUs this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _tokenizer(model: str):
    with _lock:
        tok = _tokenizers.get(model)
        if tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(modelfiles.tokenizer_path(model)))
            # The package's tokenizer.json pads and truncates to 128; sentence-transformers
            # truncates at 256 and pads to the longest item. We truncate ourselves (to know
            # which items were cut) and pad per length bucket.
            tok.no_padding()
            tok.no_truncation()
            _tokenizers[model] = tok
        return tok


def _cuda_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def _session(model: str, precision: str, device: str, threads: int | None):
    """Create (once) the InferenceSession for this configuration; returns (session, device)."""
    import onnxruntime as ort

    if device == "auto":
        # ORT's int8 kernels (MatMulIntegerToFloat) are CPU-only.
        if precision == "fp32" and _cuda_available():
            try:
                return _session(model, precision, "cuda", threads)
            except RuntimeError as exc:  # onnxruntime-gpu present, no usable device
                log.info("device='auto': CUDA unusable (%s); using the CPU", exc)
        device = "cpu"
    key = (model, precision, device, threads)
    with _lock:
        hit = _sessions.get(key)
    if hit is not None:
        return hit, device
    if device == "cuda":
        if precision != "fp32":
            raise ValueError("int8 runs on CPU only (ORT's dynamic int8 kernels have no CUDA "
                             "implementation); use precision='fp32' with device='cuda'")
        if not _cuda_available():
            raise RuntimeError(
                "device='cuda' needs onnxruntime-gpu and a CUDA device, but this onnxruntime "
                f"offers only {ort.get_available_providers()}; install onnxruntime-gpu, or use "
                "device='auto' to fall back to the CPU"
            )
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    path = modelfiles.model_path(model, precision)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        so.intra_op_num_threads = threads
    # One op at a time: BERT is a chain, so inter-op threads would only spin.
    so.inter_op_num_threads = 1
    # Intra-op workers sleep between ops instead of spinning: on a loaded 2-core machine a
    # spinning pair burnt 4.7-4.9 ms of CPU per short text against 1.9-2.2 ms without
    # (benches/bench_service.py's in-process loop), CPU the caller's other threads need.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        # SkipLayerNorm's slowness was measured on ORT's CPU kernel; CUDA keeps the fusion.
        disabled = SESSION_DISABLED_OPTIMIZERS if providers == ["CPUExecutionProvider"] else []
        sess = ort.InferenceSession(str(path), so, providers=providers, disabled_optimizers=disabled)
    except Exception as exc:
        if device != "cuda":
            raise
        raise RuntimeError(f"device='cuda': could not create a CUDA session ({exc}); use "
                           "device='auto' to fall back to the CPU") from exc
    if device == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
        # onnxruntime-gpu without a usable device silently falls back to CPU: say so.
        raise RuntimeError("device='cuda': onnxruntime-gpu is installed but no CUDA device "
                           "could be initialised; use device='auto' to fall back to the CPU")
    with _lock:
        sess = _sessions.setdefault(key, sess)
    return sess, device


class Embedder:
    """Sentence embeddings (all-MiniLM-L6-v2, 384-d, L2-normalised) through ONNX Runtime.

    Args:
        model: a model of the manifest (only ``"minilm-l6"`` today).
        precision: ``"auto"`` (default): ``"int8"`` on a CPU with VNNI integer dot products
            (AVX512-VNNI / AVX-VNNI), where it measured faster than fp32, else ``"fp32"``;
            ``.precision`` tells which one was taken. ``"fp32"`` matches
            sentence-transformers to cosine >= 0.9999 on every golden text. ``"int8"`` (CPU
            only): every encoder matmul in int8 (see ``_model_build.int8_graph_bytes``);
            cosine >= 0.99 to sentence-transformers on every golden text (min 0.995, mean
            0.998). With the previous recipe (Q/K/V through QAttention, golden min 0.992):
            on 2,000 LoCoMo turns min 0.984 / mean 0.997 against fp32, LoCoMo Recall@10
            flat 0.419 vs 0.421, store two-stage 0.409 vs 0.417 (BENCHMARKS.md).
            On CPUs without VNNI int8 is not the default: its weights are stored unsigned
            there (onnxruntime's signed-weight kernel saturates without VNNI, golden min
            0.988; unsigned 0.995), and on an AVX2 EPYC it ran at about fp32's speed (243
            vs 255 texts/s in bulk). A MemoryStore records the precision it started with
            and keeps it.
        device: ``"auto"`` (default: CUDA for fp32 when onnxruntime-gpu and a device are
            present, else CPU), ``"cpu"``, or ``"cuda"`` (onnxruntime-gpu and a device
            required, else RuntimeError). ``.device`` tells which one was taken.
        threads: cores to use (``None``: every core this process may run on). One ONNX call
            (a single text, or one batch) is split over them by ONNX Runtime's intra-op
            threads; an ``encode`` that makes several calls instead runs them side by side,
            one core each (no per-operator fork/join; 2.3x / 2.0x the texts/s of
            calls in turn for fp32 / int8 on the loaded dev machine, see BENCHMARKS.md).
            That needs a second, 1-thread ONNX session per configuration, made on first
            use (RSS +87 MB fp32, +46 MB int8; the first costs 174 / 49 MB).
        batch_size: most texts per ONNX call. Texts are sorted by token length before
            batching, so a call pads only to its own longest text, and a call holds at most
            ``MAX_CALL_TOKENS`` padded tokens (smaller calls stay in cache). int8 batches
            too: its activation scales are per token, so a text's vector depends on its batch
            mates only by the float rounding of the pooling (< 1e-6), and a call reads the
            int8 weights once for all its texts: batches of 4 short texts measured 5-30% less
            CPU per text than one call each on the loaded dev machine (caches shared with
            other work), about the same on a quiet core.

    ``encode`` is safe to call from several threads at once.
    """

    def __init__(self, model: str = modelfiles.DEFAULT_MODEL, precision: str = "auto",
                 device: str = "auto", threads: int | None = None, batch_size: int = 32) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
        precision = resolve_precision(precision, device)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        entry = modelfiles.manifest(model)
        self.model = model
        self.precision = precision
        self.threads = threads
        self.batch_size = batch_size
        self.max_seq_length: int = entry["max_seq_length"]
        self._dim: int = entry["dim"]
        self._tok = _tokenizer(model)
        self._sep = self._tok.token_to_id("[SEP]")
        self._session, self.device = _session(model, precision, device, threads)
        # Several ONNX calls in one encode() (one per batch) run
        # side by side on `workers` threads, each call on one core (a 1-thread session),
        # instead of one call at a time split over every core: no per-operator fork/join.
        self._workers = 1 if self.device != "cpu" else (threads or usable_cpus())
        self._narrow = None  # the 1-thread session, made on first use

    @property
    def name(self) -> str:
        """The model's name, as a store records it (``MemoryStore`` refuses another embedder)."""
        return self.model

    @property
    def dim(self) -> int:
        """Embedding width (384)."""
        return self._dim

    def __repr__(self) -> str:
        return (f"Embedder(model={self.model!r}, precision={self.precision!r}, "
                f"device={self.device!r}, threads={self.threads}, batch_size={self.batch_size})")

    def _token_ids(self, texts: list) -> list[list[int]]:
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"texts[{i}] is {type(t).__name__}, not str")
            if not t or t.isspace():
                raise ValueError(f"texts[{i}] is empty or whitespace-only; it has no meaning to embed")
        try:
            encs = self._tok.encode_batch_fast(texts) if hasattr(self._tok, "encode_batch_fast") \
                else self._tok.encode_batch(texts)
        except Exception:
            # The Rust side refuses strings that are not valid UTF-8 (lone surrogates) with an
            # unhelpful TypeError; find and name the item.
            for i, t in enumerate(texts):
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ValueError(f"texts[{i}] is not valid unicode: {exc.reason} at "
                                     f"character {exc.start}") from None
            raise
        ids = [e.ids for e in encs]
        for i, row in enumerate(ids):
            if len(row) <= 2:  # only [CLS] [SEP]: control / zero-width characters only
                raise ValueError(f"texts[{i}] has no tokens after normalisation "
                                 "(only control, format or zero-width characters)")
        return ids

    def _truncate(self, ids: list[list[int]]) -> tuple[list[list[int]], np.ndarray]:
        limit = self.max_seq_length
        truncated = np.fromiter((len(r) > limit for r in ids), dtype=bool, count=len(ids))
        for i in np.flatnonzero(truncated):
            # Same as HF truncation of a single sequence: [CLS] + first 254 pieces + [SEP].
            ids[i] = ids[i][: limit - 1] + [self._sep]
        return ids, truncated

    def tokenize(self, texts: Iterable[str]) -> list[list[int]]:
        """Token ids exactly as the model sees them: [CLS] ... [SEP], truncated at 256."""
        if isinstance(texts, (str, bytes)):
            raise TypeError("tokenize() takes a list of str; wrap a single text as [text]")
        return self._truncate(self._token_ids(list(texts)))[0]

    def encode(self, texts: Iterable[str], *, return_truncated: bool = False,
               batch_size: int | None = None):
        """Embed ``texts`` -> float32 ``(n, dim)``, rows L2-normalised, in input order.

        With ``return_truncated=True`` returns ``(vectors, truncated)`` where ``truncated`` is a
        bool array marking texts longer than ``max_seq_length`` tokens (embedded from their
        first 254 word pieces, as sentence-transformers does). Raises ValueError naming the
        index of the first bad item (see the module docstring); TypeError for a bare str.
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("encode() takes a list of str; wrap a single text as [text]")
        texts = list(texts)
        bs = self.batch_size if batch_size is None else batch_size
        if not isinstance(bs, int) or bs < 1:
            raise ValueError(f"batch_size must be a positive int, got {bs!r}")
        n = len(texts)
        out = np.empty((n, self._dim), dtype=np.float32)
        truncated = np.zeros(n, dtype=bool)
        if n:
            ids, truncated = self._truncate(self._token_ids(texts))
            lengths = np.fromiter((len(r) for r in ids), dtype=np.int64, count=n)
            # Length buckets: sorted order, so each batch pads only to its own longest text.
            order = np.argsort(lengths, kind="stable")
            # The token cap was measured on CPU threads only; CUDA gets plain batches.
            cap = MAX_CALL_TOKENS if self.device == "cpu" else None
            chunks = _chunks(order, lengths, bs, cap)
            if len(chunks) > 1 and self._workers > 1:
                self._run_spread(chunks, ids, lengths, out)
            else:
                for idx in chunks:
                    self._run(self._session, idx, ids, lengths, out)
        return (out, truncated) if return_truncated else out

    @staticmethod
    def _run(session, idx: np.ndarray, ids: list[list[int]], lengths: np.ndarray,
             out: np.ndarray) -> None:
        """One ONNX call: embed the texts ``idx`` (padded to the longest) into ``out[idx]``."""
        width = int(lengths[idx[-1]])
        input_ids = np.zeros((len(idx), width), dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        for r, i in enumerate(idx):
            k = int(lengths[i])
            input_ids[r, :k] = ids[i]
            mask[r, :k] = 1
        out[idx] = session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0]

    def _run_spread(self, chunks, ids, lengths, out) -> None:
        """Run the calls on ``self._workers`` threads (the caller is one), one core each."""
        if self._narrow is None:
            self._narrow = _session(self.model, self.precision, "cpu", 1)[0]
        sess = self._narrow
        todo = iter(chunks)  # list iterators hand out items atomically under the GIL

        def work() -> None:
            for idx in todo:
                self._run(sess, idx, ids, lengths, out)

        futures = [_pool(self._workers).submit(work) for _ in range(min(self._workers, len(chunks)) - 1)]
        try:
            work()
        except BaseException:
            for _ in todo:  # stop the workers after their current call
                pass
            for f in futures:
                if not f.cancel():
                    f.exception()  # wait for it; the caller's own error is the one raised
            raise
        for f in futures:
            if not f.cancel():  # not started yet (pool busy): nothing left for it anyway
                f.result()  # re-raises a worker's exception
