"""Writes through NumPy views, and what a buffer label means in gradients, each against an oracle
the library does not compute.

Views. A NumPy view of an array a builder reaches (made in the builder, or a global): `z[1]`, `z[::2]`,
   a reshape, `z.T[k]` is a new ndarray at each use. Staged, it is a view of its base's plane: a
   write through it lands in the base, and later reads of the base or of a view of it see it, on
   the NumPy and JAX backends, under record=True, value_and_grad and to_jax. The oracles: the
   builder run as plain Python (eagle.disable_staging()), plain NumPy, central differences of the
   eager run, jax.grad of the same math.
Labels. In gradients a buffer label means the value of its last write that ran, with every use of that
   value counted: an arm (or a loop of no turns) that did not run changes no derivative. The
   oracle: a hand-written NumPy run of the same program with an epsilon added at that write.

The property tests generate such builders from a seed (deterministic); larger runs are marked slow.
"""
from __future__ import annotations

import linecache

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from conftest import refused
from eagle_fx.backends.select import use_backend
from hawk_fx import Mutable, Scalar
from tour_kernels import add, dbl, square as sq, total as sumsq  # noqa: E402

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


@hawk.kernel
def acc(s: Scalar, y: Mutable[Scalar]):
    y = y + s


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x)



@hawk.kernel
def mul(a: Scalar, b: Scalar):
    return a * b


@hawk.kernel
def sinp(x: Scalar):
    return hawk.math.sin(x) + x


def central(f, x, h=1e-6):
    """d f / d x by central differences (f: array -> float)."""
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size).reshape((-1,) + x.shape)])


def eager(builder, *args):
    with eagle.disable_staging():
        return np.asarray(builder(*args)()).reshape(-1)[0]


# ---------------------------------------------------------------------------------------------
# writes through NumPy views of arrays the builder reaches


@eagle.Graph.builder
def made_row(x, record=False, backend="numpy"):
    """z is made here, acc writes its row 1, the result reads row 1 again."""
    g = eagle.Graph(record=record, backend=backend)
    z = np.zeros((2, 8))
    acc(x, z[1])
    g.result = total(z[1] + x)
    return g


G = np.zeros(8)                  # a global the builders below write through views


@eagle.Graph.builder
def global_every_other(x, record=False, backend="numpy"):
    g = eagle.Graph(record=record, backend=backend)
    G[::2] += x[::2]
    g.result = sumsq(G)
    return g


G0 = np.linspace(-1.0, 1.0, 8)
EVERY_OTHER = np.arange(8) % 2 == 0


def every_other_numpy(x):
    """Plain NumPy of global_every_other on G0: (value, gradient)."""
    z = G0 + EVERY_OTHER * x
    return np.sum(z * z), 2.0 * z * EVERY_OTHER


X = np.linspace(0.1, 0.8, 8)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_row_write_is_seen_by_the_later_read(backend):
    want = eager(made_row, X)
    np.testing.assert_allclose(want, np.sum(2 * X), rtol=1e-14)          # plain NumPy: z[1] = x
    np.testing.assert_allclose(made_row(X, backend=backend)()[0], want, rtol=1e-14)
    gr = made_row(X, record=True, backend=backend)
    np.testing.assert_allclose(gr()[0], want, rtol=1e-14)
    fd = central(lambda x: eager(made_row, x), X)
    r = eagle.diff.reverse(gr.record, {"result": np.ones(1)}, wrt=("x",))["x"]
    np.testing.assert_allclose(r, fd, atol=1e-7)
    with use_backend(backend):
        value, grad = eagle.value_and_grad(made_row)(X)
    np.testing.assert_allclose(value, want, rtol=1e-14)
    np.testing.assert_allclose(grad, fd, atol=1e-7)


def test_a_row_write_under_to_jax():
    f = eagle.to_jax(made_row)
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(X)))[0], np.sum(2 * X), rtol=1e-14)
    got = jax.grad(lambda x: f(x)[0])(jnp.asarray(X))
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.grad(lambda x: jnp.sum(2 * x))(jnp.asarray(X))))


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_stepped_write_into_a_global(backend):
    want, want_grad = every_other_numpy(X)
    G[...] = G0
    np.testing.assert_allclose(eager(global_every_other, X), want, rtol=1e-14)
    G[...] = G0
    np.testing.assert_allclose(global_every_other(X, backend=backend)()[0], want, rtol=1e-14)
    np.testing.assert_allclose(G, G0 + EVERY_OTHER * X, rtol=1e-14)     # the write lands in the global
    G[...] = G0
    gr = global_every_other(X, record=True, backend=backend)
    np.testing.assert_allclose(gr()[0], want, rtol=1e-14)
    r = eagle.diff.reverse(gr.record, {"result": np.ones(1)}, wrt=("x",))["x"]
    np.testing.assert_allclose(r, want_grad, rtol=1e-12)
    G[...] = G0
    with use_backend(backend):
        value, grad = eagle.value_and_grad(global_every_other)(X)
    np.testing.assert_allclose(value, want, rtol=1e-14)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12)


def test_views_of_one_array_by_different_routes_are_one_plane():
    """z.reshape(-1)[8:], z[1] and z.T[:, 1]... all name z's elements: each write is seen by each read."""
    @eagle.Graph.builder
    def routes(x, backend="numpy"):
        g = eagle.Graph(backend=backend)
        z = (np.arange(24) * 0.25).reshape(3, 8)      # itself a view of the arange's array
        acc(x, z.reshape(-1)[8:16])                   # row 1, through a flat view
        acc(x, z.T[:, 1])                             # row 1 again, through the transpose
        acc(x[::2], z[2, ::2])
        g.result = sumsq(z.reshape(-1)) + total(z[1] * x)
        return g

    want = eager(routes, X)
    z = (np.arange(24) * 0.25).reshape(3, 8)
    z[1] += 2 * X
    z[2, ::2] += X[::2]
    np.testing.assert_allclose(want, np.sum(z * z) + np.sum(z[1] * X), rtol=1e-14)
    for backend in ("numpy", "jax"):
        np.testing.assert_allclose(routes(X, backend=backend)()[0], want, rtol=1e-14)
        with use_backend(backend):
            _, grad = eagle.value_and_grad(routes)(X)
        np.testing.assert_allclose(grad, central(lambda x: eager(routes, x), X), atol=1e-6)


def test_a_transpose_of_an_array_is_refused_with_the_line():
    H = np.zeros((8, 3))

    @eagle.Graph.builder
    def transposed(x):
        g = eagle.Graph()
        acc(x[:3], H.T)
        g.result = total(x)
        return g

    refused(TypeError, lambda: transposed(X), "eagle.Graph.builder transposed:", "z.T is not",
            "np.ascontiguousarray", untouched=(H,))


# ---------------------------------------------------------------------------------------------
# views, property: random chains of views of builder-made and global arrays, written and read back

GLOBALS: dict = {}        # name -> array, the globals generated builders write


def _load(src, name, ns_extra=None):
    filename = f"<views-and-labels {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = dict(np=np, eagle=eagle, acc=acc, total=total, sumsq=sumsq, dbl=dbl, sq=sq, add=add, mul=mul,
              sinp=sinp, **(ns_extra or {}))
    exec(compile(src, filename, "exec"), ns)
    return ns[name]


def _view_chain(rng, shape):
    """1 to 3 NumPy view steps (source text) of an array of `shape`, and whether a .T is among them.
    A reshape is taken of a contiguous view only (NumPy copies otherwise, which is not a view)."""
    v = np.empty(shape)
    steps, transposed = [], False
    for _ in range(rng.integers(1, 4)):
        kind = rng.choice(["int", "slice", "reshape", "T"], p=[0.3, 0.35, 0.25, 0.1])
        if kind == "int" and v.ndim >= 2:
            step = f"[{rng.integers(-v.shape[0], v.shape[0])}]"
        elif kind == "slice":
            axis = rng.integers(v.ndim)
            d = v.shape[axis]
            st = int(rng.choice([1, 2, 3, -1, -2]))
            a = int(rng.integers(0, d))
            b = int(rng.integers(a + 1, d + 1)) if st > 0 else int(rng.integers(-1, a))
            sl = f"{a}:{'' if b < 0 else b}:{st}"
            step = "[" + ", ".join([":"] * int(axis) + [sl]) + "]"
        elif kind == "reshape" and v.flags.c_contiguous and v.size > 1:
            shapes = [(v.size,)] + [(k, v.size // k) for k in range(2, v.size) if v.size % k == 0]
            step = f".reshape{shapes[rng.integers(len(shapes))]}"
        elif kind == "T" and v.ndim >= 2:
            step, transposed = ".T", True
        else:
            continue
        w = eval("v" + step)
        if w.ndim == 0 or w.size == 0 or not np.shares_memory(w, v):
            continue
        v = w
        steps.append(step)
    return "".join(steps), v.shape, transposed


def view_program(seed):
    """A builder over x (one plane of samples) that writes through 1-3 random views of an array z
    (made in the builder, made as a reshape of another array, or a global) and reads z and one more
    random view back. Returns (source, name, z's shape, global's name or None, refusal expected?)."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(2, 5, size=rng.integers(1, 3))) + (int(rng.integers(4, 7)),)
    size = int(np.prod(shape))
    name = f"views_{seed}"
    origin = rng.choice(["made", "reshaped", "global"])
    glob = None
    if origin == "made":
        make = f"z = np.full({shape}, 0.5)"
    elif origin == "reshaped":
        make = f"z = (np.arange({size}) * 0.125 - 1.0).reshape{shape}"
    else:
        glob = f"G_{seed}"
        GLOBALS[glob] = np.empty(shape)
        make = f"z = {glob}"
    lines = [make]
    any_transposed = False
    for _ in range(rng.integers(1, 4)):
        chain, vshape, transposed = _view_chain(rng, shape)
        any_transposed |= transposed
        vsize = int(np.prod(vshape))
        off = int(rng.integers(0, size - vsize + 1))
        xv = f"x.reshape(-1)[{off}:{off + vsize}].reshape({vshape})"
        c = round(float(rng.uniform(0.5, 1.5)), 3)
        op = rng.choice(["add", "mul", "acc"] if len(vshape) == 1 else ["add", "mul"])
        lines.append(f"w = z{chain}")
        if op == "add":
            lines.append(f"w += {c} * {xv}")
        elif op == "mul":
            lines.append(f"w *= 1.0 + {c} * {xv}")
        else:
            lines.append(f"acc({xv}, w)")
    chain, vshape, transposed = _view_chain(rng, shape)
    any_transposed |= transposed
    vsize = int(np.prod(vshape))
    lines.append(f"r = (z{chain} + 0.0 * x.reshape(-1)[:{vsize}].reshape({vshape})).reshape(-1)")
    lines.append("g.result = sumsq(z.reshape(-1)) + 0.5 * sumsq(r)")
    body = "\n".join("    " + t for t in lines)
    src = (f"@eagle.Graph.builder\ndef {name}(x, record=False, backend='numpy'):\n"
           f"    g = eagle.Graph(record=record, backend=backend)\n{body}\n    return g\n")
    return src, name, shape, glob, any_transposed


def check_view_program(seed, backends, transforms=True):
    """The generated builder against its eager run: value on each backend, the global it writes,
    and the gradient (record=True + reverse, value_and_grad; to_jax with jax.grad) against central
    differences of the eager run. Returns 'refused' or 'checked'."""
    src, name, shape, glob, transposed = view_program(seed)
    b = _load(src, name, GLOBALS)
    size = int(np.prod(shape))
    x = np.random.default_rng(seed + 1).uniform(-1.0, 1.0, size)
    init = np.random.default_rng(seed + 2).uniform(-1.0, 1.0, shape)
    where = f"generated program:\n{src}"

    def reset():
        if glob is not None:
            GLOBALS[glob][...] = init

    def run_eager(x_):
        reset()
        return eager(b, x_)

    want = run_eager(x)
    after = GLOBALS[glob].copy() if glob is not None else None
    reset()
    try:
        g = b(x, backend=backends[0])
    except TypeError as e:
        assert transposed and "np.ascontiguousarray" in str(e) and f"{name}:" in str(e), f"{e}\n{where}"
        return "refused"
    for backend in backends:
        reset()
        got = (g if backend == backends[0] else b(x, backend=backend))()[0]
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{backend}, {where}")
        if glob is not None:
            np.testing.assert_allclose(GLOBALS[glob], after, rtol=1e-12, err_msg=f"{backend} global, {where}")
    if not transforms:
        return "checked"
    fd = central(run_eager, x)
    for backend in backends:
        reset()
        gr = b(x, record=True, backend=backend)
        np.testing.assert_allclose(gr()[0], want, rtol=1e-12, err_msg=f"record {backend}, {where}")
        r = eagle.diff.reverse(gr.record, {"result": np.ones(1)}, wrt=("x",))["x"]
        np.testing.assert_allclose(r, fd, rtol=1e-6, atol=1e-6, err_msg=f"reverse {backend}, {where}")
        reset()
        with use_backend(backend):
            value, grad = eagle.value_and_grad(b)(x)
        np.testing.assert_allclose(value, want, rtol=1e-12, err_msg=f"value_and_grad {backend}, {where}")
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6, err_msg=f"value_and_grad {backend}, {where}")
    if "jax" in backends:
        reset()
        f = eagle.to_jax(b)
        np.testing.assert_allclose(np.asarray(f(jnp.asarray(x)))[0], want, rtol=1e-12, err_msg=f"to_jax, {where}")
        got = jax.grad(lambda a: f(a)[0])(jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(got), fd, rtol=1e-6, atol=1e-6, err_msg=f"to_jax grad, {where}")
    return "checked"


def _run_views(seeds, backends, transforms=True):
    outcomes = [check_view_program(s, backends, transforms) for s in seeds]
    assert outcomes.count("checked") >= len(seeds) // 2, outcomes      # the generator mostly makes stageable views
    return outcomes


def test_random_views_numpy():
    _run_views(range(36), ["numpy"])


def test_random_views_jax():
    _run_views(range(100, 103), ["numpy", "jax"])


@pytest.mark.slow
def test_random_views_many():
    _run_views(range(1000, 1300), ["numpy"])
    _run_views(range(2000, 2040), ["numpy", "jax"])


# ---------------------------------------------------------------------------------------------
# a buffer label rebound in an arm that did not run


@eagle.Graph.builder
def label_arm(x, c, record=False, backend="numpy"):
    g = eagle.Graph(record=record, backend=backend)
    a = dbl(x, buffer=True)
    v = add(a, x)
    if c:
        a = sq(x)
    g.result = add(v, a)
    return g


def label_arm_numpy(x, c, eps):
    """The same program with eps added at the label's last write that ran."""
    a = 2 * x + (0 if c else eps)
    v = a + x
    if c:
        a = x * x + eps
    return v + a


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("c", [0, 1])
def test_a_label_rebound_in_an_arm(backend, c):
    x = np.array([0.5, -1.0, 2.0])
    gr = label_arm(x, np.array([c], np.uint32), record=True, backend=backend)
    gr()
    want = central(lambda e: np.sum(label_arm_numpy(x, c, e)), np.zeros(3))
    np.testing.assert_allclose(want, [1.0 if c else 2.0] * 3, rtol=1e-8)
    got = eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",))["a"]
    np.testing.assert_allclose(got, want, rtol=1e-8)
    tangent = eagle.diff.forward(gr.record, {"a": np.ones(3)})["result"]     # per sample: the same numbers
    np.testing.assert_allclose(tangent, want, rtol=1e-8)


def test_an_arm_that_did_not_run_changes_no_derivative():
    """The program with the arm and the program without it: one gradient when the arm is not taken."""
    @eagle.Graph.builder
    def without_arm(x, c, record=False):
        g = eagle.Graph(record=record)
        a = dbl(x, buffer=True)
        v = add(a, x)
        g.result = add(v, a)
        return g

    x = np.array([0.5, -1.0, 2.0])
    off = np.array([0], np.uint32)
    grads = []
    for b in (label_arm, without_arm):
        gr = b(x, off, record=True)
        gr()
        grads.append(eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a", "x")))
    for k in ("a", "x"):
        np.testing.assert_array_equal(grads[0][k], grads[1][k])


@pytest.mark.parametrize("n", [0, 1, 2])
def test_label_rebound_in_a_loop_of_no_turns_means_the_write_before(n):
    @eagle.Graph.builder
    def looped(x, n, record=False):
        g = eagle.Graph(record=record)
        a = dbl(x, buffer=True)
        v = mul(a, x)
        for _ in range(n):
            v = add(v, a)
            a = mul(a, x)
        g.result = add(v, a)
        return g

    def numpy_run(x, eps):
        a = 2 * x + (eps if n == 0 else 0)
        v = a * x
        for t in range(n):
            v = v + a
            a = a * x + (eps if t == n - 1 else 0)
        return v + a

    x = np.array([0.5, -1.0, 2.0])
    gr = looped(x, np.array([n], np.uint32), record=True)
    gr()
    got = eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",))["a"]
    np.testing.assert_allclose(got, central(lambda e: np.sum(numpy_run(x, e)), np.zeros(3)), rtol=1e-7)


def test_a_copied_record_keeps_which_write_ran():
    x = np.array([0.5, -1.0, 2.0])
    c = np.array([0], np.uint32)
    gr = label_arm(x, c, record=True)
    gr()
    kept = gr.record.copy()
    c[0] = 1
    gr()                       # the arm runs now: the live record's label is the arm's write
    np.testing.assert_allclose(eagle.diff.reverse(kept, {"result": np.ones(3)}, wrt=("a",))["a"], [2.0] * 3)
    np.testing.assert_allclose(eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",))["a"], [1.0] * 3)


# ---------------------------------------------------------------------------------------------
# labels, property: random programs rebinding a label in arms (taken or not) and loops

REWRITES = [("dbl", lambda a: 2.0 * a), ("sq", lambda a: a * a), ("sinp", lambda a: np.sin(a) + a)]


class _Gen:
    """A random program over x, cells c1 c2 and a trip count n: the label `a` (buffer=True) is
    rebound at the top level, in if/elif/else arms (nested too) and in device loops; `v` gathers
    uses of a. Rendered as builder source, and run in NumPy with eps at a chosen write. A loop body
    uses the label only before its write: the uses of the last turn's write inside that turn are
    not counted yet (the writes in a loop body share one probe, on the loop's output)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.writes = 0

    def write(self, top=False):
        """`a = k(...)` rebinds the label in device flow; at the top level, where rebinding keeps
        Python's meaning (a new array), the label's buffer is written in place: `a[...] = k(...)`."""
        k = self.writes
        self.writes += 1
        name, _ = REWRITES[self.rng.integers(len(REWRITES))]
        return ("write", k, name, self.rng.choice(["a", "x"]), top)

    def use(self):
        return ("use", self.rng.choice(["add", "mul"]))

    def block(self, depth):
        out = []
        for _ in range(self.rng.integers(1, 4)):
            r = self.rng.random()
            if r < 0.3:
                out.append(self.write(top=depth == 0))
            elif r < 0.55:
                out.append(self.use())
            elif depth < 2 and r < 0.85:
                arms = [self.block(depth + 1)]
                kind = self.rng.choice(["if", "if-else", "if-elif"])
                if kind != "if":
                    arms.append(self.block(depth + 1))
                out.append((kind, arms))
            elif depth == 0:        # a loop body uses the label before it writes it (see _Gen)
                out.append(("loop", [self.use(), self.write()] if self.rng.random() < 0.5
                            else [self.use(), ("if", [[self.write()]])]))
        return out

    def source(self, prog, name):
        lines = [f"@eagle.Graph.builder", f"def {name}(x, c1, c2, n, record=False, backend='numpy'):",
                 "    g = eagle.Graph(record=record, backend=backend)",
                 "    a = dbl(x, buffer=True)", "    v = mul(a, x)"]

        def emit(stmts, d):
            if not stmts:
                lines.append("    " * d + "pass")
            for s in stmts:
                pad = "    " * d
                if s[0] == "write":
                    lines.append(f"{pad}a{'[...]' if s[4] else ''} = {s[2]}({s[3]})")
                elif s[0] == "use":
                    lines.append(f"{pad}v = {s[1]}(v, a)")
                elif s[0] == "loop":
                    lines.append(f"{pad}for _ in range(n):")
                    emit(s[1], d + 1)
                else:
                    lines.append(f"{pad}if c1:")
                    emit(s[1][0], d + 1)
                    if s[0] != "if":
                        lines.append(f"{pad}{'elif c2' if s[0] == 'if-elif' else 'else'}:")
                        emit(s[1][1], d + 1)
        emit(prog, 1)
        lines += ["    g.result = add(mul(v, a), x)", "    return g"]
        return "\n".join(lines) + "\n"


def label_numpy(prog, x, c1, c2, n, at=None, eps=0.0):
    """Run `prog` in NumPy; eps is added at write `at` = (write id, its run count). Returns (result,
    the (id, count) of the label's last write that ran)."""
    rewrite = dict(REWRITES)
    st = {"a": 2.0 * x, "v": None, "last": (-1, 0), "runs": {}}
    if at == (-1, 0):
        st["a"] = st["a"] + eps
    st["v"] = st["a"] * x

    def run(stmts):
        for s in stmts:
            if s[0] == "write":
                k = s[1]
                st["runs"][k] = st["runs"].get(k, 0) + 1
                st["a"] = rewrite[s[2]](st["a"] if s[3] == "a" else x)
                st["last"] = (k, st["runs"][k])
                if at == st["last"]:
                    st["a"] = st["a"] + eps
            elif s[0] == "use":
                st["v"] = st["v"] + st["a"] if s[1] == "add" else st["v"] * st["a"]
            elif s[0] == "loop":
                for _ in range(n):
                    run(s[1])
            elif c1:
                run(s[1][0])
            elif s[0] == "if-else" or (s[0] == "if-elif" and c2):
                run(s[1][1])
    run(prog)
    return st["v"] * st["a"] + x, st["last"]


def check_label_program(seed, backends, cases):
    gen = _Gen(seed)
    prog = gen.block(0)
    name = f"labels_{seed}"
    src = gen.source(prog, name)
    b = _load(src, name)
    x = np.random.default_rng(seed).uniform(0.2, 1.2, 3)
    for c1, c2, n in cases:
        want_val, last = label_numpy(prog, x, c1, c2, n)
        h = 1e-6           # samples are independent: sample i of the result is all eps_i reaches
        fd = np.array([(label_numpy(prog, x, c1, c2, n, last, h * e)[0][i]
                        - label_numpy(prog, x, c1, c2, n, last, -h * e)[0][i]) / (2 * h) for i, e in enumerate(np.eye(3))])
        cells = [np.array([v], np.uint32) for v in (c1, c2, n)]
        for backend in backends:
            gr = b(x, *cells, record=True, backend=backend)
            where = f"c1={c1} c2={c2} n={n} on {backend}, generated program:\n{src}"
            np.testing.assert_allclose(gr(), want_val, rtol=1e-12, err_msg=where)
            got = eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",))["a"]
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-7, err_msg=where)
    return len(cases) * len(backends)


ALL_CASES = [(c1, c2, n) for c1 in (0, 1) for c2 in (0, 1) for n in (0, 1, 2)]


def test_random_label_programs():
    count = sum(check_label_program(s, ["numpy"], ALL_CASES[s % 3::3]) for s in range(30))
    assert count == 120


def test_random_label_programs_jax():
    assert sum(check_label_program(s, ["jax"], ALL_CASES[::4]) for s in range(300, 302)) == 6


@pytest.mark.slow
def test_random_label_programs_many():
    assert sum(check_label_program(s, ["numpy"], ALL_CASES) for s in range(1000, 1200)) == 2400
    assert sum(check_label_program(s, ["jax"], ALL_CASES[::2]) for s in range(2000, 2020)) == 120
