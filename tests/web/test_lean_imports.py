"""The store, the reports and the dashboard import without torch or transformers (a box that only serves the
dashboard installs neither), and the dashboard reaches the runtime only for its error type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED + code], capture_output=True, text=True, cwd=ROOT)


def test_store_reports_and_dashboard_import_without_torch_or_transformers() -> None:
    r = _python("import web.app, web.__main__, harness.store, harness.reports")
    assert r.returncode == 0, r.stderr


def test_the_dashboard_imports_nothing_of_the_runtime_but_its_errors() -> None:
    r = _python("import web.app, web.__main__\n"
                "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('pcg_core', 'harness')))")
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.split())
    # the package root, its lazy-export recipe (standard library only), the error types, and the scheme registry
    # (standard library only: tests/pcg_core/test_imports.py) through its lazy packages, whose aliases match a
    # cell stored under a scheme's old name to today's; and the axis grammar (pcg_core.known, standard library and
    # that registry), which uploads are checked against
    assert {m for m in loaded if m.startswith("pcg_core")} <= {"pcg_core", "pcg_core.lazy", "pcg_core.errors", "pcg_core.quant",
                                                               "pcg_core.quant.schemes", "pcg_core.quant.schemes.registry",
                                                               "pcg_core.known"}
    assert not {m for m in loaded if m.startswith(("harness.cards", "harness.request.", "harness.launcher",
                                                   "harness.cell", "harness.cli"))} - {"harness.request.schema"}, loaded


def test_the_check_fails_when_torch_is_imported() -> None:
    assert _python("import torch").returncode != 0
