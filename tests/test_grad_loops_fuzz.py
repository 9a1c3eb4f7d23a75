"""Reverse mode through device loops: a regression test, and a fuzzer over random kernels in every
loop context.

Each fuzz case draws one or two kernels whose body is a random expression tree, written twice from
the one tree: as hawk code and as jax.numpy code. A builder calls them on the carries x, z and the
const y inside a loop context (counted, capped, uncapped, nested, an unrolled Python loop), and
the same control flow is written as a plain Python function over the jnp kernels: trip counts come
from cells and counter planes, never from x or y, so the oracle runs the same turns. Every case's
eagle.grad (wrt x and y; its Program checked: each Var defined before use) is compared with
jax.grad of the oracle, and the oracle with central differences of the builder's eager run
(eagle_fx.disable_staging); each case also checks one more of: checkpoints=K, vjp with a random
cotangent, record=True + eagle.diff.reverse, vmap(grad) over x and the trip count, jvp(grad).
"""
from __future__ import annotations

import itertools
import linecache
import re

import jax
import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.transforms.program import TransformError
from hawk_fx import Param, Scalar
from hawk_fx import math as hm
from hawk_fx.core import check_program
from tour_kernels import add, below, cell, inc

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

# the generated uncapped loops are meant: their guards clear, which the oracle checks
pytestmark = pytest.mark.filterwarnings("ignore::eagle_fx.frontend.staging.UncappedLoopWarning")

N = 3                                   # samples per plane
RTOL = 1e-6


# -- the regression: a + exp(b) in a counted loop ---------------------------------

@hawk.kernel
def shift(a: Scalar, b: Scalar) -> Scalar:
    return a + hm.exp(b)


@hawk.kernel
def sum_sq(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def shifted(x, y, k, record=False):
    g = eagle.Graph(record=record)
    for _ in range(k):
        x = shift(x, y)
    g.result = sum_sq(x)
    return g


def test_reverse_through_a_loop_whose_kernel_backward_skips_an_input():
    """shift's plain vjp does not read `a`; inside a loop body it is given zeros for it, which
    used to be pruned before the plain vjp was swapped in (KeyError: Var(:f64[n]))."""
    x, y, k = np.array([0.1, -0.4, 0.7]), np.array([0.3, -0.2, 0.5]), 3
    end = x + k * np.exp(y)                      # sum(end**2): d/dx = 2 end, d/dy = 2 end k exp(y)
    dx, dy = 2 * end, 2 * end * k * np.exp(y)
    f = lambda x_, y_: shifted(x_, y_, cell(k))  # noqa: E731
    for ck in (None, 1, 2):
        gx, gy = eagle.grad(f, argnums=(0, 1), checkpoints=ck)(x, y)
        np.testing.assert_allclose(gx, dx, rtol=1e-12, err_msg=f"checkpoints={ck}")
        np.testing.assert_allclose(gy, dy, rtol=1e-12, err_msg=f"checkpoints={ck}")
        check_program(eagle.make_program(eagle.grad(f, argnums=(0, 1), checkpoints=ck))(x, y))
    _, pullback = eagle.vjp(f, x, y)
    gx, gy = pullback(np.array([0.5]))
    np.testing.assert_allclose(gx, 0.5 * dx, rtol=1e-12)
    np.testing.assert_allclose(gy, 0.5 * dy, rtol=1e-12)
    g = shifted(x.copy(), y.copy(), cell(k), record=True)
    g()
    r = eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("x", "y"))
    np.testing.assert_allclose(r["x"], dx, rtol=1e-12)
    np.testing.assert_allclose(r["y"], dy, rtol=1e-12)


@eagle.Graph.builder
def ignores_x(x, y, z, record=False):
    g = eagle.Graph(record=record)
    g.result = sum_sq(add(y, z))
    return g


def test_reverse_wrt_an_argument_the_graph_does_not_read():
    """An argument no node reads is no program input; its gradient is zero, as jax.grad gives."""
    x, y = np.ones(N, np.float32), np.arange(N, dtype=float)
    g = ignores_x(x, y, np.full(N, 0.5), record=True)
    g()
    r = eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("x", "y"))
    np.testing.assert_array_equal(r["x"], np.zeros(N))
    assert r["x"].dtype == np.float32
    np.testing.assert_allclose(r["y"], 2 * (y + 0.5))
    with pytest.raises(KeyError, match=r"'w' is not a builder argument.*this graph's: y, z, x\)"):
        eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("w",))
    t = eagle.diff.forward(g.record, {"x": np.ones(N, np.float32), "y": np.ones(N)})["result"]
    np.testing.assert_allclose(t, [np.sum(2 * (y + 0.5))])


def test_grad_wrt_an_argument_the_builder_does_not_read_beside_a_made_array():
    """An unread differentiated argument gets a zero gradient beside an array the function made
    (np.full); one it made from a differentiated argument (x_ * 2) is still refused."""
    x, y = np.ones(N), np.arange(N, dtype=float)
    gx, gy = eagle.grad(lambda x_, y_: ignores_x(x_, y_, np.full(N, 0.5)), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, np.zeros(N))
    np.testing.assert_allclose(gy, 2 * (y + 0.5))
    np.testing.assert_array_equal(eagle.grad(lambda x_: ignores_x(x_, y, np.full(N, 0.5)))(x), np.zeros(N))
    with pytest.raises(TransformError, match="computed in Python from x_"):
        eagle.grad(lambda x_, y_: ignores_x(x_, y_, x_ * 2.0), argnums=(0, 1))(x, y)


@hawk.kernel
def constant(a: Scalar) -> Scalar:
    return 0.5 + 0.25


@hawk.kernel
def doubled_param(a: Scalar, p: Param) -> Scalar:
    return p * 2.0


def test_a_scalar_kernel_of_a_constant_gives_one_value_per_sample():
    """A result the same in every sample is one value per sample, as jax.vmap broadcasts a
    constant function's output; a reduction over the samples stays one value (a cell)."""
    x = np.arange(3.0)
    np.testing.assert_array_equal(constant(x), np.full(3, 0.75))
    np.testing.assert_array_equal(doubled_param(x, 1.5), np.full(3, 3.0))
    np.testing.assert_array_equal(doubled_param(x, np.array([1.5])), np.full(3, 3.0))
    np.testing.assert_array_equal(sum_sq(x), [np.sum(x * x)])
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda a: 0.5 + 0.25)(x)), constant(x))


@eagle.Graph.builder
def reset_in_a_loop(x, k):
    g = eagle.Graph()
    s = add(x, x)
    for _ in range(k):                           # a device loop: s is carried, a per-sample plane
        s = constant(s)
    g.result = sum_sq(s)
    return g


def test_a_constant_kernel_as_a_loop_carry():
    x = np.arange(3.0)
    np.testing.assert_allclose(reset_in_a_loop(x, cell(2))(), [3 * 0.75 ** 2])
    np.testing.assert_allclose(reset_in_a_loop(x, cell(0))(), [np.sum((2 * x) ** 2)])


# -- the fuzzer ---------------------------------------------------------------------------------------

UNARY = ("exp({})", "sin({})", "cos({})", "tanh({})", "log1p({0} * {0})", "sqrt(1.0 + {0} * {0})")
INLINE = ("({0} / (1.0 + {0} * {0}))", "(0.5 * {})", "(-{})")
BINARY = ("({} + {})", "({} - {})", "({} * {})")
SELECT = "where({0} > 0.0, {0} * {1}, 0.25 * {1} * {1})"      # a per-sample select (value continuous at 0)
CONTEXTS = ("python", "counted", "capped", "uncapped", "nested")
EXTRAS = ("checkpoints", "vjp", "record", "vmap", "hvp")


def expression(rng, names, depth, root=False):
    """(hawk text, jnp text) of a random smooth expression over `names` (not a bare leaf at the root)."""
    if depth == 0 or (not root and rng.random() < 0.25):
        if rng.random() < 0.15:
            v = repr(float(rng.choice((0.5, 1.5, -0.75))))
            return v, v
        v = str(rng.choice(names))
        return v, v
    r = rng.random()
    if r < 0.4:
        f, (h, j) = str(rng.choice(UNARY)), expression(rng, names, depth - 1)
        return "hm." + f.format(h), "jnp." + f.format(j)
    if r < 0.5:
        f, (h, j) = str(rng.choice(INLINE)), expression(rng, names, depth - 1)
        return f.format(h), f.format(j)
    (h1, j1), (h2, j2) = expression(rng, names, depth - 1), expression(rng, names, depth - 1)
    if r < 0.57:
        return "hm." + SELECT.format(h1, h2), "jnp." + SELECT.format(j1, j2)
    f = str(rng.choice(BINARY))
    return f.format(h1, h2), f.format(j1, j2)


class Case:
    """One random builder and its oracle, as source text: `hawk` (kernels and the builder) and
    `oracle` (the jnp kernels and the builder's control flow as plain Python over them)."""

    def __init__(self, rng, context):
        self.rng = rng
        self.hawk, self.oracle, self.kernels = [], [], []
        for k in range(int(rng.integers(1, 3))):
            params = ["a", "b", "c"][:int(rng.integers(1, 4))]
            h, j = expression(rng, params, int(rng.integers(1, 4)), root=True)
            while not re.search(r"\b[abc]\b", h):        # the body reads a parameter (see the xfail above)
                h, j = expression(rng, params, int(rng.integers(1, 4)), root=True)
            if rng.random() < 0.4:                     # a linear input beside a costly value (a + exp(b))
                op = str(rng.choice(BINARY))
                h, j = op.format(params[0], h), op.format(params[0], j)
            self.hawk += ["@hawk.kernel", f"def k{k}({', '.join(p + ': Scalar' for p in params)}) -> Scalar:",
                          f"    return {h}", ""]
            self.oracle += [f"def k{k}({', '.join(params)}):", f"    return {j}", ""]
            self.kernels.append((f"k{k}", len(params)))
        self.lines = []                                # (depth, builder text, oracle text)
        if rng.random() < 0.3:
            self.statements(0)
        self.loop(0, context)
        if rng.random() < 0.3:
            self.statements(0)

    def emit(self, d, builder, oracle=None):
        self.lines.append((d, builder, builder if oracle is None else oracle))

    def statements(self, d):
        for _ in range(int(self.rng.integers(1, 3))):
            name, arity = self.kernels[int(self.rng.integers(len(self.kernels)))]
            args = ", ".join(str(a) for a in self.rng.choice(("x", "z", "y"), arity))
            self.emit(d, f"{self.rng.choice(('x', 'z'))} = {name}({args})")

    def loop(self, d, kind):
        """A loop at indent d, its body at d + 1: statements, maybe a device if, a jump and (nested)
        another loop, in a random order. A capped or uncapped loop's counter t{d} rises by one at the
        start of each turn and clears its guard d{d} at lim; its jumps (break, continue) test d{d}."""
        rng = self.rng
        if kind == "nested":
            kind = tuple(str(rng.choice(("counted", "capped", "uncapped", "python"))) for _ in range(2))
        outer, inner = kind if isinstance(kind, tuple) else (kind, None)
        lim = float(rng.choice((0.5, 1.5, 2.5, 3.5)))
        guarded = outer in ("capped", "uncapped")
        if guarded:
            self.emit(d, f"t{d} = inc(t)", f"t{d} = 1.0")
            self.emit(d, f"below(t{d}, {lim}, d{d})", f"d{d} = int(t{d} < {lim})")
        if outer == "python":
            self.emit(d, "for _ in range(2):")
        elif outer == "counted":
            self.emit(d, "for _ in range(c):", "for _ in range(c[0]):")
        elif outer == "capped":
            self.emit(d, f"for _ in range({int(rng.integers(1, 5))}):")
            self.emit(d + 1, f"if not d{d}: break")
        else:
            self.emit(d, f"while d{d}:")
        if guarded:
            self.emit(d + 1, f"t{d} = inc(t{d})", f"t{d} = t{d} + 1.0")
            self.emit(d + 1, f"below(t{d}, {lim}, d{d})", f"d{d} = int(t{d} < {lim})")
        parts = [self.statements]
        if rng.random() < 0.3:
            parts.append(lambda at: self.branch(at, f"d{d}" if guarded else "c"))
        if guarded and rng.random() < 0.3:
            parts.append(lambda at: self.emit(at, str(rng.choice((f"if not d{d}: break", f"if d{d}: continue")))))
        if inner is not None:
            parts.append(lambda at: self.loop(at, inner))
        for k in rng.permutation(len(parts)):
            parts[k](d + 1)

    def branch(self, d, flag):
        """A device if on a cell (the counted loops' trip count, or a guard that changes each turn)."""
        self.emit(d, f"if {flag}:", "if c[0]:" if flag == "c" else None)
        self.statements(d + 1)
        if self.rng.random() < 0.5:
            self.emit(d, "else:")
            self.statements(d + 1)

    def source(self, name):
        builder = ["@eagle.Graph.builder", f"def {name}(x, y, z, c, d0, d1, t, record=False):",
                   "    g = eagle.Graph(record=record)"]
        builder += ["    " * (d + 1) + b for d, b, _ in self.lines]
        builder += ["    g.result = score(x, z)", "    return g", ""]
        oracle = [f"def {name}(x, y, z, c, d0, d1):"] + ["    " * (d + 1) + o for d, _, o in self.lines]
        oracle += ["    return jnp.sum(0.1 * x * x + 0.3 * z)", ""]
        return "\n".join(self.hawk + builder), "\n".join(self.oracle + oracle)


HEADER = """import numpy as np
import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx import math as hm
from tour_kernels import below, inc


@hawk.kernel
def score(x: Scalar, z: Scalar) -> Scalar:
    return hawk.sum(0.1 * x * x + 0.3 * z)


"""
_ids = itertools.count()


def load(text, name, namespace):
    """Run generated source as if from a file (hawk's and the builder's passes read a function's text)."""
    filename = f"<grad loop fuzz {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns = dict(namespace)
    exec(compile(text, filename, "exec"), ns)
    return ns[name]


def draw(seed):
    """Case `seed`: its context (by seed), its builder, oracle and arrays; drawn again (a sub-seed)
    until the oracle's value and gradients are finite and moderate (loops of products can blow up)."""
    context = CONTEXTS[seed % len(CONTEXTS)]
    for attempt in itertools.count():
        rng = np.random.default_rng([seed, attempt])
        name = f"case{next(_ids)}"
        hawk_src, jnp_src = Case(rng, context).source(name)
        oracle = load(jnp_src, name, {"jnp": jnp})
        x, y, z = rng.uniform(-1.0, 1.0, (3, N))
        c = cell(int(rng.integers(0, 4)))
        value, grads = jax.value_and_grad(oracle, argnums=(0, 1))(x, y, z, c, 0, 0)
        worst = max(abs(float(value)), *(float(np.max(np.abs(g))) for g in grads))
        if np.isfinite(worst) and worst < 1e3:
            return dict(builder=load(HEADER + hawk_src, name, {}), oracle=oracle, src=hawk_src, x=x, y=y, z=z, c=c,
                        value=float(value), grads=[np.asarray(g) for g in grads])


def close(got, want, what, rtol=RTOL):
    scale = 1.0 + max(float(np.max(np.abs(w))) for w in want)
    for a, b, n in zip(got, want, "xy"):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, err_msg=f"{what}, d/d{n}")


def differences(fn, x, y, h=1e-6):
    """Central differences of fn(x, y) with respect to x and to y."""
    return [np.array([(fn(x + h * e, y) - fn(x - h * e, y)) / (2 * h) for e in np.eye(N)]),
            np.array([(fn(x, y + h * e) - fn(x, y - h * e)) / (2 * h) for e in np.eye(N)])]


def check_case(seed):
    """Case `seed`: its context is CONTEXTS[seed % 5], its extra check EXTRAS[seed // 5 % 5] (each
    pair in every 25 seeds)."""
    k = draw(seed)
    builder, src, x, y, z, c = k["builder"], k["src"], k["x"], k["y"], k["z"], k["c"]
    t = np.zeros(N)

    def f(x_, y_, c_=c, record=False):
        return builder(x_, y_, z, c_, cell(0), cell(0), t, record=record)

    def eager(x_, y_):
        with eagle.disable_staging():
            return float(np.asarray(f(x_, y_)()).reshape(-1)[0])
    try:
        # the oracle is the builder's math: its value is the eager run's, its gradients their differences
        assert eager(x, y) == pytest.approx(k["value"], rel=1e-12, abs=1e-12)
        close(k["grads"], differences(eager, x, y), "jax.grad of the oracle against central differences of the eager run", rtol=1e-5)
        close(eagle.grad(f, argnums=(0, 1))(x, y), k["grads"], "eagle.grad")
        check_program(eagle.make_program(eagle.grad(f, argnums=(0, 1)))(x, y))
        extra = EXTRAS[(seed // len(CONTEXTS)) % len(EXTRAS)]
        if extra == "checkpoints":
            ck = 1 + seed % 3
            close(eagle.grad(f, argnums=(0, 1), checkpoints=ck)(x, y), k["grads"], f"grad(checkpoints={ck})")
            check_program(eagle.make_program(eagle.grad(f, argnums=(0, 1), checkpoints=ck))(x, y))
        elif extra == "vjp":
            w = 0.5 + seed % 7
            value, pullback = eagle.vjp(f, x, y)
            assert float(np.asarray(value).reshape(-1)[0]) == pytest.approx(k["value"], rel=1e-12, abs=1e-12)
            close(pullback(np.array([w])), [w * g for g in k["grads"]], "vjp")
        elif extra == "record" and "while" in src:
            with pytest.raises(ValueError, match="uncapped device loop cannot be recorded"):
                f(x.copy(), y.copy(), record=True)
        elif extra == "record":
            g = f(x.copy(), y.copy(), record=True)
            g()
            got = []
            got = [eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=(name,))[name] for name in "xy"]
            close(got, k["grads"], "record/reverse")
        elif extra == "hvp":
            # forward over reverse: a Hessian-vector product through the loops
            v = np.linspace(-1.0, 1.0, N)
            got = eagle.jvp(eagle.grad(lambda x_: f(x_, y)), (x,), (v,))[1]
            want = jax.jvp(jax.grad(lambda x_: k["oracle"](x_, y, z, c, 0, 0)), (x,), (v,))[1]
            close([got], [np.asarray(want)], "jvp(grad)")
        else:
            # vmap over x and the counted loop's trip count: each instance its own turns
            X, C = np.stack([x, 0.5 * x, -x]), np.array([[0], [1], [3]], np.uint32)
            got = eagle.vmap(eagle.grad(lambda x_, c_: f(x_, y, c_)))(X, C)
            for i in range(len(X)):
                want = jax.grad(k["oracle"])(X[i], y, z, C[i], 0, 0)
                close([got[i]], [np.asarray(want)], f"vmap(grad) instance {i}")
    except Exception as e:
        e.add_note(f"case {seed}, the generated builder:\n{src}")
        raise


DEFAULT_CASES = 60
SLOW_CASES = 600


@pytest.mark.parametrize("seed", range(DEFAULT_CASES))
def test_grad_through_loops_of_random_kernels(seed):
    check_case(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(DEFAULT_CASES, DEFAULT_CASES + SLOW_CASES))
def test_grad_through_loops_of_many_random_kernels(seed):
    check_case(seed)
