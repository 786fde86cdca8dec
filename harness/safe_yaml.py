"""Reading a YAML file someone else wrote, within limits: size, UTF-8, nesting, aliases, duplicate keys.

`yaml.safe_load` constructs only plain data, but plain data can still be enormous: nine levels of aliases ("billion
laughs") are a 1 KB file that expands to 10^9 values the moment anything walks it (our line map, pydantic), and
a duplicate key silently keeps the last value. So the document is composed by PyYAML's SafeLoader with a
composer that counts, as it goes, every alias and the size the document would have with aliases expanded, and
refuses before anything is constructed. Everything here is linear in the file's size.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from pcg_core.errors import ConfigError

# A matrix names axes and a few settings: the shipped ones are ~2 KB. 1 MiB is room for thousands of models with
# comments; anything bigger is not a matrix someone wrote by hand, and parsing it would take seconds.
MAX_YAML_BYTES = 1 << 20
# Values after alias expansion: a matrix needs a few thousand; this bounds what the line map and pydantic walk.
MAX_YAML_NODES = 200_000
# Alias uses (*name). Enough for `<<: *defaults` in every override; a bomb needs more, or trips the size above.
MAX_YAML_ALIASES = 100
# Nesting depth: a matrix is 4 deep, a model card's inline config ~6; the composer recurses per level.
MAX_YAML_DEPTH = 32

_MERGE_TAG = "tag:yaml.org,2002:merge"
# libyaml's own depth refusal (its problem text; 1000 levels by default since 0.2.6).
_LIBYAML_NESTING = "exceeded maximum nesting depth"


class _Refused(Exception):
    """A limit was hit at `line` (1-based; None: the whole file)."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line = line


class _BoundedComposer(Composer):
    """PyYAML's composer, counting as it composes: depth, alias uses, expanded size; refusing duplicate keys."""

    peek_event: Callable[[], Any]  # the parser's, mixed in beside this class (_PyLoader, _CLoader)

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # id(node) → values it stands for, aliases expanded

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _Refused(line, f"more than {MAX_YAML_ALIASES} aliases (*name); write the values out")
            node = cast(Node, super().compose_node(parent, index))  # the anchored node, or ComposerError for an unknown one
            if id(node) not in self._sizes:
                raise _Refused(line, f"alias *{event.anchor} refers to a value that contains it (a recursive document)")
            return node
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _Refused(line, f"nested deeper than {MAX_YAML_DEPTH} levels")
        node = cast(Node, super().compose_node(parent, index))  # never None (the stubs say Optional)
        self._depth -= 1
        if isinstance(node, SequenceNode):
            size = 1 + sum(self._sizes[id(c)] for c in node.value)
        elif isinstance(node, MappingNode):
            size = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        else:
            size = 1
        if size > MAX_YAML_NODES:
            raise _Refused(line, f"with its aliases expanded this value holds more than {MAX_YAML_NODES:,} values "
                                 "(a 'billion laughs' document?); write the values out")
        self._sizes[id(node)] = size
        return node

    # types-PyYAML types `anchor` as a dict; PyYAML passes the anchor's name (compose_node: `anchor = event.anchor`)
    def compose_mapping_node(self, anchor: str | None) -> MappingNode:  # type: ignore[override]
        node = super().compose_mapping_node(anchor)  # type: ignore[arg-type]
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
                continue  # `<<: *base` may repeat keys on purpose: the mapping's own keys override the merged ones
            line = key.start_mark.line + 1
            if (key.tag, key.value) in seen:
                first = seen[(key.tag, key.value)]
                raise _Refused(line, f"duplicate key {key.value!r} (first at line {first}); YAML keeps only the last")
            seen[(key.tag, key.value)] = line
        return node


class _PyLoader(_BoundedComposer, Reader, Scanner, Parser, SafeConstructor, Resolver):
    """Pure Python: the fallback, and what the tests hold the libyaml one to."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        _BoundedComposer.__init__(self)


_Loader: type = _PyLoader
try:  # libyaml scans and parses (~20x faster); composing stays in Python, above
    from yaml.cyaml import CParser  # type: ignore[attr-defined]  # there at run time; types-PyYAML's cyaml.pyi does not re-export it

    class _CLoader(_BoundedComposer, CParser, SafeConstructor, Resolver):
        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            _BoundedComposer.__init__(self)

    _Loader = _CLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    pass


def read_utf8(path: Path, max_bytes: int = MAX_YAML_BYTES, what: str = "YAML file") -> str:
    """The file's text; ConfigError naming the file if it is missing, over `max_bytes` or not UTF-8 (with the byte
    offset)."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what}")
    size = path.stat().st_size
    if size > max_bytes:
        raise ConfigError(f"{path}: {size:,} bytes, over the {max_bytes:,}-byte limit for a {what}")
    with path.open("rb") as f:
        raw = f.read(max_bytes + 1)  # the file may have grown since stat (or be a pipe)
    if len(raw) > max_bytes:
        raise ConfigError(f"{path}: over the {max_bytes:,}-byte limit for a {what}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}: not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} (line {line}); "
                          "save it as UTF-8") from None


def _yaml_error_text(path: Path, text: str, e: yaml.YAMLError) -> str:
    """One line: file:line, then PyYAML's context and problem (a ReaderError has a character offset instead).

    libyaml ≥ 0.2.6 (PyYAML 6.0.4's wheels) has a nesting limit of its own, and its scanner, reading ahead through
    `[[[…`, can reach it before our composer reaches ours: that refusal is ours too, in our words.
    """
    mark, position = getattr(e, "problem_mark", None), getattr(e, "position", None)
    if mark is not None:
        where = f"{path}:{mark.line + 1}"
    elif isinstance(position, int):
        where = f"{path}:{text.count(chr(10), 0, position) + 1}"
    else:
        where = str(path)
    if _LIBYAML_NESTING in (getattr(e, "problem", None) or ""):
        return f"{where}: nested deeper than {MAX_YAML_DEPTH} levels"
    if isinstance(e, yaml.reader.ReaderError):
        problem = f"character #x{e.character:04x} is not allowed in YAML" if isinstance(e.character, int) else e.reason
    else:
        problem = "; ".join(p for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p) or str(e)
    return f"{where}: not valid YAML: {problem}"


def compose_and_load(path: Path, what: str = "YAML file") -> tuple[Node | None, Any]:
    """The document's node tree (merge keys flattened) and its data, or ConfigError naming the file and line."""
    text = read_utf8(path, what=what)
    loader = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except _Refused as e:
        raise ConfigError(f"{path}:{e.line}: {e}" if e.line else f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_error_text(path, text, e)) from None
    except (ValueError, TypeError, RecursionError) as e:  # e.g. an int of more digits than Python converts
        raise ConfigError(f"{path}: a value cannot be read: {e}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return root, data
