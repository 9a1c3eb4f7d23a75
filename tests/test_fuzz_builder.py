"""A differential fuzzer: random builder programs over every form, each run staged and with staging
disabled (plain Python) on copies of the same arrays and compared value by value after each run.

The generator writes builder source (the builder pass needs a function's text): device if/elif/else
and match on cells, capped, counted and uncapped loops with break/continue, Python loops, forks with
waits and blocks, buffers (True and a caller's array) whose names device flow rebinds, Mutable writes
to arguments and cells (state carried across replays), NumPy in-place operators (on fresh values,
on the caller's y, and on names device flow rebinds, where a build refused for NumPy's meaning
depending on the turn or arm is counted rather than compared), blocks called on views, and a run
script of g(n), enqueue, cell changes and bind. Differentiable programs (no cell or Mutable writes) are also checked: eagle.grad and
record/reverse against central differences of eager runs, jvp against its eager value and differences,
vmap against eager runs per instance.

The default profile runs a fixed-seed set of programs; `pytest -m slow` runs a larger fixed-seed one
(both derandomized so that a run is repeatable; explore new programs by raising max_examples or
switching derandomize off locally).
"""
from __future__ import annotations

import copy
import itertools
import linecache
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eagle_fx as eagle
from hawk_fx.tree import tree_flatten

N = 3                                   # samples per plane
PLANES = ("p0", "p1", "p2", "p3")
CELLS = ("c0", "c1", "c2")
UNARY = ("inc", "dbl", "half", "wave", "soft")
BINARY = ("add", "mix")
FORMS = ("assign", "block", "block_view", "numpy", "view_write", "augassign", "augassign_device", "augassign_arg",
         "mutable", "cell_write", "if", "match", "capped", "counted", "uncapped", "python_for", "fork", "break",
         "continue")
_ids = itertools.count()


class Program:
    """Source of one generated builder, and the forms it used."""

    def __init__(self, draw, differentiable: bool, vmappable: bool = False):
        self.draw, self.diff, self.vmappable = draw, differentiable, vmappable
        self.used: set[str] = set()
        self.forks = 0
        self.label = None           # the name labelled buffer=, if any

    def pick(self, seq):
        return seq[self.draw(st.integers(0, len(seq) - 1))]

    def chance(self, p_num: int, p_den: int = 4) -> bool:
        return self.draw(st.integers(0, p_den - 1)) < p_num

    # -- statements --------------------------------------------------------------------------
    def expr(self, depth):
        if self.chance(1, 6):
            self.used.add("block")
            return f"blk(g, {self.pick(PLANES)})"
        if self.chance(1, 10):
            self.used.add("block_view")          # a block called on views, its result joined back to N samples
            a, b = self.pick(PLANES), self.pick(PLANES)
            return self.pick((f"np.concatenate([{a}[:1], blk(g, {b}[1:])])",
                              f"np.concatenate([blk(g, {a}[::2]), {b}[1:2]])"))
        if self.chance(1, 5):
            self.used.add("numpy")
            a, b = self.pick(PLANES), self.pick(PLANES)
            return self.pick((f"np.sin({a}) * 0.5 + {b}", f"-{a} + 1.0", f"np.maximum({a}, {b}) - 0.5",
                              f"np.stack([{a}, {b}])[1] * 0.75", f"{a}[::-1] * 0.5", f"np.tanh({a} * {b})",
                              f"({a} - {b}) / 2.0"))
        if self.chance(1):
            return f"{self.pick(BINARY)}({self.pick(PLANES)}, {self.pick(PLANES)})"
        return f"{self.pick(UNARY)}({self.pick(PLANES)})"

    def block(self, depth, loop=None, frozen=frozenset()):
        """A list of lines (each with its relative indent); `loop`: 'device' inside a device loop."""
        out = []
        for _ in range(self.draw(st.integers(1, 3 if depth < 2 else 2))):
            out += self.statement(depth, loop, frozen)
        return out

    def augmented(self, depth, loop):
        """`a += ...`, `a *= ...`, `a[1:] -= ...`: in place on the array `a` names. Inside device flow the
        name is mostly first given a fresh array (`a = inc(a)`); without it, an update of the array it
        held before is refused where NumPy's meaning depends on the turn or arm, and the program is
        counted as refused instead of compared (tests/test_staged_inplace.py checks those refusals)."""
        self.used.add("augassign")
        a, b = self.pick(PLANES), self.pick(PLANES)
        fresh = depth > 0 or loop is not None
        if fresh and self.chance(1, 3):
            fresh = False                    # may be refused: then the build must say so (check_program)
            self.used.add("augassign_device")
        lines = [(0, f"{a} = inc({a})")] if fresh else []
        op = self.pick(("+=", "-=", "*="))
        if op == "*=":
            rhs = self.pick(("0.5", f"np.tanh({b})"))
        else:
            rhs = self.pick((b, f"np.sin({b}) * 0.5", "0.5", f"{b}[::-1] * 0.25"))
        if self.chance(1, 3):
            return lines + [(0, f"{a}[1:] {op} {b}[:-1] * 0.5" if op != "*=" else f"{a}[1:] *= 0.5")]
        return lines + [(0, f"{a} {op} {rhs}")]

    def statement(self, depth, loop, frozen):
        kinds = ["assign", "assign", "assign"]
        if not self.diff:
            kinds += ["mutable", "cell_write"]
        if depth < 2:
            kinds += ["if", "match", "capped", "counted", "python_for"]
            if not self.diff:
                kinds += ["uncapped"]
            if depth == 0 and loop is None:
                kinds += ["fork"]
        if loop == "device":
            kinds += ["break", "continue"]
        kind = self.pick(kinds)
        self.used.add(kind)
        free = [c for c in CELLS if c not in frozen]
        if kind == "assign":
            if self.chance(1, 6):
                return self.augmented(depth, loop)
            if self.chance(1, 8):
                self.used.add("view_write")
                a, b = self.pick(PLANES), self.pick(PLANES)
                return [(0, f"{a} = inc({a})"), (0, f"{a}[1:] = {b}[:-1] * 0.5")]
            return [(0, f"{self.pick(PLANES)} = {self.expr(depth)}")]
        if kind == "mutable":
            if self.chance(1, 3):
                self.used.add("augassign_arg")   # the caller's array, updated in place by NumPy operators
                b = self.pick(PLANES)
                return [(0, self.pick((f"y[1:] += {b}[:-1] * 0.5", "y *= 0.5", f"y -= np.tanh({b})")))]
            return [(0, f"accumulate(soft({self.pick(PLANES)}), y)")]
        if kind == "cell_write":
            if not free:
                return [(0, f"{self.pick(PLANES)} = {self.expr(depth)}")]
            lim = self.pick(("-1.0", "0.5", "2.0"))
            kernel = self.pick(("below", "over"))
            if self.chance(1):
                return [(0, f"count_up({self.pick(PLANES)}, {self.pick(free)})")]
            return [(0, f"{kernel}({self.pick(PLANES)}, {lim}, {self.pick(free)})")]
        if kind in ("break", "continue"):
            return [(0, f"if {self.pick(CELLS)}: {kind}")]
        if kind == "if":
            lines = [(0, f"if {self.pick(CELLS)}:")] + _indent(self.block(depth + 1, loop, frozen))
            if self.chance(2):
                lines += [(0, f"elif {self.pick(CELLS)}:")] + _indent(self.block(depth + 1, loop, frozen))
            if self.chance(2):
                lines += [(0, "else:")] + _indent(self.block(depth + 1, loop, frozen))
            return lines
        if kind == "match":
            lines = [(0, f"match {self.pick(CELLS)}:")]
            inner = None if loop == "device" else loop        # no break/continue inside a match arm
            for case in sorted(set(self.draw(st.lists(st.integers(0, 2), min_size=1, max_size=2)))):
                lines += [(1, f"case {case}:")] + _indent(self.block(depth + 1, inner, frozen), 2)
            if self.chance(2):
                lines += [(1, "case _:")] + _indent(self.block(depth + 1, inner, frozen), 2)
            return lines
        if kind == "capped":
            guard = self.pick(CELLS)
            head = [(0, f"for _ in range({self.draw(st.integers(1, 5))}):"), (1, f"if not {guard}: break")]
            return head + _indent(self.block(depth + 1, "device", frozen))
        if kind == "counted":
            return [(0, f"for _ in range({self.pick(CELLS)}):")] + _indent(self.block(depth + 1, "device", frozen))
        if kind == "uncapped":
            if not free:
                return [(0, f"{self.pick(PLANES)} = {self.expr(depth)}")]
            guard = self.pick(free)
            # a counter that rises by one each turn before any jump, and clears the guard at 6
            t = f"t{next(_ids)}"
            pre = [(0, f"{t} = soft({self.pick(PLANES)})")]
            body = [(0, f"{t} = inc({t})"), (0, f"below({t}, 6.0, {guard})")]
            body += self.block(depth + 1, "device", frozen | {guard})
            return pre + [(0, f"while {guard}:")] + _indent(body)
        if kind == "python_for":
            return [(0, "for _k in range(2):")] + _indent(self.block(depth + 1, "python", frozen))
        if kind == "fork":
            self.forks += 1
            k = self.forks
            wait = self.chance(2)
            lines = [(0, f"with g.parallel() as fk{k}:"),
                     (1, f"with fk{k}.branch() as ba{k}:"),
                     (2, f"qa{k} = {self.pick(UNARY)}({self.pick(PLANES)})"),
                     (2, f"qb{k} = blk(ba{k}, qa{k})"),
                     (1, f"with fk{k}.branch() as bb{k}:")]
            if wait:
                lines += [(2, f"bb{k}.wait(qa{k})"), (2, f"qc{k} = {self.pick(BINARY)}(qa{k}, {self.pick(PLANES)})")]
            else:
                lines += [(2, f"qc{k} = {self.pick(UNARY)}({self.pick(PLANES)})")]
            lines += [(0, f"{self.pick(PLANES)} = mix(qb{k}, qc{k})")]
            return lines
        raise AssertionError(kind)

    # -- the whole builder ---------------------------------------------------------------------
    def source(self, name):
        lines = [(0, "@eagle.Graph.builder"), (0, f"def {name}(x, y, c0, c1, c2, b0, record=False):"),
                 (1, "g = eagle.Graph(record=record)")]
        heads = ["p0 = inc(x)", "p1 = dbl(x)", "p2 = mix(x, y)", "p3 = wave(x)"]
        labelled = self.draw(st.sampled_from(["none", "true", "array"]))
        if labelled == "array" and self.vmappable:
            labelled = "true"
        if labelled != "none":
            self.used.add("buffer")
            k = self.draw(st.integers(0, 3))
            self.label = PLANES[k]
            heads[k] = heads[k][:-1] + (", buffer=True)" if labelled == "true" else ", buffer=b0)")
        lines += [(1, h) for h in heads]
        lines += _indent(self.block(0))
        if self.diff:
            lines += [(1, "g.result = total(add(add(p0, p1), mix(p2, p3)))")]
        else:
            lines += [(1, "g.result = (p0, p1, p2, p3)")]
        lines += [(1, "return g")]
        return "\n".join("    " * d + text for d, text in lines) + "\n"


def _indent(lines, by=1):
    return [(d + by, t) for d, t in lines]


def load(src: str, name: str):
    """Compile generated source as if from a file (the builder pass reads a function's text)."""
    filename = f"<fuzz builder {name}>"
    header = "import numpy as np\nimport eagle_fx as eagle\nfrom fuzz_kernels import *\n\n"
    text = header + src
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns: dict = {}
    exec(compile(text, filename, "exec"), ns)
    return ns[name]


def arrays(draw):
    vals = st.floats(-2.0, 2.0, allow_nan=False, width=64)
    x = np.array(draw(st.lists(vals, min_size=N, max_size=N)))
    y = np.array(draw(st.lists(vals, min_size=N, max_size=N)))
    cells = [np.array([draw(st.integers(0, 3))], np.uint32) for _ in CELLS]
    return [x, y, *cells, np.zeros(N)]


def leaves(tree):
    return [np.array(v, copy=True) for v in tree_flatten(tree, is_leaf=lambda v: isinstance(v, np.ndarray))[0]]


def same(got, want, what):
    assert len(got) == len(want), what
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=f"{what}, leaf {k}")


def script(draw):
    """What the two graphs are asked to do, in order."""
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        steps.append(draw(st.sampled_from([("call", 1), ("call", 2), ("call", 3), ("enqueue", 2), ("set",),
                                           ("bind_x",), ("bind_cell",)])))
    return steps


def run_both(builder, args, steps, draw, src):
    staged_args, eager_args = copy.deepcopy(args), copy.deepcopy(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eagle.UncappedLoopWarning)
        g = builder(*staged_args)
        with eagle.disable_staging():
            e = builder(*eager_args)
        for step in steps + [("call", 1)]:
            kind = step[0]
            if kind == "set":
                k, v = draw(st.integers(2, 4)), draw(st.integers(0, 3))
                staged_args[k][0] = eager_args[k][0] = v
                continue
            if kind == "bind_x":
                new = np.array(draw(st.lists(st.floats(-2.0, 2.0, width=64), min_size=N, max_size=N)))
                staged_args[0], eager_args[0] = new, new.copy()
                g.bind(x=staged_args[0])
                e.bind(x=eager_args[0])
                continue
            if kind == "bind_cell":
                k, v = draw(st.integers(2, 4)), draw(st.integers(0, 3))
                staged_args[k], eager_args[k] = np.array([v], np.uint32), np.array([v], np.uint32)
                name = CELLS[k - 2]
                g.bind(**{name: staged_args[k]})
                e.bind(**{name: eager_args[k]})
                continue
            if kind == "call":
                want, got = leaves(e(step[1])), leaves(g(step[1]))
            else:
                e.enqueue(step[1]).synchronize()
                g.enqueue(step[1]).synchronize()
                want, got = leaves(e.result), leaves(g.result)
            same(got, want, f"{step} of\n{src}")
            same(staged_args, eager_args, f"arguments after {step} of\n{src}")


covered: dict[str, int] = {}


def check_program(data, differentiable):
    prog = Program(data.draw, differentiable, vmappable=data.draw(st.booleans()))
    name = f"prog{next(_ids)}"
    src = prog.source(name)
    builder = load(src, name)
    args = arrays(data.draw)
    for f in prog.used:
        covered[f] = covered.get(f, 0) + 1
    try:
        if not differentiable:
            run_both(builder, args, script(data.draw), data.draw, src)
            if prog.vmappable:
                check_vmap_forward(builder, args, data.draw, src)
        else:
            check_derivatives(builder, args, prog.vmappable, src, prog.label)
    except TypeError as e:
        if "augassign_device" in prog.used and "cannot mean the same" in str(e):
            covered["refused_inplace"] = covered.get("refused_inplace", 0) + 1
            return
        e.add_note(f"the generated program:\n{src}")
        raise
    except Exception as e:
        e.add_note(f"the generated program:\n{src}")
        raise


def check_vmap_forward(builder, args, draw, src):
    """vmap over every argument but the buffer array, against one eager run per instance: the
    results and the arguments the program writes (y and the cells), row by row."""
    B = 3
    batched = [np.stack([a] + [draw(st.sampled_from([a * 0.5, a[::-1].copy(), a + 0.25])) for _ in range(B - 1)])
               if a.dtype.kind == "f" else np.array([[draw(st.integers(0, 3))] for _ in range(B)], np.uint32)
               for a in args[:5]]
    b0 = args[5]
    eager_rows = []
    for i in range(B):
        row = [a[i].copy() for a in batched] + [b0.copy()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", eagle.UncappedLoopWarning)
            with eagle.disable_staging():
                out = leaves(builder(*row)())
        eager_rows.append((out, row))
    staged = [a.copy() for a in batched]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eagle.UncappedLoopWarning)
        # vmap of a builder is a builder: its graph writes the batched arguments in place
        got = leaves(eagle.vmap(builder, in_axes=(0, 0, 0, 0, 0, None))(*staged, b0.copy())())
    for i, (want, row) in enumerate(eager_rows):
        same([r[i] for r in got], want, f"vmap instance {i} of\n{src}")
        same([a[i] for a in staged], row[:5], f"arguments of vmap instance {i} of\n{src}")


def eager_value(builder, args):
    a = copy.deepcopy(args)
    with eagle.disable_staging():
        return np.asarray(builder(*a)()).reshape(-1)[0]


def eager_buffer_sum(builder, args, label):
    a = copy.deepcopy(args)
    with eagle.disable_staging():
        e = builder(*a)
        e()
    return float(np.sum(e.buffers[label]))


def check_derivatives(builder, args, vmappable, src, label=None):
    x, rest = args[0], args[1:]
    f_eager = lambda x_: eager_value(builder, [x_] + list(rest))
    h = 1e-6
    fd = np.array([(f_eager(x + h * e) - f_eager(x - h * e)) / (2 * h) for e in np.eye(N)])
    scale = 1.0 + np.max(np.abs(fd))
    run_both(builder, args, [("call", 1)], None, src)
    got = eagle.grad(lambda x_: builder(x_, *copy.deepcopy(rest)))(x.copy())
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-5 * scale, err_msg=f"eagle.grad of\n{src}")
    g = builder(x.copy(), *copy.deepcopy(rest), record=True)
    g()
    r = eagle.diff.reverse(g.record, {"result": np.ones_like(g.result)}, wrt=("x",))["x"]
    np.testing.assert_allclose(r, fd, rtol=1e-5, atol=1e-5 * scale, err_msg=f"record/reverse of\n{src}")
    if label is not None:
        # a label as a seed means the buffer's value after the run, wherever device flow rebound it
        fd_l = np.array([(eager_buffer_sum(builder, [x + h * e] + list(rest), label)
                          - eager_buffer_sum(builder, [x - h * e] + list(rest), label)) / (2 * h) for e in np.eye(N)])
        r = eagle.diff.reverse(g.record, {label: np.ones(N)}, wrt=("x",))["x"]
        np.testing.assert_allclose(r, fd_l, rtol=1e-5, atol=1e-5 * (1.0 + np.max(np.abs(fd_l))),
                                   err_msg=f"reverse seeded at the label {label!r} of\n{src}")
    t = np.linspace(-1.0, 1.0, N)
    out, tan = eagle.jvp(lambda x_: builder(x_, *copy.deepcopy(rest)), (x.copy(),), (t,))
    np.testing.assert_allclose(np.asarray(out).reshape(-1)[0], f_eager(x), rtol=1e-12, err_msg=f"jvp value of\n{src}")
    np.testing.assert_allclose(np.asarray(tan).reshape(-1)[0], fd @ t, rtol=1e-5, atol=1e-5 * scale,
                               err_msg=f"jvp tangent of\n{src}")
    if vmappable:
        X = np.stack([x, x[::-1] * 0.5, x + 0.25])
        got = np.asarray(eagle.vmap(lambda x_: builder(x_, *copy.deepcopy(rest)))(X)).reshape(3, -1)[:, 0]
        want = np.array([f_eager(r) for r in X])
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"vmap of\n{src}")
        # a batched cell too: each instance takes its own arms and turns
        C = np.array([[0], [1], [3]], np.uint32)
        y, _, c1, c2, b0 = copy.deepcopy(rest)
        got = np.asarray(eagle.vmap(lambda x_, c_: builder(x_, y, c_, c1, c2, b0))(X, C)).reshape(3, -1)[:, 0]
        want = np.array([eager_value(builder, [r, y, c, c1, c2, b0]) for r, c in zip(X, C)])
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"vmap over x and c0 of\n{src}")


PROFILE = dict(deadline=None, database=None, derandomize=True, print_blob=True,
               suppress_health_check=list(HealthCheck))


@settings(max_examples=400, **PROFILE)
@given(st.data())
def test_staged_and_eager_agree_on_random_programs(data):
    check_program(data, differentiable=False)


@settings(max_examples=100, **PROFILE)
@given(st.data())
def test_derivatives_of_random_programs_match_differences_of_eager_runs(data):
    check_program(data, differentiable=True)


@pytest.mark.slow
@settings(max_examples=3000, **PROFILE)
@given(st.data())
def test_staged_and_eager_agree_on_many_random_programs(data):
    check_program(data, differentiable=False)


@pytest.mark.slow
@settings(max_examples=600, **PROFILE)
@given(st.data())
def test_derivatives_of_many_random_programs(data):
    check_program(data, differentiable=True)


def check_on_jax(data):
    """The same random programs run on the JAX backend (one XLA executable per graph, NumPy arguments
    and results), against the eager run: a backend of values, where a buffer written in place after
    it was read must still read its last version (a kernel-made plane written by a Mutable kernel
    came back with its value before the write). A build the JAX backend refuses on purpose (its
    documented limits, named in the message) is counted, not compared."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    from eagle_fx.backends.select import use_backend
    prog = Program(data.draw, False)
    name = f"prog{next(_ids)}"
    src = prog.source(name)
    builder = load(src, name)
    args = arrays(data.draw)
    with use_backend("jax"):
        try:
            run_both(builder, args, script(data.draw), data.draw, src)
        except (TypeError, ValueError) as e:
            text = str(e)
            if "jax backend" in text or "backend 'jax'" in text or ("augassign_device" in prog.used
                                                                     and "cannot mean the same" in text):
                covered["refused_on_jax"] = covered.get("refused_on_jax", 0) + 1
                return
            e.add_note(f"the generated program (on the JAX backend):\n{src}")
            raise
        except Exception as e:
            e.add_note(f"the generated program (on the JAX backend):\n{src}")
            raise
    covered["ran_on_jax"] = covered.get("ran_on_jax", 0) + 1


@settings(max_examples=12, **PROFILE)
@given(st.data())
def test_the_jax_backend_agrees_with_eager_on_random_programs(data):
    check_on_jax(data)


@pytest.mark.slow
@settings(max_examples=150, **PROFILE)
@given(st.data())
def test_the_jax_backend_agrees_with_eager_on_many_random_programs(data):
    check_on_jax(data)


def test_the_profile_covers_every_form():
    """Run after the profiles above (file order): every form was generated."""
    if not covered:
        pytest.skip("run with the profiles above")
    missing = [f for f in FORMS + ("buffer",) if f not in covered]
    assert not missing, f"forms never generated: {missing}; covered: {covered}"
