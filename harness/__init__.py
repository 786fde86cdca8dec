"""harness: model cards, the compatibility matrix, the judge, the store and the reports around pcg_core."""
