"""The compatibility matrix: schema, expansion into cells, capability pre-check."""

from harness.matrix.expand import Cell, cell_key, check_selection, expand, select, shard
from harness.matrix.precheck import precheck
from harness.matrix.schema import Matrix, load_matrix

__all__ = ["Cell", "Matrix", "cell_key", "check_selection", "expand", "load_matrix", "precheck", "select", "shard"]
