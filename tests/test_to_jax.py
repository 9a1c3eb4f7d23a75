"""eagle_fx.to_jax: graphs inside users' JAX code. Values against the NumPy backend and plain
Python; gradients through a data-dependent device loop under jax.jit(jax.grad) against
eagle_fx.grad and finite differences; jax.vmap against a loop over instances."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
from tour_kernels import below, cell, grow, loss, total  # noqa: E402


@eagle_fx.Graph.builder
def until(x, flag):
    """grow x until no sample is below 3 (at most 20 turns), then sum(x * x): a loop JAX cannot reverse."""
    g = eagle_fx.Graph()
    for _ in range(20):
        if not flag:
            break
        x = grow(x, 1.1)
        below(x, 3.0, flag)
    g.result = total(x)
    return g


def ref_until(x):
    for _ in range(20):
        x = 1.1 * x + 0.1 * np.tanh(x)
        if not np.any(x < 3.0):
            break
    return np.sum(x * x)


X = np.linspace(0.2, 1.4, 8)
ON = jnp.asarray(cell(1))


def test_values_match_plain_python_and_jit():
    f = eagle_fx.to_jax(until)
    np.testing.assert_allclose(f(jnp.asarray(X), ON)[0], ref_until(X), rtol=1e-13)
    np.testing.assert_allclose(jax.jit(f)(jnp.asarray(X), ON)[0], ref_until(X), rtol=1e-13)
    assert ON[0] == 1                                  # pure: the guard is not written


def test_jit_grad_through_a_data_dependent_device_loop_equals_eagle_grad():
    f = eagle_fx.to_jax(until)
    got = jax.jit(jax.grad(lambda u: f(u, ON)[0]))(jnp.asarray(X))
    want = eagle_fx.grad(until)(X, cell(1))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    h = 1e-6                                           # and finite differences (the turn count is locally fixed)
    fd = [(ref_until(X + h * e) - ref_until(X - h * e)) / (2 * h) for e in np.eye(len(X))]
    np.testing.assert_allclose(got, fd, rtol=1e-6)


def test_vmap_and_vmap_of_grad_match_a_loop_over_instances():
    f = eagle_fx.to_jax(until)
    xs = np.stack([X, 1.5 * X, 0.5 * X])
    got = jax.vmap(lambda u: f(u, ON)[0])(jnp.asarray(xs))
    np.testing.assert_allclose(got, [ref_until(r) for r in xs], rtol=1e-13)
    gv = jax.jit(jax.vmap(jax.grad(lambda u: f(u, ON)[0])))(jnp.asarray(xs))
    np.testing.assert_allclose(gv, np.stack([eagle_fx.grad(until)(r, cell(1)) for r in xs]), rtol=1e-12)


def test_static_arguments_device_conditions_and_a_transformed_function():
    fl = eagle_fx.to_jax(loss)                          # n (a Python int) is static: one staging per value
    for flag, n in [(1, 3), (0, 2)]:
        got = jax.grad(lambda u: fl(u, jnp.asarray(cell(flag)), n)[0])(jnp.asarray(X))
        np.testing.assert_allclose(got, eagle_fx.grad(loss)(X, cell(flag), n), rtol=1e-12)
    fg = eagle_fx.to_jax(eagle_fx.grad(loss))           # a transformed function lowers too
    np.testing.assert_allclose(jax.jit(lambda u: fg(u, ON, 3))(jnp.asarray(X)), eagle_fx.grad(loss)(X, cell(1), 3),
                               rtol=1e-12)


@eagle_fx.Graph.builder
def counted(x, n):
    g = eagle_fx.Graph()
    for _ in range(n):
        x = grow(x, 1.1)
    g.result = total(x)
    return g


def test_reverse_through_a_counted_loop_with_a_traced_trip_count_is_refused():
    f = eagle_fx.to_jax(counted)
    np.testing.assert_allclose(f(jnp.asarray(X), jnp.asarray(cell(2)))[0],
                               counted(X, cell(2))()[0], rtol=1e-13)       # forward: fine
    with pytest.raises(ValueError, match="counted loop at .*trip count is an argument traced by JAX.*cap the loop"):
        jax.grad(lambda u: f(u, jnp.asarray(cell(2)))[0])(jnp.asarray(X))


def test_an_opaque_node_is_refused():
    src = np.zeros(8)

    @eagle_fx.Graph.builder
    def hosted(x):
        g = eagle_fx.Graph()
        g.add_node(eagle_fx.opaque(lambda: None, reads={"s": src}), name="peek")
        g.result = total(x)
        return g
    with pytest.raises(ValueError, match="opaque node '<lambda>'.* is a host function.*Graph\\(backend='jax'\\)"):
        eagle_fx.to_jax(hosted)(jnp.asarray(X))


def test_reverse_through_a_traced_trip_count_inside_a_transformed_function_is_refused():
    with pytest.raises(ValueError, match="counted loop at .*trip count is an argument traced by JAX"):
        eagle_fx.to_jax(eagle_fx.grad(counted))(jnp.asarray(X), jnp.asarray(cell(2)))


def test_a_vmap_made_function_reads_its_arguments_through_the_moved_axis():
    flags = np.ones((2, 1), np.uint32)
    xs = np.stack([X, 2 * X])
    f = eagle_fx.to_jax(eagle_fx.vmap(until, in_axes=(0, 0)))
    got = f(jnp.asarray(xs), jnp.asarray(flags))
    np.testing.assert_allclose(np.asarray(got)[:, 0], [ref_until(X), ref_until(2 * X)], rtol=1e-13)
    ft = eagle_fx.to_jax(eagle_fx.vmap(until, in_axes=(1, 0)))           # the batch axis last: a transposed view
    got = ft(jnp.asarray(xs.T), jnp.asarray(flags))
    np.testing.assert_allclose(np.asarray(got)[:, 0], [ref_until(X), ref_until(2 * X)], rtol=1e-13)


STAGINGS = []


@eagle_fx.Graph.builder
def scaled_total(x, k):
    STAGINGS.append(k)                  # the builder's body runs once per staging
    g = eagle_fx.Graph()
    g.result = total(grow(x, k))
    return g


def test_signatures_are_kept_least_recent_out_as_in_the_transforms_cache(monkeypatch):
    import sys
    monkeypatch.setattr(sys.modules["eagle_fx.to_jax"], "MAXSIZE", 2)   # the module, not the function
    f = eagle_fx.to_jax(scaled_total)
    x = jnp.asarray(X)
    ref = {k: np.sum((k * X + 0.1 * np.tanh(X)) ** 2) for k in (1.0, 2.0, 3.0)}
    for k in (1.0, 2.0, 3.0, 3.0, 2.0, 1.0):     # 1.0 was evicted by 3.0: staged again
        np.testing.assert_allclose(np.asarray(f(x, k)), ref[k], rtol=1e-12)
    assert STAGINGS == [1.0, 2.0, 3.0, 1.0]
