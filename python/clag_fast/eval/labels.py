"""The label measures the evaluation reports and the cluster map, importable from the
evaluation too (defined in ``clag_fast.labels.measures`` and ``clag_fast.cluster_map``)."""

from clag_fast.cluster_map import plot_cluster_map
from clag_fast.labels.measures import COPY_RUN, ClusterLabel, groundedness, is_copy, measure, self_misses

__all__ = ["ClusterLabel", "measure", "self_misses", "is_copy", "groundedness", "plot_cluster_map", "COPY_RUN"]
