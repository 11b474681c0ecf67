"""The retry where a config's own validator names two fields that must agree: its message read, the fields made to agree."""

from __future__ import annotations

import ast
import re

from halo_core.tiny.composite import _nodes


#: "`a` ... a multiple of N": a size a quantised layout wants aligned.
_MULTIPLE_OF = re.compile(r"`(\w+)`[^`]*?\bmultiple of (\d+)")
#: "`a` (x) must be below `b` (y)": a token id past the tiny vocabulary.
_MUST_BE_BELOW = re.compile(r"`(\w+)` \((\d+)\) must be (?:a class |an id )?below `(\w+)` \((\d+)\)")

_MUST_AGREE = (
    re.compile(r"`([\w.]+)` \(([^()]*)\) must (?:match|equal|be equal to) `([\w.]+)` \(([^()]*)\)"),
    re.compile(r"`([\w.]+)` \(([^()]*)\) and `([\w.]+)` \(([^()]*)\) must (?:be equal|match)"),
)


def _agreeing(default, kwargs: dict, message: str) -> dict | None:
    """``kwargs`` with the first field a "`a` (x) must match `b` (y)" validator message names set to y (or, for "must be
    below", to y - 1; for "`a` ... a multiple of N", up to the next multiple: Kolibri's NVFP4 ``head_dim``), or ``None``."""
    multiple = _MULTIPLE_OF.search(message)
    if multiple:
        field, factor = multiple.group(1), int(multiple.group(2))
        patched = _copy(kwargs)
        node = next((n for c, n in _nodes(default, patched) if isinstance(n.get(field), int)), None)
        if node is None or node[field] % factor == 0:
            return None
        node[field] = -(-node[field] // factor) * factor
        return patched
    below = _MUST_BE_BELOW.search(message)
    if below:
        field, _, bound_field, bound = below.groups()
        patched = _copy(kwargs)
        node = next((n for c, n in _nodes(default, patched) if n.get(bound_field) == int(bound) and hasattr(c, field)), None)
        if node is None or node.get(field) == int(bound) - 1:
            return None
        node[field] = int(bound) - 1
        return patched
    for pattern in _MUST_AGREE:
        found = pattern.search(message)
        if not found:
            continue
        left, left_value, right, right_value = found.groups()
        try:
            value = ast.literal_eval(right_value)
        except (ValueError, SyntaxError):
            return None
        if value is None:  # set the unset one to the other's value
            left, value = right, ast.literal_eval(left_value)
        *path, leaf = left.split(".")
        heads = {p.split(".")[0] for p in (left, right) if "." in p}
        patched = _copy(kwargs)
        node = _node_with(patched, heads) if heads else patched
        if node is None:
            return None
        for part in path:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        if node.get(leaf, object()) == value:
            return None
        node[leaf] = value
        return patched
    return None


def _copy(tree):
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _node_with(tree: dict, keys: set[str]) -> dict | None:
    """The shallowest sub-config (dict) of ``tree`` holding all ``keys``: the config whose validator named them."""
    queue = [tree]
    while queue:
        node = queue.pop(0)
        if keys <= node.keys():
            return node
        queue += [v for v in node.values() if isinstance(v, dict)]
    return None
