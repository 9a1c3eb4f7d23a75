"""NumPy math on staged planes: ufuncs and operators are staged as kernel calls, the rest refused.

Oracles: NumPy itself on the arrays (forward values, after every replay), jax.grad of the same
computation and central finite differences (gradients), a loop over instances (vmap).
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar, Vector
from eagle_fx.frontend.staged_numpy import COMPOSED, UFUNCS
from hawk_fx.core import LeakedTracerError

from conftest import line_of

pytestmark = pytest.mark.usefixtures("backend")     # every test on numpy and on jax

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


@hawk.kernel
def total(x: Scalar):
    return hawk.sum(x * x)


@hawk.kernel
def dbl(x: Scalar):
    return 2.0 * x


@hawk.kernel
def vtotal(v: Vector[2]):
    return hawk.sum(v[0] * v[1] + v[1])


@hawk.kernel
def put(x: Scalar, y: Mutable[Scalar]):
    y = x


# -- every ufunc hawk_fx.math has, staged, against NumPy on the arrays ------------------------------

def _domain(uf, rng, n):
    if uf in (np.arccosh,):
        return 1.5 + rng.random(n)
    if uf in (np.arcsin, np.arccos, np.arctanh):
        return rng.uniform(-0.9, 0.9, n)
    if uf in (np.log, np.log2, np.log10, np.sqrt, np.power, np.fmod, np.reciprocal):
        return 0.5 + rng.random(n)
    return rng.normal(size=n) * 2.0


def _ufunc_builder(uf):
    if uf.nin == 1:
        @eagle.Graph.builder
        def one(x, y):
            g = eagle.Graph()
            g.result = uf(x)
            return g
        return one

    @eagle.Graph.builder
    def two(x, y):
        g = eagle.Graph()
        g.result = uf(x, y)
        return g
    return two


@pytest.mark.parametrize("uf", list(UFUNCS) + list(COMPOSED), ids=[u.__name__ for u in list(UFUNCS) + list(COMPOSED)])
def test_every_staged_ufunc_matches_numpy_after_each_replay(uf, rng, backend):
    x, y = _domain(uf, rng, 6), _domain(uf, rng, 6)
    g = _ufunc_builder(uf)(x, y)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(g(), uf(x, y) if uf.nin == 2 else uf(x), rtol=1e-12, atol=1e-15)
        x[:] = _domain(uf, rng, 6)
        np.testing.assert_allclose(g(), uf(x, y) if uf.nin == 2 else uf(x), rtol=1e-12, atol=1e-15)


# -- NumPy ufuncs in builders: values, gradients, vmap ------------------------------------------------

@eagle.Graph.builder
def sin_of_x(x):
    g = eagle.Graph()
    g.result = total(np.sin(x))
    return g


@eagle.Graph.builder
def times_two(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = total(y * 2.0)
    return g


@eagle.Graph.builder
def sum_of_two(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = total(x + y)
    return g


@eagle.Graph.builder
def negated(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = total(-y)
    return g


@eagle.Graph.builder
def mixed(x):
    g = eagle.Graph()
    y = np.exp(x[1:]) / (1.0 + x[:-1] ** 2) - abs(x[1:]) * 0.5
    g.result = total(np.maximum(y, np.tanh(x[:-1])))
    return g


@eagle.Graph.builder
def rows_math(p):
    g = eagle.Graph()
    g.result = vtotal(np.stack([np.cos(p[0]) * p[1], p[1] - p[0]]))
    return g


CASES = [
    (sin_of_x, lambda x: jnp.sum(jnp.sin(x) ** 2), (5,)),
    (times_two, lambda x: jnp.sum((2.0 * x * 2.0) ** 2), (5,)),
    (sum_of_two, lambda x: jnp.sum((x + 2.0 * x) ** 2), (5,)),
    (negated, lambda x: jnp.sum((-2.0 * x) ** 2), (5,)),
    (mixed, lambda x: jnp.sum(jnp.maximum(jnp.exp(x[1:]) / (1.0 + x[:-1] ** 2) - jnp.abs(x[1:]) * 0.5,
                                          jnp.tanh(x[:-1])) ** 2), (6,)),
    (rows_math, lambda p: jnp.sum(jnp.cos(p[0]) * p[1] * (p[1] - p[0]) + (p[1] - p[0])), (2, 4)),
]
IDS = [c[0].__name__ for c in CASES]


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_values_follow_the_argument(builder, jf, shape, rng, backend):
    x = rng.normal(size=shape)
    g = builder(x)
    np.testing.assert_allclose(g()[0], float(jf(jnp.asarray(x))), rtol=1e-12)
    x[:] = rng.normal(size=shape)
    np.testing.assert_allclose(g()[0], float(jf(jnp.asarray(x))), rtol=1e-12)
    other = rng.normal(size=shape)
    g.bind(**{list(builder.signature.parameters)[0]: other})
    np.testing.assert_allclose(g()[0], float(jf(jnp.asarray(other))), rtol=1e-12)


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_grad_matches_jax_and_finite_differences(builder, jf, shape, rng):
    x = rng.normal(size=shape)
    got = eagle.grad(builder)(x)
    np.testing.assert_allclose(got, np.asarray(jax.grad(jf)(jnp.asarray(x))), rtol=1e-10, atol=1e-12)
    name, h = list(builder.signature.parameters)[0], 1e-6
    g = builder(x.copy())
    fd = np.zeros(shape)
    for i in np.ndindex(*shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        up = g.bind(**{name: xp})()[0]
        fd[i] = (up - g.bind(**{name: xm})()[0]) / (2 * h)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_vmap_matches_a_loop(builder, jf, shape, rng):
    X = rng.normal(size=(3,) + shape)
    got = np.asarray(eagle.vmap(builder)(X)()).reshape(3)
    np.testing.assert_allclose(got, [float(jf(jnp.asarray(X[i]))) for i in range(3)], rtol=1e-12)
    jvps = eagle.vmap(lambda x, t: eagle.jvp(builder, (x,), (t,)))(X, np.ones_like(X))
    for i in range(3):
        _, want = jax.jvp(jf, (jnp.asarray(X[i]),), (jnp.ones(shape),))
        np.testing.assert_allclose(np.asarray(jvps[1][i]).reshape(()), float(want), rtol=1e-10)


# -- what keeps its meaning ----------------------------------------------------------------------

@eagle.Graph.builder
def constants(x):
    g = eagle.Graph()
    w = np.linspace(1.0, 2.0, x.shape[0])         # an array the builder makes: a constant, as today
    z = np.zeros_like(x)                          # *_like constructors make arrays, not planes
    put(x * w, z)
    g.result = (total(z), z)
    return g


def test_arrays_made_in_the_builder_keep_their_meaning(rng, backend):
    x = rng.normal(size=4)
    g = constants(x)
    out, z = g()
    w = np.linspace(1.0, 2.0, 4)
    np.testing.assert_allclose(z, x * w)
    np.testing.assert_allclose(out[0], np.sum((x * w) ** 2))
    assert isinstance(z, np.ndarray)


@eagle.Graph.builder
def float32_math(x):
    g = eagle.Graph()
    g.result = np.sqrt(x) * 2.0 + 1.0
    return g


def test_float32_stays_float32(rng):
    x = rng.random(4).astype(np.float32)
    out = float32_math(x)()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.sqrt(x) * np.float32(2) + np.float32(1), rtol=1e-6)


# -- refusals: the builder's line and what to write instead -------------------------------------------

def _refused(exc, builder, args, fragment, *words, untouched=()):
    before = [a.copy() for a in untouched]
    with pytest.raises(exc) as info:
        builder(*args)
    msg = str(info.value)
    where = f"{builder.__name__}:{line_of(builder, fragment) - line_of(builder, '@eagle') + 1}"
    for w in (where,) + words:
        assert w in msg, f"{w!r} not in {msg!r}"
    for a, b in zip(untouched, before):
        np.testing.assert_array_equal(a, b)


@eagle.Graph.builder
def reduces(x, y):
    g = eagle.Graph()
    put(x, y)
    g.result = total(x) * np.std(x)
    return g


@eagle.Graph.builder
def method_reduces(x):
    g = eagle.Graph()
    g.result = total(x) * x.cumsum()
    return g


@eagle.Graph.builder
def no_kernel_for_it(x):
    g = eagle.Graph()
    g.result = total(np.cumsum(x))
    return g


@eagle.Graph.builder
def out_where(x, y):
    g = eagle.Graph()
    np.sin(x, out=y, where=x > 0.0)
    g.result = total(y)
    return g


@eagle.Graph.builder
def converts(x):
    g = eagle.Graph()
    g.result = total(np.asarray(x) + 1.0)
    return g


@eagle.Graph.builder
def sample_int(x):
    g = eagle.Graph()
    g.result = total(x[0])
    return g


@eagle.Graph.builder
def new_axis(x):
    g = eagle.Graph()
    g.result = total(x[None])
    return g


@eagle.Graph.builder
def fancy(x):
    g = eagle.Graph()
    g.result = total(x[[0, 2]])
    return g


@eagle.Graph.builder
def transposed(p):
    g = eagle.Graph()
    g.result = vtotal(p.T)
    return g


@eagle.Graph.builder
def stacked_last(x):
    g = eagle.Graph()
    g.result = vtotal(np.stack([x, x], axis=-1))
    return g


def test_refusals_name_the_line_and_the_fix(rng):
    x, y = rng.normal(size=4), np.zeros(4)
    _refused(TypeError, reduces, (x, y), "np.std", "np.std on a staged plane is not staged", "write a kernel",
             "hawk.sum", untouched=(y,))
    _refused(TypeError, method_reduces, (x,), "x.cumsum()", ".cumsum of a staged plane", "write a kernel")
    _refused(TypeError, no_kernel_for_it, (x,), "np.cumsum", "np.cumsum on a staged plane is not staged",
             "write a kernel")
    _refused(TypeError, out_where, (x, y), "out=y", "np.sin(where=...)", "np.where(mask", untouched=(y,))
    _refused(TypeError, converts, (x,), "np.asarray", "converted to a NumPy array", "baked")
    _refused(IndexError, sample_int, (x,), "x[0]", "sample axis", "x[..., k:k+1]")
    _refused(IndexError, new_axis, (x,), "x[None]", "None (np.newaxis)", ".reshape")
    _refused(IndexError, fancy, (x,), "x[[0, 2]]", "not a basic index", "write a kernel")
    _refused(ValueError, transposed, (rng.normal(size=(2, 4)),), "p.T", "moves its last (sample) axis")
    _refused(ValueError, stacked_last, (x,), "axis=-1", "sample axis", "axis=0")


@eagle.Graph.builder
def as_float(x):
    g = eagle.Graph()
    g.result = total(x * float(x[1:2]))
    return g


@eagle.Graph.builder
def iterates(x):
    g = eagle.Graph()
    for v in x:
        g.result = total(v)
    return g


@eagle.Graph.builder
def unpacks(p):
    g = eagle.Graph()
    a, b = p                                  # rows of a (2, n) plane: two views
    g.result = total(a * b)
    return g


def test_python_values_of_planes_are_refused_and_rows_unpack(rng):
    x = rng.normal(size=4)
    _refused(TypeError, as_float, (x,), "float(x[1:2])", "float() of a staged plane", "no value")
    _refused(TypeError, iterates, (x,), "for v in x", "walks its samples", "kernel")
    p = rng.normal(size=(2, 4))
    np.testing.assert_allclose(unpacks(p)()[0], np.sum((p[0] * p[1]) ** 2))
    np.testing.assert_allclose(eagle.grad(unpacks)(p), [2 * p[0] * p[1] ** 2, 2 * p[1] * p[0] ** 2])


def test_a_plane_leaked_from_a_built_graph_is_refused_in_another_builder(rng):
    kept = []

    @eagle.Graph.builder
    def leaks(x):
        g = eagle.Graph()
        y = dbl(x)
        kept.append(y)
        g.result = y
        return g

    @eagle.Graph.builder
    def uses(x):
        g = eagle.Graph()
        g.result = total(np.sin(kept[0]) + x)
        return g

    x = rng.normal(size=4)
    leaks(x)()
    with pytest.raises(LeakedTracerError, match="made by eagle.Graph.builder leaks"):
        uses(x)


@eagle.Graph.builder
def functions(x, c):
    g = eagle.Graph()
    g.result = (np.where(x > 0.0, x, -2.0 * x), np.clip(x, -0.5, 0.5), np.round(x * 3.0), x.astype(np.float32),
                np.maximum(x, c), x.copy())
    return g


def test_where_clip_round_astype_copy_follow_the_arguments(rng, backend):
    x, c = rng.normal(size=5), np.array([0.25])
    g = functions(x, c)
    for _ in range(2):
        w, cl, r, f32, m, cp = g()
        np.testing.assert_array_equal(w, np.where(x > 0.0, x, -2.0 * x))
        np.testing.assert_array_equal(cl, np.clip(x, -0.5, 0.5))
        np.testing.assert_array_equal(r, np.round(x * 3.0))
        assert f32.dtype == np.float32
        np.testing.assert_array_equal(f32, x.astype(np.float32))
        np.testing.assert_array_equal(m, np.maximum(x, c))
        np.testing.assert_array_equal(cp, x)
        x[:] = rng.normal(size=5)
        c[0] = -0.25


@eagle.Graph.builder
def mismatched(x):
    g = eagle.Graph()
    g.result = total(x[:2] + x)
    return g


def test_operands_that_do_not_broadcast_are_refused_as_numpy_would(rng):
    _refused(ValueError, mismatched, (rng.normal(size=4),), "x[:2] + x", "np.add of planes of shapes (2,), (4,)",
             "do not broadcast")


@eagle.Graph.builder
def reads_a_cell(x, c):
    g = eagle.Graph()
    if c[0]:
        x = dbl(x)
    g.result = total(x)
    return g


def test_indexing_a_cell_points_at_device_conditions(rng):
    _refused(IndexError, reads_a_cell, (rng.normal(size=4), np.array([1], np.uint32)), "c[0]", "sample axis",
             "itself a device condition: `if c:`")
