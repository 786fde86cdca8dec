"""The dashboard's cold start: a fresh process, from `import web.app` to the first response of each page.

A dashboard restarts on every deploy and every crash, and a lean one is what the store/web split is for, so
this measures what a restart costs: the import, building the app over a results database, and the first
response of `/` (the matrix) and `/api/runs`. Each sample is its own Python process (nothing cached in
memory); the median of `--repeat` samples is printed, with the heap objects and whether torch was imported.

    python benchmarks/web_cold_start.py --db nightly.db                       # this tree
    python benchmarks/web_cold_start.py --db nightly.db --base /tmp/old-tree  # and another, side by side

With `--base` the samples of the two trees alternate (base, this, base, this …) so that both see the same
machine load, and the ratio base / this of each median is printed last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import gc, json, sys, time
t0 = time.perf_counter()
import web.app
from fastapi.testclient import TestClient
t_import = time.perf_counter()
app = web.app.create_app(sys.argv[1])
client = TestClient(app)
t_app = time.perf_counter()
r = client.get("/")
assert r.status_code == 200, r.status_code
t_first = time.perf_counter()
r = client.get("/api/runs")
assert r.status_code == 200, r.status_code
t_api = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "app_s": t_app - t_import, "first_page_s": t_first - t_app,
                  "first_api_s": t_api - t_first, "total_s": t_api - t0, "torch_imported": "torch" in sys.modules,
                  "modules": len(sys.modules), "heap_objects": len(gc.get_objects())}))
"""


def sample(db: str, root: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, db], cwd=root, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"cold-start sample failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


KEYS = ("import_s", "app_s", "first_page_s", "first_api_s", "total_s")


def summary(samples: list[dict]) -> dict:
    med = {k: round(statistics.median(s[k] for s in samples), 3) for k in KEYS}
    first = samples[0]
    return {**med, "torch_imported": first["torch_imported"], "modules": first["modules"],
            "heap_objects": first["heap_objects"], "repeat": len(samples)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="results database (SQLite file or URL)")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the tree to import web from")
    p.add_argument("--base", help="another tree (a checkout of an older commit) to measure side by side")
    args = p.parse_args()
    trees = {"base": Path(args.base), "this": Path(args.root)} if args.base else {"this": Path(args.root)}
    samples: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, root in trees.items():
            samples[name].append(sample(args.db, root))
    results = {name: summary(s) for name, s in samples.items()}
    for name, r in results.items():
        print(json.dumps({"tree": name, **r}))
    if args.base:
        print(json.dumps({"ratio_base_over_this": {k: round(results["base"][k] / results["this"][k], 2) for k in KEYS
                                                   if results["this"][k] > 0}}))


if __name__ == "__main__":
    main()
