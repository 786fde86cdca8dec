"""Reading a checkpoint's safetensors files tensor by tensor, and holding a scale to the shape a scheme uses:
what the linear and the expert loaders share.

Which files are the checkpoint is decided as transformers and vLLM decide it, so that a file beside the model's
(Mistral repositories ship `consolidated.safetensors` beside the shards) is never read: the file config.json's
`transformers_weights` names, else the index's shards, else `model.safetensors`, else every `*.safetensors`
(safetensors_files).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from pcg_core.errors import UnsupportedModel

EIGHT_BIT = (torch.float8_e4m3fn, torch.int8)  # stored dtypes that mean "quantized"
SINGLE = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME
INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME


def _inside(name: object, path: Path) -> bool:
    """A file name that stays in the folder (transformers' check on shard names and transformers_weights)."""
    return isinstance(name, str) and bool(name) and not Path(name).anchor and ".." not in Path(name).parts


def read_index(path: Path, name: str = INDEX) -> dict[str, str]:
    """The weight_map (tensor → shard file name) of the index `name` in the folder `path`; an index that is not
    JSON, has no weight_map, or names a file outside the folder is an error naming it (a checkpoint read without
    it would be read from the wrong files)."""
    index = path / name
    try:
        data = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnsupportedModel(f"{index}: unreadable ({e}); it names the checkpoint's shards, so the weights cannot be "
                               "found without it: restore it, or remove it to read model.safetensors") from e
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UnsupportedModel(f"{index}: has no weight_map (tensor name → shard file); restore the index the shards "
                               "were written with")
    for key, shard in weight_map.items():
        if not _inside(shard, path):
            raise UnsupportedModel(f"{index}: weight_map puts {key} in {shard!r}, not a file name inside {path}")
    return weight_map


def index_of(path: Path, named: str | None = None) -> str | None:
    """The index file (its name in `path`) the checkpoint's files are resolved by, or None: the one config.json's
    `transformers_weights` names, else model.safetensors.index.json if it is there."""
    if named is not None:
        return named if named.endswith(".safetensors.index.json") else None
    return INDEX if (path / INDEX).is_file() else None


def safetensors_files(path: Path, named: str | None = None) -> list[Path]:
    """The checkpoint's weight files in the folder `path`, as transformers resolves them (modeling_utils,
    utils/hub.get_checkpoint_shard_files) and vLLM filters them (weight_utils.filter_duplicate_safetensors_files):
    model.safetensors.index.json → exactly the shards its weight_map names (each must exist); else
    model.safetensors; else every *.safetensors. An empty list: the folder has no weights. `named`: config.json's
    `transformers_weights`, a .safetensors file or an index in the folder that transformers reads instead.

    transformers prefers model.safetensors when both it and an index are there, vLLM the index's shards; a folder
    holding both, whose index does not name model.safetensors, is refused rather than read one way here and the
    other way by transformers' own loader."""
    if named is not None:
        if not _inside(named, path) or not named.endswith((".safetensors", ".safetensors.index.json")):
            raise UnsupportedModel(f"{path}/config.json: transformers_weights {named!r} is not a .safetensors file or a "
                                   ".safetensors.index.json inside the folder; it names the file transformers reads")
        if not (path / named).is_file():
            raise UnsupportedModel(f"{path}/config.json: transformers_weights names {named}, which is not in {path}")
    index = index_of(path, named)
    if index is not None:
        shards = sorted(set(read_index(path, index).values()))
        if missing := [s for s in shards if not (path / s).is_file()]:
            raise UnsupportedModel(f"{path / index}: names shard {missing[0]}"
                                   f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}, which is not in "
                                   f"{path}; download the missing shards (or the index is stale)")
        if named is None and (path / SINGLE).is_file() and SINGLE not in shards:
            raise UnsupportedModel(f"{path}: holds both {SINGLE} and {INDEX}, whose shards ({shards[0]}, …) do not include "
                                   f"it; transformers would read {SINGLE}, vLLM the index's shards: remove the stale one")
        return [path / s for s in shards]
    if named is not None:
        return [path / named]
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    return sorted(path.glob("*.safetensors"))


class CheckpointTensors:
    """Every tensor of a checkpoint's safetensors files (safetensors_files), read on demand (each file opened once);
    remembers which were used, so a loader can refuse files it did not fully understand. Opening checks the files
    against each other from their headers: no tensor in two files, and an index that agrees with its shards."""

    def __init__(self, path: Path, named: str | None = None):
        files = safetensors_files(path, named)
        if not files:
            raise UnsupportedModel(f"{path}: no .safetensors files")
        self.path, self.files = path, files
        self._handles = [safe_open(f, framework="pt") for f in files]
        self._where: dict[str, int] = {}
        for i, h in enumerate(self._handles):
            for k in h.keys():
                if k in self._where:  # one tensor twice: which copy is the model's is not known
                    raise UnsupportedModel(f"{path}: {k} is in both {files[self._where[k]].name} and {files[i].name}; "
                                           f"a checkpoint holds each tensor once (add {INDEX} naming the shards, or "
                                           "remove the extra file)")
                self._where[k] = i
        if (index := index_of(path, named)) is not None:
            _check_index(path / index, read_index(path, index), {k: files[i].name for k, i in self._where.items()})
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def keys(self) -> list[str]:
        return list(self._where)

    def file_of(self, key: str) -> str:
        """The name of the file that holds `key`, for messages that point at it."""
        return self.files[self._where[key]].name

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


def _check_index(index: Path, weight_map: dict[str, str], found: dict[str, str]) -> None:
    """The index agrees with its shards: each tensor it maps is in the shard it names, and each shard's tensor is
    in the map. A disagreement means the index or a shard is from another version of the checkpoint."""
    for key, shard in weight_map.items():
        if found.get(key) != shard:
            where = f"it is in {found[key]}" if key in found else "no shard holds it"
            raise UnsupportedModel(f"{index}: maps {key} to {shard}, but {where}; the index and the shards are from "
                                   "different versions of the checkpoint: download them again")
    if extra := sorted(set(found) - set(weight_map)):
        raise UnsupportedModel(f"{index}: does not name {extra[0]}"
                               f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}, which {found[extra[0]]} "
                               "holds; the index and the shards are from different versions of the checkpoint")


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
