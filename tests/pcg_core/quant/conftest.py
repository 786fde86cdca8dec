"""The quantization tests sit in rooms mirroring pcg_core/quant/; their shared helpers (pcg_helpers,
triton_interpreter) stay in tests/pcg_core, put on the path here for every room below."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
