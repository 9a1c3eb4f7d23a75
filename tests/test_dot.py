"""Graph.to_dot(): the picture's structure for every builder form, read back from the DOT text.

The builders are the tour's (tests/tour_builders.py, imported as tk). The expectations come from
their source (which kernels sit in which branch, arm or body), not from the drawing code: a small DOT reader below recovers clusters, nodes and edges.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest

import eagle_fx as eagle
from eagle_fx.ir import dot as eagle_dot
from eagle_fx.graph import opaque
import tour_builders as tk
from tour_kernels import cell


# ---------------------------------------------------------------------------------------------
# a DOT reader for what to_dot writes: clusters (nested), nodes with labels, edges with attributes

NODE = re.compile(r'^\s*(\w+) \[label="((?:[^"\\]|\\.)*)"(.*)\];$')
EDGE = re.compile(r'^\s*(\w+) -> (\w+)(?: \[(.*)\])?;$')
ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class Picture:
    def __init__(self, text):
        assert text.startswith("digraph ") and text.rstrip().endswith("}")
        self.labels, self.where, self.edges, self.clusters = {}, {}, [], {}
        stack = []
        for line in text.splitlines()[1:]:
            if line.strip().startswith("subgraph cluster_"):
                stack.append(None)
                continue
            if stack and stack[-1] is None and line.strip().startswith("label="):
                stack[-1] = line.strip()[len('label="'):-2]
                self.clusters[tuple(stack)] = True
                continue
            if line.strip() == "}":
                if stack:
                    stack.pop()
                continue
            m = NODE.match(line)
            if m and " -> " not in line:
                self.labels[m.group(1)] = m.group(2).replace("\\n", "\n")
                self.where[m.group(1)] = tuple(stack)
                continue
            m = EDGE.match(line)
            if m:
                self.edges.append((m.group(1), m.group(2), dict(ATTR.findall(m.group(3) or ""))))

    def ids(self, first_line):
        """Ids of the nodes whose label's first line is first_line."""
        return [n for n, lab in self.labels.items() if lab.split("\n")[0] == first_line]

    def one(self, label):
        """The id of the one node whose full label is label."""
        found = [n for n, lab in self.labels.items() if lab == label]
        assert len(found) == 1, (label, found, self.labels)
        return found[0]

    def cluster_of(self, nid):
        return self.where[nid]

    def has_edge(self, a, b, **attrs):
        return any(x == a and y == b and all(d.get(k) == v for k, v in attrs.items()) for x, y, d in self.edges)


def picture(g):
    return Picture(g.to_dot())


def quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


x = np.arange(4.0)


# ---------------------------------------------------------------------------------------------
# kernels, arguments, results

def test_a_chain_of_kernels_reads_from_its_argument_to_its_result():
    p = picture(tk.first(x))
    inc, = p.ids("inc")
    dbls = p.ids("dbl")
    assert len(dbls) == 2                           # the block `twice` appends two nodes
    assert p.has_edge(p.one("x"), inc)
    assert p.has_edge(inc, dbls[0]) and p.has_edge(dbls[0], dbls[1])
    assert p.has_edge(dbls[1], p.one("result"))
    assert all(p.cluster_of(n) == () for n in [inc, *dbls])


def test_forks_branches_joins_and_a_wait():
    p = picture(tk.forks(x))
    forks = [n for n, lab in p.labels.items() if lab == "fork"]
    joins = [n for n, lab in p.labels.items() if lab == "join"]
    assert len(forks) == 2 and len(joins) == 2          # the outer fork and the one inside branch b
    assert [n for n in forks if p.cluster_of(n) == ("branch 1:0",)]
    assert [n for n in joins if p.cluster_of(n) == ("branch 1:0",)]
    l, l2 = p.one("inc\nl"), p.one("dbl\nl2")
    u, v, r = p.one("inc\nu"), p.one("dbl\nv"), p.one("add\nr")
    assert p.cluster_of(l) == p.cluster_of(l2) == ("branch 1:0",)
    assert p.cluster_of(u) == ("branch 1:0", "branch 2:0") and p.cluster_of(v) == ("branch 1:0", "branch 2:1")
    assert p.cluster_of(r) == ("branch 1:1",)
    outer = [n for n in p.labels if p.labels[n] == "fork" and p.cluster_of(n) == ()]
    assert len(outer) == 1 and p.has_edge(outer[0], l, style="bold") and p.has_edge(outer[0], r, style="bold")
    assert p.has_edge(l, r, label="wait(l)", style="dashed")          # w.wait(l)
    a = p.one("dbl\na")
    assert p.has_edge(a, outer[0], style="bold")                     # what precedes the fork


def test_device_if_elif_else_are_nested_clusters_with_their_arms():
    p = picture(tk.choose(x, cell(1), cell(0), True))
    ifs = [n for n, lab in p.labels.items() if lab == "if"]
    assert len(ifs) == 2                                              # if flag / elif which
    outer = [n for n in ifs if len(p.cluster_of(n)) == 1][0]
    inner = [n for n in ifs if n != outer][0]
    top = p.cluster_of(outer)[0]
    assert top.startswith("if at choose:")
    dbl_then = [n for n in p.ids("dbl") if p.cluster_of(n) == (top, "then")]
    assert len(dbl_then) == 1 and p.has_edge(outer, dbl_then[0], label="then")
    assert p.cluster_of(inner)[:2] == (top, "else")                   # elif: an if inside the else arm
    inner_top = p.cluster_of(inner)
    assert [n for n in p.ids("inc") if p.cluster_of(n) == inner_top + ("then",)]
    assert [n for n in p.ids("add") if p.cluster_of(n) == inner_top + ("else",)]
    # the Python `if debug` and the unrolled Python for: plain nodes after the device if
    assert len([n for n in p.ids("inc") if p.cluster_of(n) == ()]) == 2
    assert len([n for n in p.ids("dbl") if p.cluster_of(n) == ()]) == 1
    assert p.has_edge(p.one("flag"), outer)


def test_a_capped_loop_is_a_cluster_with_its_body_and_a_back_edge():
    p = picture(tk.capped(np.ones(4), cell(1)))
    head, = [n for n, lab in p.labels.items() if lab == "while"]
    (top,) = p.cluster_of(head)
    assert top.startswith("while (at most 50 turns) at capped:")
    dbl, = p.ids("dbl")
    below, = p.ids("below")
    assert p.cluster_of(dbl) == p.cluster_of(below) == (top, "body")
    assert p.has_edge(head, dbl, label="body")
    assert p.has_edge(below, head, label="next turn", style="dashed")
    assert p.has_edge(p.one("flag"), head) and p.has_edge(head, p.one("result"))
    assert p.has_edge(head, p.one("flag (written)"))                  # the body rewrites the guard


def test_a_counted_loop_says_so():
    p = picture(tk.counted(np.zeros(4), cell(3)))
    head, = [n for n, lab in p.labels.items() if lab == "while"]
    assert p.cluster_of(head)[0].startswith("while (counted)")
    inc, = p.ids("inc")
    assert p.cluster_of(inc) == (p.cluster_of(head)[0], "body")


@pytest.mark.parametrize("builder, guard", [(tk.early_exit, "done"), (tk.skipping, "skip")])
def test_a_break_or_continue_puts_the_rest_of_the_body_in_an_arm(builder, guard):
    p = picture(quiet(builder, np.zeros(4), cell(1), cell(0)))
    head, = [n for n, lab in p.labels.items() if lab == "while"]
    top = p.cluster_of(head)[0]
    assert top.startswith(f"while at {builder.__name__}:")            # uncapped: no cap in the title
    inc, = p.ids("inc")
    assert p.cluster_of(inc) == (top, "body")
    dbl, = p.ids("dbl")                                               # after the break/continue: in an arm
    assert p.cluster_of(dbl)[:2] == (top, "body") and len(p.cluster_of(dbl)) == 4
    assert p.cluster_of(dbl)[2].startswith(f"if at {builder.__name__}:")
    assert p.has_edge(p.one(guard), head)


def test_match_has_one_arm_per_case_and_a_default():
    p = picture(tk.chooser(x, cell(0)))
    head, = [n for n, lab in p.labels.items() if lab == "match"]
    top = p.cluster_of(head)[0]
    assert top.startswith("match at chooser:")
    for kernel, case in (("dbl", "case 0"), ("inc", "case 2"), ("square", "case _")):
        nid, = p.ids(kernel)
        assert p.cluster_of(nid) == (top, case)
        assert p.has_edge(head, nid, label=case.split(" ")[1])
    assert p.has_edge(p.one("sel"), head)


def test_buffers_result_trees_and_written_arguments():
    p = picture(tk.keep(x))
    inc, dbl = p.one("inc\na"), p.one("dbl\nb")
    assert p.has_edge(inc, p.one("buffer a"), style="dotted")
    assert p.has_edge(dbl, p.one("buffer b"), style="dotted")
    assert p.has_edge(inc, p.one("result['a']"))
    assert p.has_edge(dbl, p.one("result['pair'][0]"))
    assert p.has_edge(p.ids("square")[0], p.one("result['pair'][1][0]"))
    y = np.zeros(4)
    p = picture(tk.void(x, y))
    acc, = p.ids("accumulate")
    assert p.has_edge(acc, p.one("y (written)")) and not [n for n in p.labels.values() if n.startswith("result")]


def test_a_hand_made_graph_with_an_opaque_node():
    src, dst = np.arange(4.0), np.zeros(4)
    h = eagle.Graph()
    h.add_node(opaque(lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}), name="shift")
    tk.twice(h, dst)
    p = picture(h)
    shift = p.one("shift\n(host)")
    assert 'style="dashed"' in [line for line in h.to_dot().splitlines() if line.strip().startswith(shift + " ")][0]
    d1, d2 = p.ids("dbl")
    assert p.has_edge(shift, d1) and p.has_edge(d1, d2)


def test_a_loop_inside_a_branch_keeps_its_body_in_the_branch():
    p = picture(tk.whole(np.arange(8.0), cell(1), np.zeros(8)))
    head, = [n for n, lab in p.labels.items() if lab == "while"]
    assert p.cluster_of(head)[0].startswith("while (at most 50 turns) at settle:")
    s = p.one("merge\ns")
    assert p.cluster_of(s) == (p.cluster_of(head)[0], "body")
    assert len([n for n in p.ids("tweak") if p.cluster_of(n) == (p.cluster_of(head)[0], "body")]) == 2
    assert p.has_edge(p.one("left\nl"), p.one("right\nr"), label="wait(l)")
    assert p.has_edge(p.one("polish\nl2"), head)


def test_a_transformed_graph_draws_too():
    from tour_kernels import loss
    g = eagle.make_graph(eagle.grad(loss))(np.ones(4), cell(1), cell(3))
    p = picture(g)
    assert [n for n, lab in p.labels.items() if lab == "while"] and p.ids("if")


# ---------------------------------------------------------------------------------------------
# SVG in Jupyter

def test_repr_svg_draws_with_dot_and_falls_back_to_text(monkeypatch):
    g = tk.first(x)
    if shutil.which("dot") is not None:
        svg = g._repr_svg_()
        assert "<svg" in svg and "inc" in svg
    h = eagle.Graph()                              # a hand-made graph still being staged: not built by showing it
    tk.twice(h, np.zeros(3))
    assert h._repr_svg_() is None
    tk.twice(h, np.zeros(3))                       # still open for more nodes
    assert len(Picture(h.to_dot()).ids("dbl")) == 4
    monkeypatch.setattr(eagle_dot.shutil, "which", lambda name: None)
    assert g._repr_svg_() is None                  # Jupyter then shows repr(g)
    assert "Graph" in repr(g)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_every_picture_is_valid_dot():
    graphs = [tk.first(x), tk.forks(x), tk.choose(x, cell(1), cell(0), False), tk.capped(np.ones(4), cell(1)),
              tk.chooser(x, cell(2)), tk.keep(x), quiet(tk.early_exit, np.zeros(4), cell(1), cell(0))]
    for g in graphs:
        run = subprocess.run(["dot", "-Tsvg"], input=g.to_dot(), capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and not run.stderr, run.stderr
