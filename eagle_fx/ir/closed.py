"""A closed Program: the first stage (Traced, as in JAX), what transforms hand each other.

A Program, the arrays bound to its inputs (Extern planes), the tree of its result and how its
result leaves are seen (a Jacobian's axes). Transforms read and make these without lowering
anything; the outermost call lowers the one it runs, once. The stages:

    Closed (traced)  --lowering.lower(closed, backend)-->  executable   (graph.Lowered holds both)
    Lowered.compile()  -->  Graph, the handle that replays it (Graph.from_closed)
"""
from __future__ import annotations

from collections import namedtuple

# what a record=True graph's staging knows that its Program does not (recording.py reads it):
# written: (input place, its Var on exit) of each argument it writes; labelled: the Vars of its
# labelled float buffers; shown: every value a name holds at the end; checkpoints: of each loop
Recording = namedtuple("Recording", "written labelled shown checkpoints")


class Closed:
    __slots__ = ("program", "planes", "tree", "n_results", "n", "backend", "mesh", "views", "record", "made", "extra",
                 "tree_args", "keep", "recording", "transformed", "part_of", "merged_by")

    def __init__(self, program, planes, tree, n_results, n, backend=None, mesh=None, views=None, record=False):
        self.program, self.planes, self.tree = program, list(planes), tree
        self.n_results, self.n, self.backend, self.mesh = n_results, n, backend, mesh
        self.views = views             # per result leaf: None, a shape, or a function of its array
        self.record = record           # staged from a record=True graph (transforms refuse it)
        self.made = []                 # planes of arrays a plain function computed from its arguments while staging
        self.extra = None              # what a transform keeps for its caller (vjp's pullback)
        self.tree_args = {}            # builder argument name -> (tree, leaf planes) of a tree argument, for bind
        self.keep = None               # Vars whose arrays outlive a replay (None: the result's)
        self.recording = None          # a record=True graph's Recording: lowered to its vjp's forward half
        self.transformed = True        # runs where transforms run: NumPy, or 'jax' (False: a builder's own
        #                                graph, whose backend=None is chosen by its arrays and use_backend)
        self.part_of = None            # (closed, j): leaf j of that one's result, handed out inside a transform
        self.merged_by = None          # the nested vmap whose planes hold its arguments reshaped (B2 * B1, ...)

    def derive(self, program, planes, tree, n_results, views=None):
        """A closed Program a transform made from this one: the same sample count, backend and
        argument names, its planes (in this one's order, then any it adds), its result."""
        c = Closed(program, planes, tree, n_results, self.n, self.backend, self.mesh, views)
        c.tree_args, c.merged_by = self.tree_args, self.merged_by
        return c

    @property
    def has_result(self):
        return self.tree is not None

    @property
    def arrays(self):
        """The arrays bound to the Program's inputs now."""
        return [e.array for e in self.planes]

    @property
    def names(self):
        return [e.name for e in self.planes]

    def result_vars(self):
        """(the Program's Vars of the result leaves, the result tree)."""
        return list(self.program.outputs[:self.n_results]), self.tree

    def kept(self):
        """The Vars whose arrays must outlive a replay."""
        return set(self.program.outputs[:self.n_results]) if self.keep is None else self.keep


def closed_of(g):
    """The closed Program of a Graph (or a Closed itself)."""
    return g if isinstance(g, Closed) else g.closed
