"""The one scheme registry (pcg_core/quant/schemes/registry.py): every scheme declared once and read by every
vocabulary, aliases that keep stored runs readable, and family patterns that select schemes by what they are."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pcg_core.quant.schemes import registry

ROOT = Path(__file__).resolve().parents[3]
SCHEME_CLASSES = {"Scheme", "Int4Scheme", "Fp4Scheme", "SchemeInfo"}


def _scheme_literals(path: Path, root: Path = ROOT) -> list[str]:
    """Places in `path` that declare a scheme: a scheme class called with a literal name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in SCHEME_CLASSES:
            first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
            if isinstance(first, ast.Constant) and first.value in registry.SCHEME_INFO:
                out.append(f"{path.relative_to(root)}:{node.lineno} {first.value}")
    return out


def test_each_scheme_is_declared_in_one_place():
    """No scheme is declared outside the registry: the math tables, the loader's checkpoint variants and the
    vocabularies build on it (a second `Fp4Scheme("fp4", …)` is how NVFP4 came to have two names)."""
    sources = [p for p in (ROOT / "pcg_core").rglob("*.py")] + [p for p in (ROOT / "harness").rglob("*.py")]
    found = [hit for p in sources for hit in _scheme_literals(p)]
    assert all(hit.startswith("pcg_core/quant/schemes/registry.py") for hit in found), found
    assert len(found) == len(registry.SCHEME_INFO), found  # each declared exactly once


def test_the_scanner_sees_a_second_declaration(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('Fp4Scheme("nvfp4", 16, "a second NVFP4")\nx = Int4Scheme(name="awq", group=64)\n')
    assert [h.split(" ")[1] for h in _scheme_literals(planted, tmp_path)] == ["nvfp4", "awq"]


def test_every_table_reads_the_registry():
    from pcg_core.capabilities import QUANTIZATION, capabilities
    from pcg_core.known import KNOWN_QUANTIZATION
    from pcg_core.quant import FP4_SCHEMES, INT4_SCHEMES, SCHEMES, get_scheme
    from pcg_core.quant.schemes.w8a8 import INT8_STATIC

    runnable = [n for n, s in registry.SCHEME_INFO.items() if s.matrix]
    assert list(QUANTIZATION) == ["none", *runnable]
    assert [*SCHEMES, *INT4_SCHEMES, *FP4_SCHEMES] == runnable
    assert INT8_STATIC.name in registry.SCHEME_INFO and not registry.SCHEME_INFO[INT8_STATIC.name].matrix
    assert set(runnable) | set(registry.ALIASES) <= set(KNOWN_QUANTIZATION)
    table = capabilities()["quant_schemes"]
    assert list(table) == runnable
    for name, s in registry.SCHEME_INFO.items():
        math = get_scheme(name)
        assert math.name == name and math.description == s.description
        assert math.kind == s.weights  # the math object's number type is the declaration's
        if s.matrix:
            assert table[name]["layer"] == s.layer and table[name]["formats"] == list(s.formats)
        for k in s.kernels:
            assert (ROOT / "pcg_core" / "quant" / "kernels" / f"{k}.py").is_file(), (name, k)


def test_the_layer_a_scheme_declares_is_the_one_quantize_model_installs():
    import torch

    from pcg_core.quant import get_scheme, quantize_model

    for name, s in registry.SCHEME_INFO.items():
        if not s.matrix:
            continue
        model = torch.nn.Sequential(torch.nn.Linear(256, 128))
        quantize_model(model, get_scheme(name), skip=(), input_absmax={"0": 1.0})
        assert type(model[0]).__name__ == s.layer, (name, type(model[0]).__name__)


def test_nvfp4_is_the_name_and_fp4_its_alias():
    from pcg_core.quant import get_scheme

    assert "nvfp4" in registry.MATRIX_SCHEMES and "fp4" not in registry.MATRIX_SCHEMES
    assert registry.canonical("fp4") == "nvfp4" and get_scheme("fp4") is get_scheme("nvfp4")
    with pytest.raises(KeyError, match="not one of"):
        get_scheme("fp5")


@pytest.mark.parametrize("pattern, chosen", [
    ("family:w8a8", ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8"]),
    ("family:w?a8", ["fp8_per_tensor", "fp8_per_token", "fp8_block", "int8_w8a8", "w4a8", "w4afp8"]),
    ("family:w4a16", ["awq", "gptq", "nvfp4", "mxfp4"]),
    ("family:fp4", ["nvfp4", "mxfp4"]),
    ("family:int4", ["awq", "gptq", "w4a8", "w4afp8"]),
    ("family:w4a4", []),
    ("fp4", ["nvfp4"]),  # an alias in a pattern is its scheme
    ("*fp8*", ["fp8_per_tensor", "fp8_per_token", "fp8_block", "w4afp8"]),
])
def test_family_patterns_choose_schemes_by_what_they_are(pattern, chosen):
    values = ["none", *registry.MATRIX_SCHEMES]
    assert [v for v in values if registry.quant_matches(pattern, v)] == chosen


def test_the_registry_costs_no_torch():
    code = ("import sys\nsys.modules['torch'] = None\nsys.modules['transformers'] = None\n"
            "from pcg_core.quant.schemes import registry\nfrom pcg_core.known import KNOWN_QUANTIZATION\n"
            "assert 'nvfp4' in KNOWN_QUANTIZATION and registry.canonical('fp4') == 'nvfp4'\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
