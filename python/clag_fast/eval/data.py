"""LoCoMo-format datasets, importable from the evaluation too (defined in
``clag_fast.locomo``, below the evaluation: the demo and ``clag-fast ingest`` read them)."""

from clag_fast.locomo import (QAItem, Sample, Turn, UNANSWERABLE, conversation, load_dataset, normalize_evidence,
                              parse_samples)

__all__ = ["Turn", "QAItem", "Sample", "UNANSWERABLE", "conversation", "load_dataset", "parse_samples", "normalize_evidence"]
