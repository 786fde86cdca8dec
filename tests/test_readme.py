"""The README is a front door that works: ≤ 6k characters, its set-up commands the ones CI and a new user run, every
`pcgh` command in it run here as written (in a folder of its own, where the main job's `pcg.db` is the default
database), its support table the one the capability table renders, every link in it and in docs/ a file that
exists, and docs/'s Python snippet run as written."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from harness.matrix.support_table import render, replace
from harness.store import Store

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _commands(text: str) -> list[str]:
    """Each line of the text's bash blocks, its trailing comment dropped."""
    out = []
    for lang, body in BLOCK.findall(text):
        if lang == "bash":
            out += [re.sub(r"\s+# .*$", "", line).strip() for line in body.splitlines() if line.strip()]
    return out


SETUP_MAIN, SETUP_TESTS, *USE = _commands(README)


def test_the_readme_is_a_front_door():
    assert len(README) <= 6000, f"README.md is {len(README)} characters; the rest belongs in docs/"
    assert SETUP_MAIN.startswith("pip install torch==2.13.0 && ") and "pcgh run harness/configs/quick.yaml" in SETUP_MAIN
    ci_last = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert SETUP_TESTS == ci_last, "the README's test command is the one CI runs (.ci/run's last line)"
    assert all(c.startswith("pcgh ") for c in USE), USE


def test_the_support_table_is_the_capability_tables():
    assert replace(README, render()) == README, "run: python -m harness.matrix.support_table --write README.md"


def test_the_support_table_lists_what_ships_not_a_plugin_registered_here(monkeypatch):
    """The suite registers fault backends (test_perturb, planted_*) in its own process; the README is not theirs
    (CI's whole run rendered them into the table once)."""
    from pcg_core.registry import ATTENTION_BACKENDS, CAPTURE_BACKENDS

    before = render()
    for registry, like in ((CAPTURE_BACKENDS, "piecewise"), (ATTENTION_BACKENDS, "sdpa")):
        monkeypatch.setitem(registry._classes, "plugin_x", type("PluginX", (registry.get(like),), {"name": "plugin_x"}))
    assert "plugin_x" in CAPTURE_BACKENDS.names() and "plugin_x" in ATTENTION_BACKENDS.names()
    assert render() == before


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS, ROOT / "web" / "README.md"], ids=lambda p: p.name)
def test_every_link_is_a_file_that_exists(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which is missing"


def test_the_gpu_commands_in_the_text_parse():
    """Inline `pcgh …` commands (the GPU ones cannot run here) are at least commands pcgh takes."""
    for cmd in re.findall(r"`(pcgh [^`]+)`", README):
        build_parser().parse_args(shlex.split(cmd)[1:])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The README's main job, its pcgh part as written, from a folder of its own: pcg.db lands there."""
    home = tmp_path_factory.mktemp("first-run")
    (home / "harness").symlink_to(ROOT / "harness")
    old = os.getcwd()
    os.chdir(home)
    try:
        yield home
    finally:
        os.chdir(old)


def _pcgh(command: str) -> int:
    return main(shlex.split(command)[1:])


def test_the_main_job_passes_and_says_how_long_it_took(first_run, capsys):
    assert _pcgh(SETUP_MAIN.split(" && ")[-1]) == 0
    out = capsys.readouterr().out
    with Store(str(first_run / "pcg.db")) as store:
        rows = store.results(store.run("latest").id)
    assert len(rows) == 13 and all(r.passed for r in rows), [(r.key, r.status, r.reason) for r in rows if not r.passed]
    assert {r.axes["graph"] for r in rows} == {"piecewise", "breakable", "full"}
    assert {r.axes["model"] for r in rows} == {"qwen3-0.6b:tiny", "qwen3-30b-a3b:tiny", "deepseek-v3:tiny"}
    assert re.search(r"run 1 \(quick, finished in \d+ min \d\d s\): 13 cells, 13 pass", out), out
    assert "full report: pcgh report 1" in out and "dashboard: pcgh serve" in out


@pytest.mark.parametrize("command", [c for c in USE if not c.startswith("pcgh serve")])
def test_each_use_command_runs_as_written(first_run, command, capsys):
    if not (first_run / "pcg.db").exists():
        pytest.skip("the main job did not run")
    assert _pcgh(command) == 0, capsys.readouterr()


def test_the_dashboard_command_serves_the_first_run(first_run):
    (serve,) = [c for c in USE if c.startswith("pcgh serve")]
    if not (first_run / "pcg.db").exists():
        pytest.skip("the main job did not run")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [*shlex.split(serve)[1:], "--port", str(port)]
    code = "import sys; from harness.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=first_run, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline, body = time.monotonic() + 60, None
        while body is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.3)
        assert body is not None, proc.stdout.read() if proc.poll() is not None else "no answer in 60 s"
        assert "quick" in body and "13" in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_python_snippet_in_the_docs_runs(tmp_path):
    (snippet,) = [body for lang, body in BLOCK.findall((ROOT / "docs" / "architecture.md").read_text()) if lang == "python"]
    r = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "'eager_fallbacks': 0" in r.stdout, r.stderr[-3000:]
