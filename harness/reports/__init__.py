"""Reports of a harness run: a flat results frame, summary.md, report.json, support-matrix CSVs, run diffs.

Inputs are what the store hands over (a run as harness.store.rows.RunRow, its cells as CellRecord); nothing here
touches a database.
"""

from harness.reports.diff import LatencyChange, RunDiff, SpeedupChange, StatusChange, diff_markdown, diff_runs
from harness.reports.frame import cell_speedup, results_frame
from harness.reports.json_report import report_dict
from harness.reports.matrices import PAIRS, SYMBOLS, aggregate_symbol, support_matrices
from harness.reports.stats import Totals, geomean, totals
from harness.reports.summary import summary_markdown
from harness.reports.write import write_report

__all__ = [
    "PAIRS", "SYMBOLS", "LatencyChange", "RunDiff", "SpeedupChange", "StatusChange", "Totals", "aggregate_symbol", "cell_speedup",
    "diff_markdown", "diff_runs", "geomean", "report_dict", "results_frame", "summary_markdown", "support_matrices",
    "totals", "write_report",
]
