"""The results store: runs, cell results and model requests in SQLite (default, a local file) or PostgreSQL (shared)."""

from harness.store.db import default_db_url
from harness.store.repository import RequestNotFound, RunNotFound, Store

__all__ = ["RequestNotFound", "RunNotFound", "Store", "default_db_url"]
