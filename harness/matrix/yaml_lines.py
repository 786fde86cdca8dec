"""YAML with line numbers: so a validation error can say which line of which file is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pcg_core.errors import ConfigError


def load_yaml_with_lines(path: Path) -> tuple[Any, dict[tuple, int]]:
    """The parsed document and a map from each key/item path (tuple of keys and indices) to its 1-based line."""
    text = path.read_text()
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from e
    lines: dict[tuple, int] = {}

    def walk(node: Any, prefix: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path_ = prefix + (key.value,)
                lines[path_] = key.start_mark.line + 1
                walk(value, path_)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[prefix + (i,)] = item.start_mark.line + 1
                walk(item, prefix + (i,))

    if root is not None:
        walk(root, ())
    return data, lines


def line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    """Line of the longest prefix of `loc` that the document has (pydantic locs may go deeper than the YAML)."""
    for n in range(len(loc), 0, -1):
        if tuple(loc[:n]) in lines:
            return lines[tuple(loc[:n])]
    return None
