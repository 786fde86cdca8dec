"""The compatibility dashboard: a FastAPI app over the harness's results store — matrix, cell, run, diff and
request pages, the same data as JSON under /api, SVG badges, and token-guarded uploads. `pcgh serve` runs it."""
