"""A closed Program: what transforms hand each other.

A Program, the arrays bound to its inputs (Extern planes), the tree of its result and how its
result leaves are seen (a Jacobian's axes). Transforms read and make these without lowering
anything; the outermost call lowers the one it runs, once (`lower`).
"""
from __future__ import annotations


class Closed:
    __slots__ = ("program", "planes", "tree", "n_results", "n", "backend", "mesh", "views", "record", "made", "extra",
                 "tree_args")

    def __init__(self, program, planes, tree, n_results, n, backend=None, mesh=None, views=None, record=False):
        self.program, self.planes, self.tree = program, list(planes), tree
        self.n_results, self.n, self.backend, self.mesh = n_results, n, backend, mesh
        self.views = views             # per result leaf: None, a shape, or a function of its array
        self.record = record           # staged from a record=True graph (transforms refuse it)
        self.made = []                 # planes of arrays a plain function computed from its arguments while staging
        self.extra = None              # what a transform keeps for its caller (vjp's pullback)
        self.tree_args = {}            # builder argument name -> (tree, leaf planes) of a tree argument, for bind

    def derive(self, program, planes, tree, n_results, views=None):
        """A closed Program a transform made from this one: the same sample count, backend and
        argument names, its planes (in this one's order, then any it adds), its result."""
        c = Closed(program, planes, tree, n_results, self.n, self.backend, self.mesh, views)
        c.tree_args = self.tree_args
        return c

    @property
    def has_result(self):
        return self.tree is not None

    def result_vars(self):
        """(the Program's Vars of the result leaves, the result tree)."""
        return list(self.program.outputs[:self.n_results]), self.tree

    def lower(self, lazy=False):
        """The Graph running it (lowered now, or at its first run when `lazy`)."""
        from .graph import Graph
        return Graph._from_program(self.program, self.planes, self.tree, self.n_results, self.n, self.backend,
                                   self.mesh, views=self.views, lazy=lazy, closed=self)


def closed_of(g):
    """The closed Program of a Graph (or a Closed itself)."""
    return g if isinstance(g, Closed) else g._closed()
