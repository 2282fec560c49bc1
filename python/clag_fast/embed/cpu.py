"""What the CPU offers the int8 graph: VNNI integer dot products or not."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def has_vnni() -> bool:
    """True where the CPU has VNNI integer dot products (x86 AVX512-VNNI or AVX-VNNI, Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return "avx512_vnni" in flags or "avx_vnni" in flags
    except OSError:
        pass
    return False


def int8_weight_codes() -> str:
    """How the int8 graph stores its weights on this CPU: ``"s8"`` (signed) with VNNI, whose
    ``vpdpbusd`` multiplies the uint8 activations by int8 weights straight into 32 bits;
    ``"u8"`` (unsigned, zero point 128) elsewhere. Without VNNI, onnxruntime's uint8 x int8
    kernel adds pairs of products in a saturating 16-bit ``vpmaddubsw`` (255 * 127 * 2 >
    32,767): on an AVX2 CPU the golden set fell to cosine 0.988 (0.95 on a tiny BERT). Its
    uint8 x uint8 kernel widens to 16 bits first and is exact (golden min 0.995), at the same
    speed there."""
    return "s8" if has_vnni() else "u8"
