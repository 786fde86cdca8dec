"""The results store: runs, cell results and model requests in SQLite (default, a local file) or PostgreSQL (shared)."""

from harness.store.db import default_db_url
from harness.store.repository import RequestNotFound, RunNotFound, Store
from harness.store.rows import RequestOutcomeRow, RequestRow, RunRow
from harness.store.views import HistoryPoint, Views

__all__ = ["HistoryPoint", "RequestNotFound", "RequestOutcomeRow", "RequestRow", "RunNotFound", "RunRow", "Store", "Views",
           "default_db_url"]
