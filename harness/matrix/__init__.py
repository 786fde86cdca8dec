"""The compatibility matrix: schema, expansion into cells, capability pre-check."""

from harness.matrix.expand import Cell, cell_key, expand, select, shard
from harness.matrix.precheck import precheck
from harness.matrix.schema import Matrix, load_matrix

__all__ = ["Cell", "Matrix", "cell_key", "expand", "load_matrix", "precheck", "select", "shard"]
