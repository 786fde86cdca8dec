"""Reading a checkpoint's safetensors files tensor by tensor, and holding a scale to the shape a scheme uses:
what the linear and the expert loaders share."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from pcg_core.errors import UnsupportedModel

EIGHT_BIT = (torch.float8_e4m3fn, torch.int8)  # stored dtypes that mean "quantized"


class CheckpointTensors:
    """Every tensor of a checkpoint's safetensors files, read on demand (each file opened once); remembers which
    were used, so a loader can refuse files it did not fully understand."""

    def __init__(self, path: Path):
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise UnsupportedModel(f"{path}: no .safetensors files")
        self.path = path
        self._files = files
        self._handles = [safe_open(f, framework="pt") for f in files]
        self._where: dict[str, int] = {k: i for i, h in enumerate(self._handles) for k in h.keys()}
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def keys(self) -> list[str]:
        return list(self._where)

    def file_of(self, key: str) -> str:
        """The name of the file that holds `key`, for messages that point at it."""
        return self._files[self._where[key]].name

    def stored_dtype(self, key: str) -> str:
        """The tensor's dtype as the file header names it (U8, BF16, F8_E4M3 …), without reading it or counting it
        as used."""
        return self._handles[self._where[key]].get_slice(key).get_dtype()

    def get(self, key: str) -> torch.Tensor:
        self.used.add(key)
        return self._handles[self._where[key]].get_tensor(key)

    def companion(self, packed: str, key: str, fmt: str) -> torch.Tensor:
        """Tensor `key`, which format `fmt` stores beside every quantized tensor like `packed`: a packed weight
        without it is an error naming both, never a weight read without its scales."""
        if key not in self:
            raise UnsupportedModel(f"{self.path}: {packed} is there but {key} is missing ({fmt} stores it beside every "
                                   "quantized linear)")
        return self.get(key)

    def optional(self, key: str) -> torch.Tensor | None:
        return self.get(key) if key in self else None


def shaped(t: torch.Tensor, shape: tuple[int, ...], key: str, path: Path) -> torch.Tensor:
    """A scale in the shape the scheme uses: the same elements with fewer or more unit dimensions ([N] for
    [N, 1], [1] for a scalar) is accepted; anything else, a transposed scale of the same rank included, is an
    error."""
    numel = 1
    for d in shape:
        numel *= d
    squeezed = [d for d in t.shape if d != 1]
    want = [d for d in shape if d != 1]
    if t.numel() != numel or squeezed != want or (t.dim() == len(shape) and tuple(t.shape) != tuple(shape)):
        raise UnsupportedModel(f"{path}: {key} has shape {tuple(t.shape)}; expected {tuple(shape)}")
    if not t.dtype.is_floating_point:
        raise UnsupportedModel(f"{path}: {key} is {t.dtype}; scales are floating point")
    return t.float().reshape(shape)
