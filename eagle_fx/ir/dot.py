"""A graph as a picture: Graphviz DOT text for `Graph.to_dot()`, SVG for Jupyter (`_repr_svg_`).

What is drawn, from the staged Program:

- arguments, buffers and results as ellipses; kernel calls as boxes (the kernel, the name the
  builder gave its result); host (opaque) nodes as dashed boxes;
- data flow as edges from the node that wrote a plane to the nodes that read it;
- a fork as a `fork` point with one cluster per branch and a `join` point after them, a
  `b.wait(plane)` as a dashed edge from the node that wrote the plane to the first node after the wait;
- a device `if`/`match`/`while` as a cluster holding its header (a diamond) and one sub-cluster per
  arm, or the loop's condition and body; a loop's back edge goes from the body to the header.
"""
from __future__ import annotations

import shutil
import subprocess

from hawk_fx.core import Literal, Program, RuleTable

from .. import ir


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class _Drawing:
    """Writes DOT lines for one Program and its sub-programs; node ids are n0, n1, ..."""

    def __init__(self):
        self.lines: list[str] = []
        self.edges: list[str] = []             # written after every node: an edge inside a cluster
                                               # would pull the nodes it names into that cluster
        self.count = 0
        self.clusters = 0
        self.by_info: dict[int, str] = {}      # id(EqnInfo) -> node id: waits name their writer by its info
        self.plain: dict[tuple, int] = {}      # (from, to) -> line of a plain data edge

    def node(self, label, indent, **attrs) -> str:
        nid = f"n{self.count}"
        self.count += 1
        extra = "".join(f" {k}={_quote(v)}" for k, v in attrs.items())
        self.lines.append(f"{indent}{nid} [label={_quote(label)}{extra}];")
        return nid

    def edge(self, a, b, **attrs):
        """An edge (written last, at top level); a second one between the same nodes replaces a
        plain data edge drawn before."""
        extra = " [" + " ".join(f"{k}={_quote(v)}" for k, v in attrs.items()) + "]" if attrs else ""
        line = f"  {a} -> {b}{extra};"
        at = self.plain.pop((a, b), None)
        if at is not None:
            self.edges[at] = line
            return
        if not attrs:
            self.plain[(a, b)] = len(self.edges)
        self.edges.append(line)

    def open_cluster(self, label, indent, **attrs) -> str:
        self.clusters += 1
        self.lines.append(f"{indent}subgraph cluster_{self.clusters} {{")
        self.lines.append(f"{indent}  label={_quote(label)};")
        for k, v in attrs.items():
            self.lines.append(f"{indent}  {k}={_quote(v)};")
        return indent + "  "

    def close_cluster(self, indent):
        self.lines.append(f"{indent[:-2]}}}")

    # -- one program -----------------------------------------------------------------------------
    def sequence(self, eqns, env, indent, depth=0):
        """Draw eqns (one level of a Program) in order; returns (first node, last node) or (None, None)."""
        first = last = None
        k = 0
        while k < len(eqns):
            e = eqns[k]
            path = e.info.branch
            if len(path) > depth:                       # a fork region: its run of eqns in branches of one fork
                fork_id = path[depth][0]
                j = k
                while j < len(eqns) and len(eqns[j].info.branch) > depth and eqns[j].info.branch[depth][0] == fork_id:
                    j += 1
                a, b = self.fork(eqns[k:j], fork_id, env, indent, depth)
                k = j
            else:
                a = b = self.eqn(e, env, indent)
                k += 1
            if last is not None and a is not None and (a.startswith("fork") or last.startswith("join")):
                self.edge(last, a, style="bold")
            first = first or a
            last = b or last
        return first, last

    def fork(self, eqns, fork_id, env, indent, depth):
        fork = f"fork{fork_id}_{self.count}"
        join = f"join{fork_id}_{self.count}"
        self.lines.append(f"{indent}{fork} [label=\"fork\" shape=triangle];")
        arms: dict[tuple, list] = {}
        for e in eqns:
            arms.setdefault(e.info.branch[depth], []).append(e)
        for (fid, index), arm in arms.items():
            inner = self.open_cluster(f"branch {fid}:{index}", indent, style="rounded", color="steelblue")
            a, b = self.sequence(arm, env, inner, depth + 1)
            self.close_cluster(inner)
            if a is not None:
                self.edge(fork, a, style="bold")
                self.edge(b, join, style="bold")
        self.lines.append(f"{indent}{join} [label=\"join\" shape=invtriangle];")
        return fork, join

    def eqn(self, e, env, indent) -> str:
        return draw_rules.get(e.prim, _draw_node)(self, e, env, indent)

    def place(self, e, env, indent, nid) -> str:
        """The node `nid` drawn for e: its inputs' edges in, its outputs from it."""
        self.by_info[id(e.info)] = nid
        self.inputs(e, nid, env)
        for v in e.outputs:
            env[v] = nid
        return nid

    def inputs(self, e, nid, env):
        seen = set()
        for v in e.inputs:
            if isinstance(v, Literal) or v not in env or env[v] in seen or env[v] == nid:
                continue
            seen.add(env[v])
            self.edge(env[v], nid)

    def control(self, e, env, indent, kind, arms, loops=False) -> str:
        """A cluster with the header `kind` and a sub-cluster per (label, program) of `arms`
        (`loops`: the body's back edge to the header)."""
        where = f" at {e.info.where}" if e.info.where else ""
        inner = self.open_cluster(f"{kind}{where}", indent, style="dashed", color="darkorange")
        head = self.node(kind.split(" ")[0], inner, shape="diamond")
        self.by_info[id(e.info)] = head
        self.inputs(e, head, env)
        for label, prog in arms:
            arm = self.open_cluster(label, inner, style="rounded", color="gray50")
            sub = {v: head for v in prog.inputs}          # a sub-program's inputs enter through the header
            a, b = self.sequence(prog.eqns, sub, arm, depth=len(e.info.branch))
            if a is None:                                  # an empty arm: a marker so the arm shows
                text = "reads the guard cell" if label == "condition" else "(nothing)"
                a = b = self.node(text, arm, shape="plaintext")
            self.close_cluster(arm)
            self.edge(head, a, label=label.split(" ")[-1] if label.startswith("case") else label)
            if loops and label == "body":
                self.edge(b, head, style="dashed", label="next turn", constraint="false")
        self.close_cluster(inner)
        for v in e.outputs:
            env[v] = head
        return head


# -- the rules: prim -> fn(drawing, e, env, indent) -> its node; a primitive with none is a small
# rounded box with its name (cell logic, records, the transforms' helpers) ----------------------------

draw_rules = RuleTable("drawing")


def _draw_node(d, e, env, indent):
    return d.place(e, env, indent, d.node(e.prim.name, indent, shape="box", style="rounded", fontsize="10"))


@draw_rules.register(ir.call_p)
def _draw_call(d, e, env, indent):
    kernel = e.params["kernel"].name
    label = kernel if not e.info.name or e.info.name == kernel else f"{kernel}\n{e.info.name}"
    return d.place(e, env, indent, d.node(label, indent, shape="box"))


@draw_rules.register(ir.opaque_p)
def _draw_host(d, e, env, indent):
    fn = getattr(e.params["fn"], "__name__", "fn")
    return d.place(e, env, indent, d.node(f"{e.info.name or fn}\n(host)", indent, shape="box", style="dashed"))


@draw_rules.register(ir.while_p)
def _draw_while(d, e, env, indent):
    p = e.params
    kind = "while" + (f" (at most {p['cap']} turns)" if p["cap"] is not None else "") + (
        " (counted)" if p["counted"] else "")
    arms = ([("condition", p["cond"])] if p["cond"] is not None else []) + [("body", p["body"])]
    return d.control(e, env, indent, kind, arms, loops=True)


@draw_rules.register(ir.cond_p)
def _draw_cond(d, e, env, indent):
    p = e.params
    return d.control(e, env, indent, "if", [("else", p["branches"][0]), ("then", p["branches"][1])])


@draw_rules.register(ir.switch_p)
def _draw_switch(d, e, env, indent):
    p = e.params
    cases = [f"case {c}" for c in p["cases"]] + ["case _"]
    return d.control(e, env, indent, "match", list(zip(cases, p["branches"])))


def _leaf_paths(tree, path="result"):
    """The names of a result tree's leaves in flattening order: result, result['a'], result[1][0]."""
    if tree.kind == "leaf":
        return [path]
    keys = [repr(k) for k in tree.meta] if tree.kind == "dict" else [str(k) for k in range(len(tree.children))]
    return [p for k, c in zip(keys, tree.children) for p in _leaf_paths(c, f"{path}[{k}]")]


def to_dot(graph) -> str:
    """The Graphviz DOT text of a graph (builds it first when needed)."""
    prog: Program = graph.program
    t = graph.trace
    d = _Drawing()
    d.lines += ["digraph eagle_graph {", '  rankdir=TB; node [fontname="Helvetica"]; edge [fontname="Helvetica"];']
    env = {}
    names = [e.name for e in t.input_planes] if len(t.input_planes) == len(prog.inputs) else [None] * len(prog.inputs)
    for k, (v, name) in enumerate(zip(prog.inputs, names)):
        env[v] = d.node(name or v.hint or "array", "  ", shape="ellipse", color="gray40")   # "array": not an argument
    d.sequence(prog.eqns, env, "  ")
    for w in getattr(t, "waits", ()):                      # b.wait(plane): from its writer to the next node of b
        writer = d.by_info.get(id(w.writer.info))
        after = next((a for a in t.accesses if a.seq >= w.seq_at and a.branch[:len(w.branch)] == w.branch), None)
        target = d.by_info.get(id(after.info)) if after is not None else None
        if writer and target:
            d.edge(writer, target, style="dashed", color="firebrick", label=f"wait({w.writer.info.name or 'plane'})",
                   constraint="false")
    for h in getattr(t, "buffers", ()):                   # buffer= planes, named when labelled
        if h.var is not None and h.var in env:
            b = d.node(f"buffer {h.label}" if h.label else "buffer", "  ", shape="cylinder", color="gray40")
            d.edge(env[h.var], b, style="dotted", arrowhead="none")
    results, tree = graph.result_vars() if graph.has_result else ([], None)
    paths = _leaf_paths(tree) if tree is not None else []
    for k, v in enumerate(prog.outputs):
        if v not in env:
            continue
        if k < len(results):
            label = paths[k] if len(paths) == len(results) else f"result {k}"
        else:
            name = next((e.name for e in t.input_planes if e.name and t.root.current.get(e) is v), None)
            label = f"{name or 'array'} (written)"
        out = d.node(label, "  ", shape="ellipse", style="filled", fillcolor="gray92")
        d.edge(env[v], out)
    d.lines += d.edges + ["}"]
    return "\n".join(d.lines) + "\n"


def to_svg(graph) -> str | None:
    """The graph drawn as SVG by Graphviz's `dot`, or None when `dot` is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    run = subprocess.run([exe, "-Tsvg"], input=to_dot(graph), capture_output=True, text=True, timeout=60)
    return run.stdout if run.returncode == 0 else None
