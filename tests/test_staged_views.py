"""Staged views: indexing, reshape and stack/concatenate of builder arguments are IR operations.

Every case is one builder and the same computation written with jax.numpy (the oracle): the
replayed value, the value after `x[:] = ...` and after `g.bind`, eagle_fx.grad against jax.grad
and central finite differences, and eagle_fx.vmap against a loop over the instances.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Mutable, Scalar, Vector

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


@hawk.kernel
def total(x: Scalar):
    return hawk.sum(x * x)


@hawk.kernel
def cubes(x: Scalar):
    return hawk.sum(x * x * x)


@hawk.kernel
def mix(a: Scalar, b: Scalar):
    return hawk.sum(a * b + a * a)


@hawk.kernel
def vdot2(v: Vector[2]):
    return hawk.sum(hm.dot(v, v) * v[0])


@hawk.kernel
def vdot3(v: Vector[3]):
    return hawk.sum(hm.dot(v, v) * v[1])


@hawk.kernel
def dbl(x: Scalar):
    return 2.0 * x


@hawk.kernel
def sq(x: Scalar):
    return x * x


@hawk.kernel
def scale(x: Scalar, y: Mutable[Scalar]):
    y = 3.0 * x


@eagle.Graph.builder
def head(x):
    g = eagle.Graph()
    g.result = total(x[:2])
    return g


@eagle.Graph.builder
def tail(x):
    g = eagle.Graph()
    g.result = cubes(x[1:])
    return g


@eagle.Graph.builder
def strided(x):
    g = eagle.Graph()
    g.result = cubes(x[::2])
    return g


@eagle.Graph.builder
def rows(p):
    g = eagle.Graph()
    g.result = mix(p[0], p[1])
    return g


@eagle.Graph.builder
def middle_rows(p):
    g = eagle.Graph()
    g.result = vdot2(p[1:3])
    return g


@eagle.Graph.builder
def last_samples(v):
    g = eagle.Graph()
    g.result = vdot3(v[..., :2])
    return g


@eagle.Graph.builder
def view_of_view(p):
    g = eagle.Graph()
    g.result = cubes(p[1:][1][::-2])
    return g


@eagle.Graph.builder
def flat(p):
    g = eagle.Graph()
    g.result = cubes(p.reshape(-1))
    return g


@eagle.Graph.builder
def stacked(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = vdot2(np.stack([x, y]))
    return g


@eagle.Graph.builder
def joined(x):
    g = eagle.Graph()
    g.result = cubes(np.concatenate([x[:2], sq(x)]))
    return g


@eagle.Graph.builder
def of_result(x):
    g = eagle.Graph()
    y = sq(x)
    g.result = cubes(y[1:3])
    return g


def _sum3(v):
    return jnp.sum(jnp.sum(v * v, axis=0) * v[0])


CASES = [
    (head, lambda x: jnp.sum(x[:2] ** 2), (5,)),
    (tail, lambda x: jnp.sum(x[1:] ** 3), (5,)),
    (strided, lambda x: jnp.sum(x[::2] ** 3), (5,)),
    (rows, lambda p: jnp.sum(p[0] * p[1] + p[0] ** 2), (2, 4)),
    (middle_rows, lambda p: _sum3(p[1:3]), (4, 3)),
    (last_samples, lambda v: jnp.sum(jnp.sum(v[..., :2] ** 2, axis=0) * v[1, :2]), (3, 4)),
    (view_of_view, lambda p: jnp.sum(p[1:][1][::-2] ** 3), (3, 5)),
    (flat, lambda p: jnp.sum(p.reshape(-1) ** 3), (2, 3)),
    (stacked, lambda x: _sum3(jnp.stack([x, 2.0 * x])), (4,)),
    (joined, lambda x: jnp.sum(jnp.concatenate([x[:2], x * x]) ** 3), (4,)),
    (of_result, lambda x: jnp.sum((x * x)[1:3] ** 3), (4,)),
]
IDS = [c[0].__name__ for c in CASES]


def _value(jf, x):
    return float(jf(jnp.asarray(x)))


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_replay_follows_the_argument(builder, jf, shape, rng):
    x = rng.normal(size=shape)
    g = builder(x)
    np.testing.assert_allclose(g()[0], _value(jf, x), rtol=1e-12)
    x[:] = rng.normal(size=shape)                  # the caller changes the array: the views follow
    np.testing.assert_allclose(g()[0], _value(jf, x), rtol=1e-12)
    other = rng.normal(size=shape)
    g.bind(**{list(builder.signature.parameters)[0]: other})
    np.testing.assert_allclose(g()[0], _value(jf, other), rtol=1e-12)


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_grad_matches_jax_and_finite_differences(builder, jf, shape, rng):
    x = rng.normal(size=shape)
    got = eagle.grad(builder)(x)
    np.testing.assert_allclose(got, np.asarray(jax.grad(jf)(jnp.asarray(x))), rtol=1e-10, atol=1e-12)
    g, h = builder(x.copy()), 1e-6
    fd = np.zeros(shape)
    for i in np.ndindex(*shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g.bind(**{list(builder.signature.parameters)[0]: xp})
        up = g()[0]
        g.bind(**{list(builder.signature.parameters)[0]: xm})
        fd[i] = (up - g()[0]) / (2 * h)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_jvp_matches_jax(builder, jf, shape, rng):
    x, t = rng.normal(size=shape), rng.normal(size=shape)
    _, got = eagle.jvp(builder, (x,), (t,))
    _, want = jax.jvp(jf, (jnp.asarray(x),), (jnp.asarray(t),))
    np.testing.assert_allclose(got[0], float(want), rtol=1e-10)


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_vmap_matches_a_loop(builder, jf, shape, rng):
    X = rng.normal(size=(3,) + shape)
    got = eagle.vmap(builder)(X)()
    want = [_value(jf, X[i]) for i in range(3)]
    np.testing.assert_allclose(np.asarray(got).reshape(3), want, rtol=1e-12)
    grads = eagle.vmap(eagle.grad(builder))(X)
    for i in range(3):
        np.testing.assert_allclose(grads[i], np.asarray(jax.grad(jf)(jnp.asarray(X[i]))), rtol=1e-10, atol=1e-12)


@eagle.Graph.builder
def recorded(x, p, record=False):
    g = eagle.Graph(record=record)
    g.result = mix(p[0], np.concatenate([x[1:], x[:1]]) + p.reshape(-1)[4:])
    return g


def test_record_reverse_and_forward_match_jax(rng):
    x, p, t = rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=4)

    def jf(x, p):
        b = jnp.concatenate([x[1:], x[:1]]) + p.reshape(-1)[4:]
        return jnp.sum(p[0] * b + p[0] ** 2)
    g = recorded(x, p, record=True)
    g()
    got = eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("x", "p"))
    want = jax.grad(jf, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(p))
    np.testing.assert_allclose(got["x"], np.asarray(want[0]), rtol=1e-12)
    np.testing.assert_allclose(got["p"], np.asarray(want[1]), rtol=1e-12)
    fwd = eagle.diff.forward(g.record, {"x": t})
    _, jt = jax.jvp(lambda x: jf(x, jnp.asarray(p)), (jnp.asarray(x),), (jnp.asarray(t),))
    np.testing.assert_allclose(fwd["result"][0], float(jt), rtol=1e-12)


# -- writes through views -------------------------------------------------------------------------

@eagle.Graph.builder
def write_rows(x, p):
    g = eagle.Graph()
    scale(x, p[1])                  # p[1] is a view: the write lands in the caller's p
    g.result = total(p[1])
    return g


def test_a_write_through_a_view_lands_in_the_callers_array(rng):
    x, p = rng.normal(size=4), np.zeros((2, 4))
    g = write_rows(x, p)
    out = g()
    np.testing.assert_array_equal(p[0], 0.0)
    np.testing.assert_allclose(p[1], 3.0 * x)
    np.testing.assert_allclose(out[0], np.sum((3.0 * x) ** 2))
    x[:] = rng.normal(size=4)
    g()
    np.testing.assert_allclose(p[1], 3.0 * x)


@eagle.Graph.builder
def write_then_read(x, y):
    g = eagle.Graph()
    scale(x[:2], y[1:3])
    g.result = total(y)             # sees the write: y's other elements as the caller left them
    return g


def test_a_view_write_is_seen_by_later_reads(rng):
    x, y = rng.normal(size=4), np.arange(4.0)
    g = write_then_read(x, y)
    want_y = np.array([0.0, 3 * x[0], 3 * x[1], 3.0])
    np.testing.assert_allclose(g()[0], np.sum(want_y ** 2))
    np.testing.assert_allclose(y, want_y)


@eagle.Graph.builder
def racing(x, p):
    g = eagle.Graph()
    with g.parallel() as par:
        with par.branch():
            scale(x, p[0])
        with par.branch():
            total(p[:, 1:].reshape(-1))     # overlaps p[0]: a hazard between sibling branches
    g.result = total(x)
    return g


@eagle.Graph.builder
def side_by_side(x, p):
    g = eagle.Graph()
    with g.parallel() as par:
        with par.branch():
            scale(x, p[0])
        with par.branch():
            u = total(p[1])                 # the other row: no element in common
    g.result = u
    return g


def test_a_view_write_keeps_the_hazard_checks(rng):
    p = np.zeros((2, 4))
    with pytest.raises(ValueError, match="share memory"):
        racing(rng.normal(size=4), p)
    np.testing.assert_array_equal(p, 0.0)
    p[1] = 2.0
    x = rng.normal(size=4)
    np.testing.assert_allclose(side_by_side(x, p)()[0], 16.0)
    np.testing.assert_allclose(p[0], 3.0 * x)


@eagle.Graph.builder
def returns_view(x):
    g = eagle.Graph()
    g.result = (x[1:], x)
    return g


def test_a_result_view_reads_the_bound_array(rng):
    x = rng.normal(size=4)
    g = returns_view(x)
    a, b = g()
    np.testing.assert_array_equal(a, x[1:])
    np.testing.assert_array_equal(b, x)
    x2 = rng.normal(size=4)
    g.bind(x=x2)
    a, b = g()
    np.testing.assert_array_equal(a, x2[1:])
    np.testing.assert_array_equal(b, x2)


# -- views inside device control flow ----------------------------------------------------------------

def cell(v):
    return np.array([v], dtype=np.uint32)


@hawk.kernel
def step(x: Scalar, y: Mutable[Scalar]):
    y = y * 0.5 + x


@eagle.Graph.builder
def loop_writes_a_view(x, p, n):
    g = eagle.Graph()
    for _ in range(n):                      # a counted device loop writing through a view of p
        step(np.sin(x[:3]), p[1, 1:4])
    g.result = total(p[1])
    return g


def test_a_device_loop_writes_through_a_view(rng):
    x, p = rng.normal(size=5), rng.normal(size=(2, 5))
    want = p.copy()
    for _ in range(3):
        want[1, 1:4] = want[1, 1:4] * 0.5 + np.sin(x[:3])
    out = loop_writes_a_view(x, p, cell(3))()
    np.testing.assert_allclose(p, want, rtol=1e-14)
    np.testing.assert_allclose(out[0], np.sum(want[1] ** 2), rtol=1e-14)


@eagle.Graph.builder
def loop_carries_views(x, n):
    g = eagle.Graph()
    y = sq(x)
    for _ in range(n):
        y = sq(y[::-1] * 0.9)
    g.result = total(y[1:])
    return g


def test_a_carried_name_rebound_to_a_view(rng):
    x = rng.uniform(0.1, 0.9, 5)

    def jf(x):
        y = x * x
        for _ in range(3):
            y = (y[::-1] * 0.9) ** 2
        return jnp.sum(y[1:] ** 2)
    np.testing.assert_allclose(loop_carries_views(x, cell(3))()[0], float(jf(x)), rtol=1e-12)
    np.testing.assert_allclose(eagle.grad(loop_carries_views)(x, cell(3)), np.asarray(jax.grad(jf)(x)),
                               rtol=1e-10, atol=1e-30)


@eagle.Graph.builder
def arms_with_views(x, c):
    g = eagle.Graph()
    y = sq(x)
    if c:
        y = np.cos(y[1:3]) + x[:2]
    else:
        y = y[:2] * 3.0
    g.result = total(y)
    return g


@pytest.mark.parametrize("taken", [0, 1])
def test_device_arms_with_views(taken, rng):
    x = rng.normal(size=5)

    def jf(x):
        y = x * x
        y = jnp.cos(y[1:3]) + x[:2] if taken else y[:2] * 3.0
        return jnp.sum(y ** 2)
    np.testing.assert_allclose(arms_with_views(x, cell(taken))()[0], float(jf(x)), rtol=1e-12)
    np.testing.assert_allclose(eagle.grad(arms_with_views)(x, cell(taken)), np.asarray(jax.grad(jf)(x)),
                               rtol=1e-10, atol=1e-14)
    X = rng.normal(size=(3, 5))
    got = np.asarray(eagle.vmap(arms_with_views, in_axes=(0, None))(X, cell(taken))()).reshape(3)
    np.testing.assert_allclose(got, [float(jf(X[i])) for i in range(3)], rtol=1e-12)


def test_vmap_of_a_write_through_a_view(rng):
    X = rng.normal(size=(3, 4))
    p = np.zeros((2, 4))
    with pytest.raises(ValueError, match="shared by all instances"):
        eagle.vmap(write_rows, in_axes=(0, None))(X, p)
    np.testing.assert_array_equal(p, 0.0)
    P = np.zeros((3, 2, 4))
    out = eagle.vmap(write_rows, in_axes=(0, 0))(X, P)()
    for i in range(3):                              # each instance wrote row 1 of its own p
        np.testing.assert_array_equal(P[i, 0], 0.0)
        np.testing.assert_allclose(P[i, 1], 3.0 * X[i])
        np.testing.assert_allclose(np.asarray(out)[i, 0], np.sum((3.0 * X[i]) ** 2))


# -- slices of arguments nothing writes are read in place (no copy); the rest are copies ---------------

@eagle.Graph.builder
def read_then_overwrite(x, y, record=False):
    g = eagle.Graph(record=record)
    u = sq(y[:2])                   # y as it is on entry ...
    scale(x, y)                     # ... then overwritten in place
    g.result = total(u)
    return g


def test_a_slice_keeps_the_value_it_was_taken_from(rng):
    x, y = rng.normal(size=4), rng.normal(size=4)
    y0 = y.copy()
    g = read_then_overwrite(x, y, record=True)
    out = g()
    np.testing.assert_allclose(out[0], np.sum(y0[:2] ** 4))
    np.testing.assert_allclose(y, 3.0 * x)
    got = eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("y",))["y"]
    np.testing.assert_allclose(got, np.r_[4.0 * y0[:2] ** 3, 0.0, 0.0])     # at y on entry, not 3x


def test_a_slice_of_an_unwritten_argument_is_a_view_that_follows_bind(rng):
    x = rng.normal(size=6)
    g = strided(x)
    assert "copyto" not in g._exe.source                      # read in place
    np.testing.assert_allclose(g()[0], np.sum(x[::2] ** 3))
    x2 = rng.normal(size=6)
    g.bind(x=x2)
    np.testing.assert_allclose(g()[0], np.sum(x2[::2] ** 3))
    assert "copyto" in read_then_overwrite(rng.normal(size=4), rng.normal(size=4))._exe.source


@pytest.mark.parametrize("builder,jf,shape", CASES, ids=IDS)
def test_view_programs_and_their_derivatives_type_check(builder, jf, shape, rng):
    from hawk_fx.core import check_program
    x = rng.normal(size=shape)
    check_program(eagle.make_program(builder)(x))
    check_program(eagle.make_program(eagle.grad(builder))(x))
    check_program(eagle.make_program(eagle.vmap(builder))(np.stack([x, x])))
    check_program(eagle.make_program(lambda x, t: eagle.jvp(builder, (x,), (t,)))(x, x))


@eagle.Graph.builder
def into_a_view(x, y):
    g = eagle.Graph()
    a = dbl(x[:2], buffer=y[1:3])           # the result's buffer is a view of y
    g.result = total(a + y[1:3])
    return g


def test_buffer_can_be_a_view(rng):
    x, y = rng.normal(size=4), rng.normal(size=4)
    y0 = y.copy()
    out = into_a_view(x, y)()
    np.testing.assert_allclose(y, [y0[0], 2 * x[0], 2 * x[1], y0[3]])
    np.testing.assert_allclose(out[0], np.sum((4 * x[:2]) ** 2))
    gx, gy = eagle.grad(into_a_view, argnums=(0, 1))(x, y0)
    np.testing.assert_allclose(gx, np.r_[32 * x[:2], 0.0, 0.0])
    np.testing.assert_array_equal(gy, 0.0)                    # y[1:3] is overwritten before it is read


# -- assignment into a plane: an in-place update at every replay --------------------------------------

@eagle.Graph.builder
def assigns(x, y):
    g = eagle.Graph()
    z = dbl(x)
    y[1:3] = z[:2]                  # the caller's y, at every replay
    y[0] = y[3:4]                   # one sample, from another
    z[3:] = 0.5                     # a number: a constant, as a Param number is
    g.result = total(y * z)
    return g


def _assigns_jax(x, y):
    x, y = jnp.asarray(x), jnp.asarray(y)
    z = 2.0 * x
    y = y.at[1:3].set(z[:2])
    y = y.at[0].set(y[3])
    z = z.at[3:].set(0.5)
    return jnp.sum((y * z) ** 2)


def test_assignment_is_staged_with_grad_and_vmap(rng):
    x, y = rng.normal(size=4), rng.normal(size=4)
    y0 = y.copy()
    g = assigns(x, y)
    np.testing.assert_allclose(g()[0], float(_assigns_jax(x, y0)), rtol=1e-12)
    np.testing.assert_allclose(y, [y0[3], 2 * x[0], 2 * x[1], y0[3]])
    x[:] = rng.normal(size=4)
    g()
    np.testing.assert_allclose(y[1:3], 2 * x[:2])                 # the replay wrote the new values
    gx, gy = eagle.grad(assigns, argnums=(0, 1))(x, y0)
    jx, jy = jax.grad(_assigns_jax, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(y0))
    np.testing.assert_allclose(gx, np.asarray(jx), rtol=1e-12)
    np.testing.assert_allclose(gy, np.asarray(jy), rtol=1e-12)
    X, Y = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    want = [float(_assigns_jax(X[i], Y[i])) for i in range(3)]
    np.testing.assert_allclose(np.asarray(eagle.vmap(assigns)(X, Y.copy())()).reshape(3), want, rtol=1e-12)


@eagle.Graph.builder
def assigns_badly(x, y):
    g = eagle.Graph()
    y[1:3] = x
    g.result = total(y)
    return g


def test_an_assignment_of_the_wrong_shape_is_refused(rng):
    y = np.zeros(4)
    with pytest.raises(ValueError, match=r"assigns_badly:4: x\[\.\.\.\] = a plane of float64\[4\] for a region "
                                         r"of float64\[2\]"):
        assigns_badly(rng.normal(size=4), y)
    np.testing.assert_array_equal(y, 0.0)
