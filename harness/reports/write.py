"""Writes a run's reports into one folder: summary.md, report.json and one CSV per support matrix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from harness.outcome import CellRecord
from harness.reports.frame import results_frame
from harness.reports.json_report import report_dict
from harness.reports.matrices import support_matrices
from harness.reports.summary import summary_markdown
from harness.store.rows import RunRow


def csv_name(pair: str) -> str:
    """'model_x_graph' -> 'support_model_x_graph.csv'."""
    return f"support_{pair}.csv"


def write_report(run: RunRow | None, rows: Sequence[CellRecord], out_dir: str | Path) -> list[Path]:
    """Creates out_dir if needed, overwrites the files, returns their paths (summary, JSON, CSVs). UTF-8: the
    matrices are emoji."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.md", out / "report.json"]
    paths[0].write_text(summary_markdown(run, rows), encoding="utf-8")
    doc = json.dumps(report_dict(run, rows), indent=2, ensure_ascii=False, allow_nan=False)  # NaN was nulled
    paths[1].write_text(doc + "\n", encoding="utf-8")
    for pair, matrix in support_matrices(results_frame(rows)).items():
        path = out / csv_name(pair)
        matrix.to_csv(path, encoding="utf-8")
        paths.append(path)
    return paths
