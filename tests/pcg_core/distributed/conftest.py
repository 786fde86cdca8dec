"""The distributed tests' shared helpers stay in tests/pcg_core (pcg_helpers) and here (tp_ranks): both put on the
path, so spawned ranks (which inherit the parent's sys.path) import them too."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
