"""What happened to a cell's process, in the judge's words."""

from __future__ import annotations

import re
import signal

from harness.launcher.watch import PHASE_MARK
from harness.outcome import Status

# A child that died without an outcome crashed in its phase: a failure, retried. Never eager_fail, whatever the
# phase: that is a verdict only the worker itself gives (the eager reference raised), and a kill, a segfault or
# a lost GPU in load or eager says nothing about the model. Capture has its own status; every other phase is
# fail_run.
_PHASE_STATUS = {"capture": Status.FAIL_CAPTURE}
_BEFORE_PHASES = "startup"  # died before its first phase marker: interpreter start, imports, plugins
_OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)


def last_phase(log: str) -> str | None:
    phases = re.findall(rf"^{PHASE_MARK} (\w+)", log, flags=re.MULTILINE)
    return phases[-1] if phases else None


def last_error_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith(PHASE_MARK)]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|error)\b", ln) or "Error:" in ln:
            return ln[:500]
    return lines[-1][:500] if lines else ""


def classify_death(returncode: int | None, timed_out: bool, log: str, timeout_s: float) -> tuple[Status, str]:
    """Status and reason for a child that left no result: a crash of the phase it died in (see _PHASE_STATUS)."""
    phase = last_phase(log) or _BEFORE_PHASES
    if timed_out:
        return Status.TIMEOUT, f"no result after {timeout_s:g}s (in phase {phase}); process group killed"
    if _OOM.search(log):
        return Status.OOM, f"out of memory in phase {phase}: {last_error_line(log)}"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return _PHASE_STATUS.get(phase, Status.FAIL_RUN), f"killed by {name} in phase {phase}"
    return _PHASE_STATUS.get(phase, Status.FAIL_RUN), f"exit code {returncode} in phase {phase}: {last_error_line(log)}"
