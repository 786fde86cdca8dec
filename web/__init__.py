"""The compatibility dashboard: a FastAPI app over the harness's results store — matrix, cell, run, diff and
request pages, the same data as JSON under /api, SVG badges, and token-guarded uploads. `python -m web` (or
`pcgh serve`) runs it. It reads the store through harness.store alone and never imports torch."""
