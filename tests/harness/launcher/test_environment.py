"""Provenance: the git sha of a run says whether the tree was the commit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.launcher.environment import git_sha, provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(autouse=True)
def _no_repository_above(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # a checkout around /tmp must not count


def test_git_sha_marks_an_edited_tree_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_sha(tmp_path) == head
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert git_sha(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert git_sha(tmp_path) == f"{head}-dirty"


def test_no_repository_gives_no_sha(tmp_path):
    assert git_sha(tmp_path) is None


def test_provenance_names_the_libraries():
    p = provenance()
    assert p["torch_version"] and p["transformers_version"] and p["host"]
