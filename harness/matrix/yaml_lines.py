"""YAML with line numbers: so a validation error can say which line of which file is wrong.

The file is read once, within the limits of safe_yaml (size, UTF-8, aliases, duplicate keys), and the line map is
one pass over the composed nodes. An alias is walked once per use, like the data pydantic validates, which
safe_yaml has already bounded; so the walk is linear in the file, and never a bomb.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.safe_yaml import compose_and_load


def line_map(root: Node | None) -> dict[tuple, int]:
    """Each key/item path (tuple of keys and indices) → its 1-based line. Iterative: no recursion limit to hit."""
    lines: dict[tuple, int] = {}
    stack: list[tuple[Node, tuple]] = [(root, ())] if root is not None else []
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, MappingNode):
            # The last of a repeated key wins, as in the data: a mapping's own key overrides one merged by `<<`.
            last = {key.value: (key, value) for key, value in node.value if isinstance(key, ScalarNode)}
            for name, (key, value) in last.items():
                lines[(*prefix, name)] = key.start_mark.line + 1
                stack.append((value, (*prefix, name)))
        elif isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*prefix, i)] = item.start_mark.line + 1
                stack.append((item, (*prefix, i)))
    return lines


def load_yaml_with_lines(path: Path, what: str = "YAML file") -> tuple[Any, dict[tuple, int]]:
    """The parsed document and its line map; ConfigError naming the file (and line) for anything refused."""
    root, data = compose_and_load(path, what=what)
    return data, line_map(root)


def line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    """Line of the longest prefix of `loc` that the document has (pydantic locs may go deeper than the YAML)."""
    for n in range(len(loc), 0, -1):
        if tuple(loc[:n]) in lines:
            return lines[tuple(loc[:n])]
    return None
