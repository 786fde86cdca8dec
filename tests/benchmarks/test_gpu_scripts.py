"""The device scripts keep NVLink multicast off: a program that uses it can put a host's shared GPUs out of service
(the device machines' rule), so every script exports the three switches itself or sources gpu_env.sh, which does,
before it starts anything; the ranks and torchrun processes it starts inherit them."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SWITCHES = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_SOURCE = re.compile(r'^\s*source\s+"?\$\(dirname "\$0"\)/gpu_env\.sh"?\s*$', re.MULTILINE)


def exported(text: str) -> dict[str, str]:
    """VAR=value pairs of the script's top-level `export` lines."""
    out: dict[str, str] = {}
    for line in re.findall(r"^export (.+?)(?:\s+#.*)?$", text, re.MULTILINE):
        out.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return out


def keeps_multicast_off(text: str) -> bool:
    first_run = re.search(r"^(?:python3?|timeout|torchrun|bash)\b", text, re.MULTILINE)
    head = text[: first_run.start()] if first_run else text
    return bool(_SOURCE.search(head)) or all(exported(head).get(k) == v for k, v in SWITCHES.items())


def test_every_device_script_keeps_nvlink_multicast_off():
    scripts = sorted(BENCH.glob("gpu_*.sh"))
    assert len(scripts) > 10
    assert {k: v for k, v in exported((BENCH / "gpu_env.sh").read_text()).items() if k in SWITCHES} == SWITCHES
    assert [p.name for p in scripts if not keeps_multicast_off(p.read_text())] == []


def test_a_script_that_starts_work_before_the_switches_is_caught():
    assert not keeps_multicast_off("set -o pipefail\npython3 -m harness.cli run x.yaml\nexport NCCL_NVLS_ENABLE=0\n")
    assert not keeps_multicast_off("export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1\npython3 x.py\n")  # one missing
    assert keeps_multicast_off('source "$(dirname "$0")/gpu_env.sh"\npython3 x.py\n')
