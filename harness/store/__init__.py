"""The results store: runs and cell results in SQLite (default, a local file) or PostgreSQL (shared)."""

from harness.store.db import default_db_url
from harness.store.repository import RunNotFound, Store

__all__ = ["RunNotFound", "Store", "default_db_url"]
