"""A prefix cache over KV pages, as a serving engine's radix cache: a finished sequence's pages stay, keyed by the
tokens they hold, and a later prompt that starts with those tokens starts from them instead of computing them again.

A tree of pages: each node one page, its key the page_size tokens it holds (a sequence's last, partly filled page is
a leaf with fewer). A prompt walks down by whole pages; the pages it walks are shared with it read-only (they join
its block table; it writes pages of its own after them). Where the match goes on inside a page (a prefix that ends
mid-page, or a partly filled leaf), that page is copied into the sequence's first own page up to the match
(copy-on-write), and the sequence computes on from there — so its first computed position is not a page boundary.
At least the prompt's last token is always computed: its row gives the first output token.

The cache holds its pages in the KVCache (KVCache.hold), so they outlive their sequences; leaves no live sequence
reads are evicted least recently used first when a prompt needs pages. A KVCache.reset forgets them all: the cache
then finds itself empty (it compares the KVCache's epoch).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from pcg_core.attention.kv_cache import KVCache


@dataclass
class _Node:
    page: int
    tokens: tuple[int, ...]  # the tokens this page holds (page_size of them, fewer in a partly filled leaf)
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    used: int = 0  # the cache's clock when last matched or inserted


@dataclass(frozen=True)
class PrefixMatch:
    """What a prompt starts from: `shared` whole pages (its positions 0 .. len(shared) · page_size − 1), then `copied`
    more positions copied from page `copy_page`; `length` positions in all are not computed again."""

    shared: tuple[int, ...] = ()
    copy_page: int | None = None
    copied: int = 0
    page_size: int = 1

    @property
    def length(self) -> int:
        return len(self.shared) * self.page_size + self.copied


class PrefixCache:
    """The pages of finished sequences, by the tokens they hold (module docstring). One per KVCache."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self._root = _Node(-1, (), None)
        self._epoch = cache.epoch
        self._clock = 0

    def _fresh(self) -> None:
        if self._epoch != self.cache.epoch:  # the KVCache was reset: every page it held is gone
            self._root, self._epoch = _Node(-1, (), None), self.cache.epoch

    def _tick(self, node: _Node | None) -> None:
        self._clock += 1
        while node is not None and node is not self._root:
            node.used = self._clock
            node = node.parent

    def match(self, prompt: list[int]) -> PrefixMatch:
        """The longest cached prefix of `prompt`, at most len(prompt) − 1 tokens."""
        self._fresh()
        ps, limit = self.cache.page_size, len(prompt) - 1
        shared: list[int] = []
        node = self._root
        while (len(shared) + 1) * ps <= limit:
            child = node.children.get(tuple(prompt[len(shared) * ps : (len(shared) + 1) * ps]))
            if child is None or len(child.tokens) < ps:
                break
            node = child
            shared.append(child.page)
        start = len(shared) * ps
        rest = prompt[start : min(start + ps, limit)]
        best, copied = None, 0
        for child in node.children.values():  # the page the match goes on inside, if any
            n = _common(child.tokens, rest)
            if n > copied:
                best, copied = child, n
        self._tick(best or node)
        return PrefixMatch(tuple(shared), None if best is None else best.page, copied, ps)

    def insert(self, tokens: list[int], pages: list[int]) -> None:
        """A finished sequence's pages (its block table) holding the KV of `tokens` (prompt and every generated
        token it was fed): each page the tree lacks is added and held; a page whose tokens it has is left to the
        sequence (freed with it)."""
        self._fresh()
        ps = self.cache.page_size
        node = self._root
        for k in range(-(-len(tokens) // ps)):
            key = tuple(tokens[k * ps : (k + 1) * ps])
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(pages[k], key, node)
                self.cache.hold(pages[k])
            self._tick(child)
            if len(key) < ps:
                return
            node = child

    def evict(self, pages: int, keep: Collection[int] = frozenset()) -> int:
        """Let go of up to `pages` leaf pages, least recently used first (not those in `keep`, nor a page a live
        sequence reads); returns how many were freed."""
        self._fresh()
        freed = 0
        while freed < pages:
            # a leaf only this cache holds (a live sequence reading it holds it too)
            leaves = [n for n in self._nodes() if not n.children and n.page not in keep and self.cache.holders(n.page) == 1]
            if not leaves:
                break
            leaf = min(leaves, key=lambda n: n.used)
            assert leaf.parent is not None  # _nodes() walks below the root
            del leaf.parent.children[leaf.tokens]
            self.cache.unhold(leaf.page)
            freed += 1
        return freed

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    @property
    def pages(self) -> list[int]:
        """The pages the cache holds."""
        self._fresh()
        return sorted(n.page for n in self._nodes())

    def clear(self) -> None:
        """Let every page go."""
        self._fresh()
        for n in self._nodes():
            self.cache.unhold(n.page)
        self._root = _Node(-1, (), None)


def _common(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
