"""A builder called inside another builder, on the staged values of the graph being built, stages
its body into that graph: it inlines, as a jitted function called inside another jitted function
does. Its `eagle.Graph()` is then an `InlinedGraph`, a stand-in whose `.result` is the staged
values the caller keeps composing with; nothing is built or lowered for it.

A builder whose arguments hold no staged value of the graph being built builds its own graph, as
a builder called from plain code does (and a staged value of a third graph, one not the innermost
being built, is refused: no graph holds both).
"""
from __future__ import annotations

from hawk_fx.context import CONTEXT
from hawk_fx.tree import tree_flatten

from . import staging
from .staging import Plane, _finished, _refuse_foreign


def _leaves(bound):
    return tree_flatten((bound.args, bound.kwargs), is_leaf=lambda x: isinstance(x, Plane))[0]


def _who(graph) -> str:
    b = getattr(graph, "made_by", None)
    return f"the graph of builder {b.__name__}" if b is not None else "a hand-made graph"


def target(builder, bound):
    """The graph a builder call inlines into: the graph being built when a staged value of it is
    among the call's arguments; None when none is (the call builds its own graph). A staged value
    of any other graph is refused here, naming both graphs."""
    t = staging.active_trace()
    planes = [x for x in _leaves(bound) if isinstance(x, Plane)]
    if not planes:
        return None
    here = t.graph if t is not None and not t.graph.is_closed else None
    api = f"eagle_fx.Graph.builder {builder.__name__}"
    for p in planes:
        if p.graph is here:
            continue
        if _finished(p.graph):
            _refuse_foreign(p, f"{api}: an argument")
        at = f" (made at {p.info.where})" if p.info is not None and p.info.where else ""
        name = f" {p.label!r}" if p.label else ""
        now = f"{_who(here)} is the one being built" if here is not None else "no graph is being built here"
        raise ValueError(f"{api}, called at {staging._here()}: an argument is the staged value{name} of "
                         f"{_who(p.graph)}{at}, but "
                         f"{now}. A builder called inside another stages into the graph being built, so it takes "
                         "that graph's staged values (or arrays) only; pass the value through the builders in "
                         "between as an argument, or hand it over as a NumPy array after a launch")
    return here


class InlineContext:
    """The `building` frame of an inlined builder call: its `eagle.Graph()` is the stand-in."""

    planes: dict = {}        # no argument planes of its own (CONTEXT.building readers look for them)

    def __init__(self, builder, into):
        self.builder, self.into, self.graph = builder, into, None

    def make_graph(self):
        self.graph = InlinedGraph(self.builder, self.into)
        return self.graph


def call(builder, bound, into):
    """Run `builder` on `bound` with its kernel calls staged into `into`; return its stand-in graph."""
    enter = lambda arr: into.trace.plane_of_array(arr)      # arrays read at each replay, as a builder's are
    from .building import _wrap_arrays, check_returned
    args, kwargs = _wrap_arrays((tuple(bound.args), dict(bound.kwargs)), {}, enter)
    ctx = InlineContext(builder, into)
    with CONTEXT.enter(building=ctx, builder_sources=builder.source):
        ret = builder.converted(*args, **kwargs)
    check_returned(builder, ctx.graph, ret)
    return ret


_GRAPH_VERBS = frozenset(("launch", "enqueue", "synchronize", "build", "bind", "argument", "lower", "program",
                          "executable", "closed", "record", "result_copy", "to_dot", "array_of", "is_built",
                          "generation"))


class InlinedGraph:
    """What `eagle.Graph()` makes in a builder inlined into another's graph, and what that builder
    returns: `.result` is the staged values it declared. Blocks, forks and host nodes given it
    append to the graph it stages into; it does not run on its own."""

    def __init__(self, builder, into):
        self._builder, self._into = builder, into
        self._result_tree, self._has_result = None, False

    @property
    def graph(self):
        """The graph being built that this builder's body is staged into."""
        return self._into

    @property
    def trace(self):
        return self._into.trace

    @property
    def result(self):
        return self._result_tree

    @result.setter
    def result(self, tree):
        self._result_tree, self._has_result = tree, tree is not None

    @property
    def has_result(self) -> bool:
        return self._has_result

    @property
    def is_closed(self) -> bool:
        return self._into.is_closed

    def parallel(self):
        """A fork in the graph being built, opened where the caller stages now (inside its branch)."""
        from .building import Fork
        return Fork(self, self._into.trace.branch)

    def add_node(self, node, name=None):
        self._into.add_node(node, name)
        return self

    def wait(self, plane):
        self._into.wait(plane)

    def _staging(self):
        return self._into._staging()

    def _refuse(self, what):
        raise RuntimeError(
            f"eagle_fx.Graph.builder {self._builder.__name__}: {what} on the graph it returned inside "
            f"{_who(self._into)}, where it was called on that graph's staged values and so was staged into it "
            "(inlined); it is no graph of its own. Use its .result in the calling builder and run the outer "
            "graph; to get a graph of its own, call it from plain code on arrays")

    def __call__(self, *a, **k):
        self._refuse("calling it (g())")

    def __getattr__(self, name):
        if name in _GRAPH_VERBS:
            self._refuse(f".{name}")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __repr__(self):
        return f"<eagle_fx.Graph of {self._builder.__name__}, inlined into {_who(self._into)}>"
