"""pcg_core's import graph (tests/import_graph.py reads it): no cycle, no upward arrow, and error types that cost no
torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from import_graph import MODULES as ALL_MODULES
from import_graph import ROOT, edges, find_cycles, raw_imports

PACKAGE = "pcg_core"
MODULES = {n: p for n, p in ALL_MODULES.items() if n == PACKAGE or n.startswith(PACKAGE + ".")}
GRAPH = {name: {t for t in edges(name) if t in MODULES} for name in MODULES}


def test_the_graph_is_read_from_every_module():
    assert {"pcg_core.errors", "pcg_core.config", "pcg_core.capture.base", "pcg_core.attention.kv_cache"} <= set(GRAPH)
    assert "pcg_core.config" in GRAPH["pcg_core.capture.base"]
    assert "pcg_core.attention" in GRAPH["pcg_core.engine.engine"]  # the package itself runs too


def test_the_cycle_finder_finds_a_planted_cycle():
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted["pcg_core.config"].add("pcg_core.capture")
    assert any({"pcg_core.config", "pcg_core.capture"} <= set(c) for c in find_cycles(planted))


def test_pcg_core_has_no_import_cycle():
    assert find_cycles(GRAPH) == []


def _reaches(name: str, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(t for t in raw_imports(name) if t.startswith(prefixes))


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n == "pcg_core.forward_context" or n.startswith("pcg_core.attention")))
def test_attention_and_the_forward_context_do_not_reach_up(name):
    assert _reaches(name, ("pcg_core.engine", "pcg_core.capture", "pcg_core.model")) == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("pcg_core.quant")))
def test_quantization_is_below_the_model_it_is_loaded_into(name):
    """model/loader imports quant (checkpoints), capabilities reads its schemes: quant itself knows only torch."""
    assert _reaches(name, ("pcg_core.engine", "pcg_core.capture", "pcg_core.model", "pcg_core.attention")) == []


def test_config_is_below_capture():
    assert _reaches("pcg_core.config", ("pcg_core.capture", "pcg_core.engine", "pcg_core.model")) == []


def test_no_module_imports_through_the_lazy_package_root():
    offenders = sorted(n for n in MODULES if n != PACKAGE and PACKAGE in raw_imports(n))
    assert offenders == []


@pytest.mark.parametrize("name, allowed", [("pcg_core.errors", set()), ("pcg_core.registry", {"pcg_core.errors"})])
def test_error_and_registry_modules_need_only_the_standard_library(name, allowed):
    third_party = {t for t in raw_imports(name) if t.split(".")[0] not in sys.stdlib_module_names}
    assert third_party <= allowed, third_party - allowed


def test_errors_import_without_torch_or_transformers():
    # None in sys.modules makes any import of that name fail: torch and transformers cannot be loaded at all.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['transformers'] = None\n"
        "import pcg_core.errors\n"
        "from pcg_core.errors import ConfigError, UnsupportedModel\n"
        "from pcg_core import ConfigError as Lazy\n"
        "assert Lazy is ConfigError and issubclass(UnsupportedModel, ConfigError)\n"
        "assert ConfigError('m', field='layers').field == 'layers'\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_package_exports_load_lazily_and_keep_their_old_homes():
    import pcg_core
    import pcg_core.config
    import pcg_core.errors
    import pcg_core.model

    assert {"CaptureConfig", "ConfigError", "Engine", "EngineConfig", "SequenceOutput", "UnsupportedModel",
            "default_bucket_ladder", "load_model"} <= set(pcg_core.__all__)
    for name in pcg_core.__all__:
        assert getattr(pcg_core, name) is not None
    assert pcg_core.ConfigError is pcg_core.errors.ConfigError
    assert pcg_core.UnsupportedModel is pcg_core.errors.UnsupportedModel
    with pytest.raises(AttributeError):
        pcg_core.no_such_name  # noqa: B018


# pcg_core/quant/'s rooms, lowest first: the math, the kernels over it, the layers calling the kernels, the formats
# filling the layers; the top level (twin, calibrate, synthetic_weights) may use them all.
QUANT_ROOMS = {"schemes": 0, "kernels": 1, "layers": 2, "formats": 3}


def _quant_floor(name: str) -> int:
    parts = name.split(".")
    return QUANT_ROOMS.get(parts[2], len(QUANT_ROOMS)) if len(parts) > 2 else len(QUANT_ROOMS)


def quant_upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} → {b}" for a, targets in graph.items() if a.startswith("pcg_core.quant.")
                  for b in targets if b.startswith("pcg_core.quant.") and _quant_floor(b) > _quant_floor(a))


def test_quantization_rooms_import_only_downward():
    assert {"pcg_core.quant.schemes.registry", "pcg_core.quant.kernels.fp8_gemm", "pcg_core.quant.layers.linear",
            "pcg_core.quant.formats.detect"} <= set(GRAPH)
    assert quant_upward(GRAPH) == []
    inside = sorted(n for n in MODULES if n.startswith("pcg_core.quant.") and "pcg_core.quant" in raw_imports(n))
    assert inside == []  # the lazy package root is for callers outside quant/


@pytest.mark.parametrize("src, dst", [("pcg_core.quant.schemes.w8a8", "pcg_core.quant.kernels.fp8_gemm"),
                                      ("pcg_core.quant.kernels.w4a8_gemm", "pcg_core.quant.layers.int4_linear"),
                                      ("pcg_core.quant.layers.linear", "pcg_core.quant.formats.detect")])
def test_a_planted_upward_quant_import_is_caught(src, dst):
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted[src].add(dst)
    assert f"{src} → {dst}" in quant_upward(planted)


def test_the_scheme_registry_needs_only_the_standard_library():
    assert {t for t in raw_imports("pcg_core.quant.schemes.registry") if t.split(".")[0] not in sys.stdlib_module_names} == set()
