"""YAML read within bounds on what it expands to: nodes, bytes and depth, with aliases expanded.

A document's size on the wire says little: 150 KB of YAML holding 12,000 aliases of one 100 KiB string expands to
1.2 GB once constructed (and that is what ``submit.accepted`` would carry). So the composed node graph is measured
before anything is constructed from it: the composer returns an aliased node as the same object each time, so
sizes memoised by identity cost one visit per distinct node however far the aliases would expand, and the walk
stops as soon as a bound is passed. Nesting is bounded while composing too (``BoundedLoader``), so a deep
document is refused before the composer's own recursion gets near Python's limit.

Invariants: ``SafeLoader`` only (libyaml's ``CSafeLoader`` for a valid, shallow document: the same resolver and
constructor); nothing is constructed from a document over a bound; a refusal is a ``Refused`` naming the limit,
the size reached, the line where it was passed and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from taugrid.core.limits import YAML_MAX_DEPTH, YAML_MAX_NODES, size_text


class Refused(ValueError):
    """The document expands past a bound; ``line`` (1-based) is where the bound was passed, when known."""

    def __init__(self, message: str, fix: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message, self.fix, self.line = message, fix, line


@dataclass(frozen=True)
class Bounds:
    nodes: int = YAML_MAX_NODES
    json_bytes: int = 512 * 1024
    depth: int = YAML_MAX_DEPTH


def _too_deep(limit: int, line: int | None) -> Refused:
    return Refused(f"the document nests deeper than {limit} levels of lists and mappings (aliases expanded)",
                   "flatten the nested lists and mappings", line)


class BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses nesting past ``max_depth`` while composing (PyYAML's composer recurses twice a
    level, so a few hundred levels would otherwise end in ``RecursionError``)."""

    max_depth = YAML_MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > self.max_depth + 1:  # the root is level 0: a scalar at the top nests nothing
                raise _too_deep(self.max_depth, self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# libyaml's parser and composer, when PyYAML was built with it: composing a 577 KB platform takes 0.26 s of CPU
# there against 1.55 s in pure Python. Its composer recurses in C, where no depth check can be added, so it only
# reads a document whose nesting a flat pass over its events (libyaml's parser keeps a stack, it does not
# recurse) found shallow; anything it refuses is read again by the pure-Python loader, whose errors are the ones
# users see (their wording and lines), so the fast path changes the speed of a valid document's parse only.
_FAST_LOADER: type[Any] | None = getattr(yaml, "CSafeLoader", None)


def load(text: str, bounds: Bounds) -> tuple[yaml.Node | None, Any]:
    """The document's root node and its constructed value (None, None for an empty document).
    Raises ``Refused`` past a bound, ``yaml.YAMLError`` for invalid YAML."""
    if _FAST_LOADER is not None and _shallow(text, bounds.depth):
        try:
            return _compose_measured(_FAST_LOADER(text), bounds)
        except (yaml.YAMLError, ValueError):  # Refused and a text libyaml cannot encode are ValueErrors
            pass  # said again below, in the pure-Python loader's words
    loader = BoundedLoader(text)
    loader.max_depth = bounds.depth
    return _compose_measured(loader, bounds)


def _shallow(text: str, depth: int) -> bool:
    """Whether ``text`` nests fewer than ``depth`` levels of lists and mappings as written (aliases are measured
    later, on the composed graph); False for a text libyaml cannot parse, which the pure-Python loader reports."""
    assert _FAST_LOADER is not None
    level = 0
    try:
        for event in yaml.parse(text, Loader=_FAST_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                level += 1
                if level >= depth:
                    return False
            elif isinstance(event, yaml.CollectionEndEvent):
                level -= 1
    except (yaml.YAMLError, ValueError):
        return False
    return True


def _compose_measured(loader: Any, bounds: Bounds) -> tuple[yaml.Node | None, Any]:
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        measure(node, bounds)
        return node, loader.construct_document(node)
    finally:
        loader.dispose()


def measure(root: yaml.Node, bounds: Bounds) -> None:
    """Raise ``Refused`` when ``root`` expands past ``bounds``: more nodes, more bytes as JSON (what an event would
    carry), or deeper nesting than allowed; a recursive alias (``&a [*a]``) counts as endless nodes."""
    known: dict[int, tuple[int, int, int]] = {}  # id(node) → (nodes, JSON bytes, levels below it)
    on_path: set[int] = set()
    total = [0, 0]  # nodes and JSON bytes met so far on the walk: the earliest point a bound is passed

    def over(line: int) -> None:
        if total[0] > bounds.nodes:
            raise Refused(f"YAML aliases expand this document to more than {bounds.nodes} nodes (at least "
                          f"{total[0]}): nested anchors and aliases (a \"billion laughs\") are refused",
                          "write the values out, or use fewer nested anchors (*alias)", line)
        if total[1] > bounds.json_bytes:
            raise Refused(f"YAML aliases expand this document to more than {size_text(bounds.json_bytes)} (at "
                          f"least {total[1]} bytes as JSON): repeating a large value through aliases is refused",
                          "write each large value once, or ship large data as a file in the project folder",
                          line)

    def size(node: yaml.Node, level: int, where: int) -> tuple[int, int, int]:
        """``where``: the line of this occurrence (an alias's own line is not kept: its key's, or its list's)."""
        got = known.get(id(node))
        if got is not None:
            total[0], total[1] = total[0] + got[0], total[1] + got[1]
            over(where)
            if level + got[2] > bounds.depth:
                raise _too_deep(bounds.depth, where)
            return got
        if id(node) in on_path:  # a recursive alias expands forever
            total[0] = bounds.nodes + 1
            over(where)
        if level > bounds.depth:
            raise _too_deep(bounds.depth, where)
        on_path.add(id(node))
        if isinstance(node, yaml.MappingNode):
            children = [(child, key.start_mark.line + 1) for key, value in node.value for child in (key, value)]
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, where if id(item) in known else item.start_mark.line + 1) for item in node.value]
        else:
            children = []
        if children or not isinstance(node, yaml.ScalarNode):
            nodes, length, below = 1, 2, 0  # a container and its brackets
        else:
            nodes, length, below = 1, len(msgspec.json.encode(str(node.value))), 0
        total[0], total[1] = total[0] + 1, total[1] + length
        over(where)
        for child, line in children:
            n, b, d = size(child, level + 1, line)
            nodes, length, below = nodes + n, length + b + 1, max(below, d + 1)  # and a ':' or ','
            total[1] += 1
        on_path.discard(id(node))
        known[id(node)] = (nodes, length, below)
        return nodes, length, below

    size(root, 0, root.start_mark.line + 1)
