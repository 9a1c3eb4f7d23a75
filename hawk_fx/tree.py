"""Trees of values: tuple, list, dict, NamedTuple, dataclass, classes registered with
register_pytree_node, nested; None is an empty tree. Everything else is a leaf. A dict's keys may
be of any type that sorts (str, int, ...), as in JAX; its leaves keep the dict's own order."""
from __future__ import annotations

import dataclasses


class TreeDef:
    __slots__ = ("kind", "meta", "children", "_hash")

    def __init__(self, kind, meta=None, children=()):
        self.kind, self.meta, self.children = kind, meta, tuple(children)
        self._hash = None

    def __eq__(self, other):
        return (isinstance(other, TreeDef) and self.kind == other.kind and self.meta == other.meta
                and self.children == other.children)

    def __hash__(self):
        if self._hash is None:                  # trees are keys of staging caches: hash once
            self._hash = hash((self.kind, self.meta, self.children))
        return self._hash

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        if self.kind == "dict":
            return "{" + ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.meta, self.children)) + "}"
        if self.kind == "custom":
            return f"{self.meta[0].__name__}[{self.meta[1]!r}](" + ", ".join(map(repr, self.children)) + ")"
        if self.kind in ("namedtuple", "dataclass"):
            cls, names = self.meta
            return f"{cls.__name__}(" + ", ".join(f"{n}={c!r}" for n, c in zip(names, self.children)) + ")"
        inner = ", ".join(map(repr, self.children))
        return f"({inner},)" if self.kind == "tuple" else f"[{inner}]"

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind == "leaf" else sum(c.num_leaves for c in self.children)


LEAF = TreeDef("leaf")


def _dataclass_fields(cls):
    return tuple(f.name for f in dataclasses.fields(cls))


_REGISTERED: dict = {}         # class -> (flatten(x) -> (children, aux), unflatten(aux, children) -> x)


def register_pytree_node(cls, flatten, unflatten):
    """Make instances of `cls` tree nodes, as jax.tree_util.register_pytree_node: flatten(x) ->
    (children, aux_data), unflatten(aux_data, children) -> x; aux_data is static (hashable, compared
    by ==), the children are subtrees."""
    if not isinstance(cls, type):
        raise TypeError(f"register_pytree_node: takes a class, got {cls!r}")
    if cls in _REGISTERED or cls in (tuple, list, dict, type(None)):
        raise ValueError(f"register_pytree_node: {cls.__name__} is already a tree node type")
    if not callable(flatten) or not callable(unflatten):
        raise TypeError(f"register_pytree_node({cls.__name__}): flatten and unflatten must be functions")
    _REGISTERED[cls] = (flatten, unflatten)


def node_children(x):
    """(kind, meta, children) of a tree node, or None for a leaf or None."""
    reg = _REGISTERED.get(type(x))
    if reg is not None:
        kids, aux = reg[0](x)
        try:
            hash(aux)
        except TypeError:
            raise TypeError(f"{type(x).__name__}: its registered flatten returned aux data {aux!r:.60} that is not "
                            "hashable; aux data is static (compared and hashed, as in JAX): return a tuple") from None
        return "custom", (type(x), aux), list(kids)
    if isinstance(x, tuple):
        if hasattr(x, "_fields"):
            return "namedtuple", (type(x), tuple(x._fields)), tuple(x)
        return "tuple", None, x
    if isinstance(x, list):
        return "list", None, x
    if isinstance(x, dict):
        return "dict", tuple(x), [x[k] for k in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = _dataclass_fields(type(x))
        return "dataclass", (type(x), names), [getattr(x, n) for n in names]
    return None


def make_node(t: TreeDef, kids):
    """The container of TreeDef node `t` holding `kids`."""
    if t.kind == "tuple":
        return tuple(kids)
    if t.kind == "list":
        return list(kids)
    if t.kind == "dict":
        return dict(zip(t.meta, kids))
    cls, names = t.meta
    if t.kind == "custom":
        return _REGISTERED[cls][1](names, list(kids))
    if t.kind == "namedtuple":
        return cls(*kids)
    obj = object.__new__(cls)                   # frozen dataclasses and init=False fields too
    for n, v in zip(names, kids):
        object.__setattr__(obj, n, v)
    return obj


def tree_flatten(x, is_leaf=None, where="a tree of arrays"):
    leaves: list = []

    def go(x):
        if is_leaf is not None and is_leaf(x):
            leaves.append(x)
            return LEAF
        if x is None:
            return TreeDef("none")
        node = node_children(x)
        if node is None:
            leaves.append(x)
            return LEAF
        kind, meta, kids = node
        if kind == "dict" and not all(type(k) is str for k in meta):
            try:
                sorted(meta)
            except TypeError:
                raise TypeError(f"{where}: dict keys must sort together (as JAX requires), got {list(meta)!r}") \
                    from None
        return TreeDef(kind, meta, [go(c) for c in kids])

    return leaves, go(x)


def tree_unflatten(treedef: TreeDef, leaves):
    return _unflatten(treedef, iter(leaves))


def _unflatten(t, it):
    # a module-level recursion, not a closure: rebuilding a tree leaves no reference cycle
    if t.kind == "leaf":
        return next(it)
    if t.kind == "none":
        return None
    return make_node(t, [_unflatten(c, it) for c in t.children])


def tree_map(fn, tree, *rest, is_leaf=None):
    """fn over the leaves of `tree` (and the matching leaves of `rest`), in a tree of the same shape."""
    leaves, t = tree_flatten(tree, is_leaf=is_leaf)
    others = [tree_flatten(r, is_leaf=is_leaf)[0] for r in rest]
    return tree_unflatten(t, [fn(*xs) for xs in zip(leaves, *others)])
