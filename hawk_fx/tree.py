"""Trees of values: tuple, list, dict with string keys, nested; None is an empty tree."""
from __future__ import annotations


class TreeDef:
    __slots__ = ("kind", "meta", "children")

    def __init__(self, kind, meta=None, children=()):
        self.kind, self.meta, self.children = kind, meta, tuple(children)

    def __eq__(self, other):
        return (isinstance(other, TreeDef) and self.kind == other.kind and self.meta == other.meta
                and self.children == other.children)

    def __hash__(self):
        return hash((self.kind, self.meta, self.children))

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        if self.kind == "dict":
            return "{" + ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.meta, self.children)) + "}"
        inner = ", ".join(map(repr, self.children))
        return f"({inner},)" if self.kind == "tuple" else f"[{inner}]"

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind == "leaf" else sum(c.num_leaves for c in self.children)


LEAF = TreeDef("leaf")


def tree_flatten(x, is_leaf=None, where="a result tree"):
    leaves: list = []

    def go(x):
        if is_leaf is not None and is_leaf(x):
            leaves.append(x)
            return LEAF
        if x is None:
            return TreeDef("none")
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return TreeDef("tuple", None, [go(c) for c in x])
        if isinstance(x, list):
            return TreeDef("list", None, [go(c) for c in x])
        if isinstance(x, dict):
            keys = tuple(x)
            if not all(isinstance(k, str) for k in keys):
                raise TypeError(f"{where}: dict keys must be strings, got {[k for k in keys if not isinstance(k, str)]!r}")
            return TreeDef("dict", keys, [go(x[k]) for k in keys])
        leaves.append(x)
        return LEAF

    return leaves, go(x)


def tree_unflatten(treedef: TreeDef, leaves):
    it = iter(leaves)

    def go(t):
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return None
        kids = [go(c) for c in t.children]
        if t.kind == "tuple":
            return tuple(kids)
        if t.kind == "list":
            return kids
        return dict(zip(t.meta, kids))

    return go(treedef)
