"""Uploads, for CI and the nightly job: a whole run with its cell results, a model request, and a maintainer's
acceptance of a request (the next nightly writes its card). Bearer token only.

A run goes in through Store.import_run, in one transaction with its own start and finish times, so an uploaded
run is stored as `pcgh run` stores one and a failure half-way writes nothing; the body is fully validated
first (web.schemas, web.upload_checks), so a bad row is a 422 — all of it in the upload worker (web.uploads), so
a big upload never stalls the pages.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from pydantic import ValidationError

from harness.request.schema import RequestReport, config_hash
from harness.store import RequestNotFound
from web import uploads
from web.deps import StoreDep, require_upload_token
from web.schemas import RequestCreatedOut, RequestIn, RunCreatedOut, RunIn

# RunIn in /openapi.json's components (app.py adds them): the route reads raw bytes, so FastAPI cannot derive it.
_run_schema = RunIn.model_json_schema(ref_template="#/components/schemas/{model}")
OPENAPI_COMPONENTS = {**_run_schema.pop("$defs", {}), "RunIn": _run_schema}

router = APIRouter(prefix="/api", tags=["upload"], dependencies=[Depends(require_upload_token)])


@router.post("/runs", status_code=status.HTTP_201_CREATED, response_model=RunCreatedOut,
             summary="Store a run and its cell results (Authorization: Bearer <token>)",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"$ref": "#/components/schemas/RunIn"}}}}})
async def upload_run(request: Request, store: StoreDep) -> RunCreatedOut:
    # The body is a RunIn, parsed and checked in the upload worker (web.uploads), not here on the event loop.
    done = await asyncio.wrap_future(uploads.submit(await request.body(), store))
    if "errors" in done:
        raise HTTPException(422, done["errors"])
    return RunCreatedOut(id=done["id"], cells=done["cells"], url=f"/runs/{done['id']}")


@router.post("/requests", status_code=status.HTTP_201_CREATED, response_model=RequestCreatedOut,
             summary="Queue a model for the matrix: the report `pcgh request --submit` sends (Authorization: Bearer <token>); "
                     "a model queued already keeps its one row, refreshed (200)")
def upload_request(body: RequestIn, store: StoreDep, response: Response) -> RequestCreatedOut:
    try:
        report = RequestReport.model_validate(body.model_dump())
    except ValidationError as e:
        raise HTTPException(422, e.errors(include_url=False, include_context=False)) from e
    # The report is kept whole as the verdict, as `pcgh request` keeps it locally; not what only the sender's
    # machine knows (its request id and duplicates). The raw config is kept apart: a card is written from it.
    verdict = report.model_dump(exclude={"request_id", "requested_before", "duplicates", "submitted", "config"})
    config = body.model_dump().get("config")
    if config is not None and (not isinstance(config, dict) or config_hash(config) != report.config_hash):
        raise HTTPException(422, "config: not the config.json the report's config_hash was taken of; send the "
                                 "config `pcgh request` read, unchanged")
    request_id, new = store.queue_request({"model": report.model, "revision": report.revision,
                                           "config_hash": report.config_hash, "architecture": report.architecture,
                                           "supported": report.supported, "verdict": verdict, "status": "requested",
                                           "card_id": report.card_id}, config=config, same_config=report.source != "hub")
    if not new:  # submitted again: the same row, its analysis refreshed, its status kept
        response.status_code = status.HTTP_200_OK
    return RequestCreatedOut(id=request_id, status=store.request(request_id).status, url="/requests")


@router.post("/requests/{request_id}/accept", response_model=RequestCreatedOut,
             summary="Accept a requested model for the nightly: the next nightly writes its card from the request's "
                     "config and runs it (Authorization: Bearer <token>)")
def accept_request(request_id: int, store: StoreDep) -> RequestCreatedOut:
    try:
        req = store.request(request_id)
    except RequestNotFound as e:
        raise HTTPException(404, str(e)) from e
    now = req.status
    if now == "requested":  # later statuses are the nightly's to set; accepting again changes nothing
        store.set_request_status(request_id, "accepted")
        now = "accepted"
    return RequestCreatedOut(id=request_id, status=now, url="/requests")
