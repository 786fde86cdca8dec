"""The runtime's tests sit in rooms mirroring pcg_core/ (attention/, capture/, engine/, model/, linear_attention/,
quant/, distributed/); their shared helpers (pcg_helpers, triton_interpreter) stay here, put on the path for every
room below. The cross-cutting tests (the GPU replay matrix, imports, registry, config) stay at this level."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
