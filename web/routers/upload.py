"""Uploads, for CI and the nightly job: a whole run with its cell results, and a model request. Bearer token only.

Writes go through the Store (create_run, record_results, finish_run), so an uploaded run is stored exactly as
`pcgh run` stores one; the body is fully validated first (web.schemas), so a bad row is a 422 and writes nothing.
If the database fails half-way, the run is closed as "interrupted" so it does not pose as one still running.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, ValidationError

from web.deps import QueriesDep, require_upload_token
from web.schemas import RequestCreatedOut, RequestIn, RunCreatedOut, RunIn

router = APIRouter(prefix="/api", tags=["upload"], dependencies=[Depends(require_upload_token)])


@router.post("/runs", status_code=status.HTTP_201_CREATED, response_model=RunCreatedOut,
             summary="Store a run and its cell results (Authorization: Bearer <token>)")
def upload_run(body: RunIn, q: QueriesDep) -> RunCreatedOut:
    store = q.store
    run_id = store.create_run(body.name, body.matrix, body.provenance, trigger=body.trigger)
    try:
        store.record_results(run_id, [row.model_dump() for row in body.results])  # one transaction
        if body.status != "running":
            store.finish_run(run_id, body.status)
        q.set_times(run_id, body.started_at, body.finished_at)
    except Exception:
        store.finish_run(run_id, "interrupted")
        raise
    return RunCreatedOut(id=run_id, cells=len({r.key for r in body.results}), url=f"/runs/{run_id}")


def _report_type() -> type[BaseModel] | None:
    """harness.request's report model (it checks a submitted report in full), or None where that is absent."""
    try:
        from harness.request.schema import RequestReport
    except ImportError:
        return None
    return RequestReport


@router.post("/requests", status_code=status.HTTP_201_CREATED, response_model=RequestCreatedOut,
             summary="Queue a model for the matrix: the report `pcgh request --submit` sends (Authorization: Bearer <token>)")
def upload_request(body: RequestIn, q: QueriesDep) -> RequestCreatedOut:
    record = getattr(q.store, "record_request", None)
    report_type = _report_type()
    if not callable(record) or report_type is None:
        raise HTTPException(status.HTTP_501_NOT_IMPLEMENTED, "this store has no model-request queue")
    try:
        report: Any = report_type.model_validate(body.model_dump())
    except ValidationError as e:
        raise HTTPException(422, e.errors(include_url=False, include_context=False)) from e
    # The report is kept whole as the verdict, as `pcgh request` keeps it locally; not what only the sender's
    # machine knows (its request id and duplicates) nor the raw config.
    verdict = report.model_dump(exclude={"request_id", "duplicates", "submitted", "config"})
    request_id = record({"model": report.model, "revision": report.revision, "config_hash": report.config_hash,
                         "architecture": report.architecture, "supported": report.supported, "verdict": verdict,
                         "status": "requested", "card_id": report.card_id})
    return RequestCreatedOut(id=request_id, status="requested", url="/requests")
