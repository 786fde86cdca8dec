"""SVG badges for READMEs and model cards: "pcg | 12/15 pass" for a model, "pcg smoke | 93.3%" for a matrix.

A badge answers from the latest run (a model) or the newest run of that matrix name. It is always a 200 with an
image — a grey "no data" badge when there is nothing to show — because an <img> that 404s shows as broken, not
as "unknown". Colours run from red to green with the pass rate (passing / counted, as harness/reports counts).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from web import services
from web.deps import StoreDep, templates

router = APIRouter(prefix="/badge", tags=["badges"])
GREY = "#9f9f9f"
# (minimum pass rate, colour): shields.io's palette.
SCALE = ((1.0, "#4c1"), (0.9, "#97ca00"), (0.75, "#a4a61d"), (0.5, "#fe7d37"), (0.0, "#e05d44"))


def colour(rate: float | None) -> str:
    if rate is None:
        return GREY
    return next(c for floor, c in SCALE if rate >= floor)


def text_width(text: str) -> int:
    """Verdana 11px, roughly: wide letters and digits ~7px, narrow ones ~4px, plus padding."""
    narrow = sum(ch in "ifjlrt.:|!' /" for ch in text)
    return int(7 * (len(text) - narrow) + 4 * narrow) + 10


def badge(label: str, message: str, fill: str) -> Response:
    lw, mw = text_width(label), text_width(message)
    svg = templates.get_template("badge.svg").render(label=label, message=message, fill=fill, lw=lw, mw=mw)
    return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "max-age=300"})


def _message(s: services.RunSummary | None) -> tuple[str, str]:
    if s is None or s.cells == 0:
        return "no data", GREY
    if s.counted == 0:
        return "not run", GREY
    return f"{s.passing}/{s.counted} pass", colour(s.pass_rate)


@router.get("/model/{card_id}.svg", summary="A model card's cells in the latest run")
def model_badge(card_id: str, store: StoreDep) -> Response:
    return badge("pcg", *_message(services.model_summary(store, card_id)))


@router.get("/matrix/{name}.svg", summary="The newest run of a matrix (by name, e.g. smoke)")
def matrix_badge(name: str, store: StoreDep) -> Response:
    return badge(f"pcg {name}", *_message(services.matrix_summary(store, name)))
