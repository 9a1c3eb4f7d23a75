"""Trees of arrays, as every eagle_fx transform and eagle_fx.to_jax read their arguments and results.

    leaves, treedef = eagle_fx.tree.tree_flatten({"w": w, "b": (b0, b1)})
    eagle_fx.tree.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    eagle_fx.tree.register_pytree_node(Point, lambda p: ((p.x, p.y), None), lambda aux, kids: Point(*kids))

Nodes: tuple, list, dict, NamedTuple, dataclass and registered classes; None is an empty tree;
anything else is a leaf. As in JAX, except that a dict's leaves keep the dict's own order (JAX
sorts its keys). A class registered here is a node for every transform (grad of a function taking
a Point returns a Point); register it with jax.tree_util too to pass it through jax.jit.
"""
from __future__ import annotations

from hawk_fx.tree import LEAF, TreeDef, register_pytree_node
from hawk_fx.tree import tree_flatten as _flatten
from hawk_fx.tree import tree_map, tree_unflatten

__all__ = ["tree_flatten", "tree_unflatten", "tree_leaves", "tree_structure", "tree_map", "register_pytree_node",
           "TreeDef", "LEAF"]


def tree_flatten(tree, is_leaf=None):
    """(the leaves of `tree`, left to right, its TreeDef)."""
    return _flatten(tree, is_leaf=is_leaf)


def tree_leaves(tree, is_leaf=None):
    """The leaves of `tree`, left to right."""
    return _flatten(tree, is_leaf=is_leaf)[0]


def tree_structure(tree, is_leaf=None):
    """The TreeDef of `tree` (tree_unflatten(treedef, leaves) rebuilds a tree of this shape)."""
    return _flatten(tree, is_leaf=is_leaf)[1]
