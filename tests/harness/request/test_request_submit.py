"""`--submit URL`: the request JSON POSTed to URL/api/requests with the bearer token, against a local server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.request import RequestReport
from harness.store import Store
from request_helpers import REPO_CONFIGS, load_config

TOKEN = "test-token-123"


class _Dashboard(BaseHTTPRequestHandler):
    received: list[dict]  # set per server by the fixture

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append({"path": self.path, "auth": self.headers.get("Authorization"),
                              "type": self.headers.get("Content-Type"), "body": json.loads(body)})
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._answer(401, {"detail": "bad token"})
        elif self.path != "/api/requests":
            self._answer(404, {"detail": "not found"})
        else:
            self._answer(201, {"id": 7, "status": "requested"})

    def _answer(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def dashboard(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[dict]]]:
    """A tiny dashboard on 127.0.0.1; (base URL, the requests it received)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    received: list[dict] = []
    handler = type("Handler", (_Dashboard,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_submit_posts_the_request_with_the_token(request_json, dashboard, monkeypatch):
    url, received = dashboard
    monkeypatch.setenv("PCG_UPLOAD_TOKEN", TOKEN)
    r = request_json(REPO_CONFIGS / "Qwen__Qwen3-30B-A3B.json", "--submit", url + "/")
    assert r["submitted"] == {"url": f"{url}/api/requests", "status": 201, "response": {"id": 7, "status": "requested"}}
    [got] = received
    assert got["path"] == "/api/requests" and got["auth"] == f"Bearer {TOKEN}" and got["type"] == "application/json"
    body = got["body"]
    assert body["architecture"] == "Qwen3MoeForCausalLM" and body["supported"] is True and body["features"] == ["moe"]
    assert body["hub_id"] == "Qwen/Qwen3-30B-A3B"  # told by the shipped config's file name
    assert body["request_id"] == r["request_id"] and body["config"] == load_config("Qwen__Qwen3-30B-A3B.json")
    assert TOKEN not in json.dumps(body)
    report = RequestReport.model_validate(body)  # the schema the dashboard can validate bodies with
    assert report.verdicts["model"].ok and report.params == r["params"]


def test_submit_without_a_token_is_exit_2_and_records_nothing(pcgh, db, dashboard, monkeypatch):
    url, received = dashboard
    monkeypatch.delenv("PCG_UPLOAD_TOKEN", raising=False)
    rc, _, err = pcgh("request", REPO_CONFIGS / "Qwen__Qwen3-0.6B.json", "--db", db, "--submit", url)
    assert rc == 2 and "$PCG_UPLOAD_TOKEN" in err and received == []
    with Store(db) as store:
        assert store.requests() == []


def test_rejected_token_is_exit_2_and_the_request_stays_recorded(pcgh, db, dashboard, monkeypatch):
    url, received = dashboard
    monkeypatch.setenv("PCG_UPLOAD_TOKEN", "wrong")
    rc, _, err = pcgh("request", REPO_CONFIGS / "Qwen__Qwen3-0.6B.json", "--db", db, "--submit", url)
    assert rc == 2 and "HTTP 401" in err and "check $PCG_UPLOAD_TOKEN" in err and "recorded locally as #1" in err
    assert len(received) == 1
    with Store(db) as store:
        assert len(store.requests()) == 1


def test_unreachable_dashboard_is_exit_2(pcgh, db, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PCG_UPLOAD_TOKEN", TOKEN)
    rc, _, err = pcgh("request", REPO_CONFIGS / "Qwen__Qwen3-0.6B.json", "--db", db, "--submit", f"http://127.0.0.1:{port}")
    assert rc == 2 and "cannot reach the dashboard" in err and f"127.0.0.1:{port}/api/requests" in err
