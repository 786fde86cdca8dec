"""`pcgh cell` killed by SIGTERM (`timeout`, a device call's cell list running out of time) leaves where it was on
record: each phase's start and every thread's stack on stderr, then death by the signal as before."""

from __future__ import annotations

import io
import signal
import subprocess
import sys

# pcgh with the cell itself replaced by one that says it started, then hangs (as a cell stuck in a kernel would)
HANGING_CELL = """
import sys, time
import harness.cell

def hang(spec, on_phase):
    on_phase("load")
    print("cell started", file=sys.stderr, flush=True)
    time.sleep(600)

harness.cell.run_cell = hang
from harness.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_a_cell_killed_by_sigterm_writes_its_stacks_then_dies_of_the_signal(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HANGING_CELL, "cell", "--model", "qwen3-0.6b", "--tiny", "--graph",
                             "piecewise", "--device", "cpu", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stderr is not None
    first = proc.stderr.readline(), proc.stderr.readline()
    assert first[0].startswith("PCG-PHASE load at ") and first[1] == "cell started\n", "".join(first) + proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-2000:])
    assert out == ""  # no outcome claimed for a cell that did not finish
    # where it hung, innermost first: the hanging cell, called from pcgh cell's run
    assert "most recent call first" in err and "in hang" in err and "harness/cli/cell.py" in err, err[-2000:]


def test_a_cell_that_ends_takes_its_stack_writer_away(monkeypatch):
    """In process: armed while the cell runs, gone once it has ended (faulthandler.unregister says whether there was
    one), so a SIGTERM later in the process is what it was before; not armed over a stream with no file descriptor
    (a test's captured stderr)."""
    import argparse
    import faulthandler

    import harness.cli.cell as cell_cli

    monkeypatch.setattr(sys, "stderr", sys.__stderr__)  # a real file descriptor, as pcgh has
    monkeypatch.setattr(cell_cli, "_run", lambda args: 0)
    assert cell_cli.run(argparse.Namespace()) == 0
    assert faulthandler.unregister(signal.SIGTERM) is False  # taken away on the way out
    armed = []  # while the cell runs: there to take away
    monkeypatch.setattr(cell_cli, "_run", lambda args: armed.append(faulthandler.unregister(signal.SIGTERM)) or 0)
    assert cell_cli.run(argparse.Namespace()) == 0 and armed == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert cell_cli.run(argparse.Namespace()) == 0 and armed == [True, False]


def test_a_cell_s_phases_are_on_stderr_in_order(capsys):
    """pcgh cell tells stderr when each phase starts, with the seconds since the cell began, in the launcher's workers'
    marks (classify.py reads the names back); stdout keeps the one JSON outcome."""
    import json

    from harness.cli import main

    assert main(["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "piecewise", "--max-tokens", "32",
                 "--max-new-tokens", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    outcome = json.loads(out)
    lines = [line for line in err.splitlines() if line.startswith("PCG-PHASE ")]
    phases = [line.split()[1] for line in lines]
    assert phases == list(outcome["metrics"]["process"]["phase_s"]), err[-2000:]
    seconds = [float(line.split(" at ")[1].removesuffix(" s")) for line in lines]
    assert seconds == sorted(seconds)
    from harness.launcher.classify import last_phase

    assert last_phase(err) == phases[-1] == "latency"  # what the launcher reads from a dead cell's log
