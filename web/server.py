"""The dashboard's HTTP server as shipped: uvicorn, with read deadlines and room for many connections.

uvicorn has no deadline for a request's headers or body: a client that sends half a request holds its connection
forever, and enough of them (1,100 measured, at the common 1,024 file limit) stop the server accepting any. So:
- every connection must deliver a request's headers within `header_timeout` of opening (or of its previous
  response), and its body within `body_timeout` of the headers, else it is closed;
- the process's soft open-file limit is raised to its hard limit, so slow clients cannot take every descriptor;
- `limit_concurrency` caps connections and tasks together: past it uvicorn answers 503 at once, not never.
Behind a proxy (nginx, Caddy), keep these and let the proxy buffer uploads; web/README.md ("Deploying") says how.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 120.0  # a 64 MiB upload at ~0.5 MB/s
LIMIT_CONCURRENCY = 4096


def deadline_protocol(header_timeout: float = HEADER_TIMEOUT_S, body_timeout: float = BODY_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers or body do not arrive in time."""

    class DeadlineH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _timed_cycle: Any = None  # the request whose body the running deadline is for

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._timed_cycle = None
            self._arm(header_timeout)  # the next request's headers (keep-alive's own timeout is shorter)

        def _arm(self, seconds: float) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(seconds, self._check)

        def _check(self) -> None:
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is None or cycle.response_complete:  # no request's headers in time
                self.transport.close()
            elif cycle.more_body:  # headers in; the body still coming
                if self._timed_cycle is cycle:  # and it had its time
                    self.transport.close()
                else:
                    self._timed_cycle = cycle
                    self._arm(body_timeout)
            else:  # the app is answering: not the client's time
                self._arm(header_timeout)

    return DeadlineH11Protocol


def raise_open_file_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(app: Any, host: str, port: int, header_timeout: float = HEADER_TIMEOUT_S,
          body_timeout: float = BODY_TIMEOUT_S, limit_concurrency: int = LIMIT_CONCURRENCY) -> None:
    raise_open_file_limit()
    uvicorn.run(app, host=host, port=port, http=deadline_protocol(header_timeout, body_timeout),
                limit_concurrency=limit_concurrency, timeout_keep_alive=5)
