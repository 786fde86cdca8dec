"""ci/workflows: the workflow files parse, and what they run exists — every `pcgh` command line parses with
pcgh's own parser, and every repository file they name is there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from harness.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "ci" / "workflows").glob("*.yml"))
NVLINK_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def _steps(doc: dict):
    for name, job in doc["jobs"].items():
        for step in job["steps"]:
            yield name, job, step


def test_the_three_workflows_are_there():
    assert {p.stem for p in WORKFLOWS} == {"pr", "nightly", "weekly"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_a_workflow_parses_and_runs_only_what_exists(path):
    doc = _load(path)
    assert doc["name"] and doc["on"] and doc["jobs"]
    parser = build_parser()
    for _, job, step in _steps(doc):
        assert "runs-on" in job and ("uses" in step or "run" in step), step
        for line in str(step.get("run", "")).splitlines():
            line = re.sub(r"\$\{\{[^}]*\}\}", "0", line.split("  #")[0]).strip()
            for part in re.split(r"&&|\|\||;", line):
                words = shlex.split(part)
                if words and words[0] == "pcgh":
                    args, unknown = parser.parse_known_args(words[1:])  # SystemExit on a bad flag
                    assert not unknown, (path.name, part)
                    for w in words[1:]:
                        if w.endswith((".yaml", ".yml")):
                            assert (ROOT / w).is_file(), (path.name, w)
                if words and words[0] == "bash" and len(words) > 1:
                    assert (ROOT / words[1]).is_file(), (path.name, words[1])


@pytest.mark.parametrize("name", ["nightly", "weekly"])
def test_gpu_workflows_run_on_self_hosted_gpus_with_nvlink_multicast_off(name):
    doc = _load(ROOT / "ci" / "workflows" / f"{name}.yml")
    for job in doc["jobs"].values():
        assert {"self-hosted", "gpu"} <= set(job["runs-on"])
        assert NVLINK_OFF.items() <= job["env"].items()
        assert "secrets.PCG_DB_URL" in job["env"]["PCG_DB_URL"]


def test_the_nightly_workflow_gates_with_pcgh_nightly_and_keeps_the_reports():
    doc = _load(ROOT / "ci" / "workflows" / "nightly.yml")
    runs = [s.get("run", "") for _, _, s in _steps(doc)]
    assert any(r.startswith("pcgh nightly ") for r in runs)
    uploads = [s for _, _, s in _steps(doc) if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and all(s.get("if") == "always()" for s in uploads)
