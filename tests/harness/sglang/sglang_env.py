"""sglang 0.5.23's own ServerArgs parser, in an environment kept apart from pcg's.

sglang pins torch 2.14.1 and transformers 5.19, so it is never installed beside pcg: a virtual environment that
sees pcg's site-packages (torch for its imports) gets sglang with `--no-deps` and the few small packages its parser
imports on a CPU. Built once per machine (PCG_SGLANG_ENV, default ~/.cache/pcg/), from the package registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

from filelock import FileLock

from harness.sglang.flags import SGLANG_VERSION

PACKAGES = (f"sglang=={SGLANG_VERSION}", "pybase64==1.5.1", "triton==3.9.0", "pillow==13.0.0", "msgspec==0.23.0",
            "pyzmq==27.3.0", "aiohttp==3.14.5", "multidict==7.2.1", "yarl==1.25.1", "propcache==0.5.4",
            "aiohappyeyeballs==2.7.1", "aiosignal==1.4.0", "frozenlist==1.8.0")

# Run in that environment: each [label, argv] of stdin through `sglang serve`'s parser; out: the refused ones.
PARSE = """
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
refused = []
for label, argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            prepare_server_args(argv)
    except SystemExit:
        refused.append([label, err.getvalue().strip().splitlines()[-1:]])
print(json.dumps(refused))
"""


class EnvUnavailable(Exception):
    """The environment could not be built here (no package registry)."""


def sglang_python() -> Path:
    root = Path(os.environ.get("PCG_SGLANG_ENV", Path.home() / ".cache" / "pcg" / f"sglang-{SGLANG_VERSION}-env"))
    python = root / "bin" / "python"
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if (root / ".complete").is_file():
            return python
        venv.create(root, system_site_packages=True, with_pip=True, clear=True)
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *PACKAGES],
                             capture_output=True, text=True, timeout=1200)
        if pip.returncode:
            raise EnvUnavailable(f"pip install {' '.join(PACKAGES[:1])} …: {pip.stderr.strip()[-400:]}")
        (root / ".complete").touch()
    return python


def refused(argvs: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """The (label, sglang's error line) of every argv its parser refuses."""
    out = subprocess.run([str(sglang_python()), "-c", PARSE], input=json.dumps(argvs), capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode:
        raise RuntimeError(f"sglang's parser did not run ({sys.executable} beside it):\n{out.stderr[-2000:]}")
    return [(label, " ".join(lines)) for label, lines in json.loads(out.stdout.strip().splitlines()[-1])]
