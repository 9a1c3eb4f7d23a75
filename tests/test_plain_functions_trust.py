"""Plain functions handed to transforms: every answer equals an
independent oracle (jax.grad / jax.vmap of the same math in jax.numpy, or a Python loop calling the
builder on each instance), or the call is refused with a message naming the API, the function and
its line, and what to write instead. Never a silent wrong answer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from conftest import refused
from hawk_fx import Param, Scalar
from eagle_fx.transforms.program import TransformError
from test_vmap_plain import dbl, doubled, loss, sumsq

jax.config.update("jax_enable_x64", True)

FILE = "test_plain_functions_trust.py, line"


@hawk.kernel
def weighted(x: Scalar, c: Scalar) -> Scalar:
    return hawk.sum(x * x * c)


@hawk.kernel
def weighted_by(x: Scalar, c: Param) -> Scalar:
    return hawk.sum(x * x * c)


@eagle.Graph.builder
def f(x, c):                      # c: a plane of x's shape
    g = eagle.Graph()
    g.result = weighted(x, c)
    return g


@eagle.Graph.builder
def fp(x, c):                     # c: a Param (a Python number, or a one-cell array read at each replay)
    g = eagle.Graph()
    g.result = weighted_by(x, c)
    return g


U = np.linspace(0.5, 1.5, 5)
X = np.linspace(-1.0, 2.0, 15).reshape(3, 5)


def loop(fn, *batched):
    """The oracle for vmap: the function on each instance in a Python loop, results stacked."""
    return np.stack([np.asarray(fn(*(a[b] for a in batched))) for b in range(len(batched[0]))])


# -- an array computed from a differentiated argument is refused, not silently dropped ---------------

DERIVED = [   # (form, eagle function of u, the array it hands the graph, in jax.numpy: the loss is sum(u * u * c))
    ("sum", lambda u: fp(u, u.sum(keepdims=True)), lambda u: jnp.sum(u)),
    ("copy", lambda u: fp(u, u[:1].copy()), lambda u: u[0]),
    ("np.array", lambda u: f(u, np.array(u)), lambda u: u),
    ("np.asarray copy", lambda u: f(u, np.asarray(u).copy()), lambda u: u),
    ("fancy index", lambda u: f(u, u[[4, 3, 2, 1, 0]]), lambda u: u[::-1]),
    ("arithmetic", lambda u: f(u, u * 2.0), lambda u: u * 2.0),
    ("through np.asarray", lambda u: f(u, np.asarray(u) * 2.0), lambda u: u * 2.0),
]


@pytest.mark.parametrize("form, fn, jax_c", DERIVED, ids=[d[0] for d in DERIVED])
def test_a_derivative_through_an_array_computed_from_the_argument_is_refused(form, fn, jax_c):
    # the path through the array matters: dropping it (what these calls answered) is wrong
    whole = jax.grad(lambda u: jnp.sum(u * u * jax_c(u)))(U)
    dropped = jax.grad(lambda u: jnp.sum(u * u * jax.lax.stop_gradient(jax_c(u))))(U)
    assert not np.allclose(whole, dropped)
    for api, call in (("eagle_fx.grad", lambda: eagle.grad(fn)(U)),
                      ("eagle_fx.value_and_grad", lambda: eagle.value_and_grad(fn)(U)),
                      ("eagle_fx.jvp", lambda: eagle.jvp(fn, (U,), (np.ones(5),))),
                      ("eagle_fx.jacrev", lambda: eagle.jacrev(fn)(U)),
                      ("eagle_fx.grad", lambda: eagle.vmap(eagle.grad(fn))(X))):
        refused(TransformError, call, api, "<lambda>", FILE, "computed in Python from u",
                "the derivative through it would be lost", "inside a builder")


def test_an_array_computed_from_an_argument_that_is_not_differentiated_is_a_constant_as_in_jax():
    c = np.linspace(1.0, 2.0, 5)
    got = eagle.grad(lambda u, c: f(u, c.sum() * c[::-1].copy()))(U, c)
    np.testing.assert_allclose(got, jax.grad(lambda u, c: jnp.sum(u * u * c.sum() * c[::-1]))(U, c), rtol=1e-13)
    got = eagle.grad(lambda u, c: f(u, c[1:]), argnums=0)(U[1:], c)          # a view of c: followed
    np.testing.assert_allclose(got, jax.grad(lambda u, c: jnp.sum(u * u * c[1:]))(U[1:], c), rtol=1e-13)
    # an array made without the arguments is a constant; one that does not reach the graph gives 0
    np.testing.assert_allclose(eagle.grad(lambda u: f(u, np.full(5, 3.0)))(U),
                               jax.grad(lambda u: jnp.sum(u * u * 3.0))(U), rtol=1e-13)
    np.testing.assert_allclose(eagle.grad(lambda u: loss(np.ones(5)))(U),
                               jax.grad(lambda u: jnp.sum(jnp.ones(5) ** 2))(U))


def test_a_view_of_the_argument_is_refused_by_derivatives_and_followed_by_vmap():
    refused(TransformError, lambda: eagle.grad(lambda u: f(u[1:], u[:-1]))(U), "eagle_fx.grad", "<lambda>", FILE,
            "a view of argument u", "pass the whole array")
    got = eagle.vmap(lambda x: f(x[1:], x[:-1]))(X)
    np.testing.assert_allclose(got, loop(lambda x: f(x[1:], x[:-1])(), X), rtol=1e-13)
    np.testing.assert_allclose(got, jax.vmap(lambda x: jnp.sum(x[1:] ** 2 * x[:-1], keepdims=True))(X), rtol=1e-13)


# -- values that escape the guard (np.asarray, np.float64) -------------------------------------------

def test_a_value_read_past_the_guard_is_refused_not_frozen():
    def param_from(x):
        return fp(x, np.float64(x[0]))             # np.float64 reads the value without float()

    def param_through_asarray(x):
        return fp(x, float(np.asarray(x)[1]))      # np.asarray gives a plain ndarray: not guarded

    def branch_through_asarray(x):
        return doubled(x) if np.asarray(x)[0] > 0 else doubled(x[::-1])
    for fn in (param_from, param_through_asarray, branch_through_asarray):
        # the loop's answer differs by instance: instance 0's value for all would be wrong
        want = loop(lambda x: fn(x)(), X)
        assert not np.allclose(want[0], want[2])
        for api, call in (("eagle_fx.vmap", lambda: eagle.vmap(fn)(X)),
                          ("eagle_fx.make_program", lambda: eagle.make_program(fn)(X[0])),
                          ("eagle_fx.jvp", lambda: eagle.jvp(fn, (X[0],), (np.ones(5),)))):
            refused(TypeError, call, api, fn.__name__, FILE, "stages a different graph when its arguments hold "
                    "other values", "Decide on the device inside a builder")


def test_np_asarray_of_the_argument_follows_new_values_on_a_cached_call():
    fn = eagle.vmap(lambda x: doubled(np.asarray(x)))
    for xs in (X, X[::-1] * 1.5 + 0.25):
        np.testing.assert_allclose(fn(xs), loop(lambda x: doubled(np.asarray(x))(), xs), rtol=1e-13)
        np.testing.assert_allclose(fn(xs), jax.vmap(lambda x: 2 * x)(xs), rtol=1e-13)
    made = eagle.vmap(lambda x: doubled(np.array(x) * 3.0))     # a copy through np.array: one per instance
    for xs in (X, X[::-1] * 1.5 + 0.25):
        np.testing.assert_allclose(made(xs), jax.vmap(lambda x: 6 * x)(xs), rtol=1e-13)


def test_a_guarded_read_names_the_line_that_reads():
    def decide(x):
        y = x * 2.0
        return doubled(x) if y[0] > 0 else doubled(-x)
    line = decide.__code__.co_firstlineno + 2
    refused(TypeError, lambda: eagle.vmap(decide)(X), "eagle_fx.vmap", f"decide ({FILE} {line})",
            "reads the value of an array computed from its arguments", "Decide on the device")


def test_writing_argument_values_into_an_array_reached_by_name_is_refused():
    buf = np.zeros(5)

    def fills(u):
        buf[:] = u * 2.0                           # the graph reads buf: what the last staging wrote
        return f(u, buf)
    for api, call in (("eagle_fx.grad", lambda: eagle.grad(fills)(U)), ("eagle_fx.vmap", lambda: eagle.vmap(fills)(X))):
        refused(TypeError, call, api, "fills", FILE, "writes values computed from its arguments into an array",
                "inside a builder")


def test_a_function_that_fails_on_other_values_is_still_staged():
    # the check's other values are no longer positive definite: its staging fails and proves nothing
    A = np.stack([np.array([[2.0, 0.5], [0.5, 1.0]]) * s for s in (1.0, 2.0, 3.0)]).reshape(3, 4)

    def factor(a):
        return doubled(np.linalg.cholesky(a.reshape(2, 2)).ravel())
    np.testing.assert_allclose(eagle.vmap(factor)(A), loop(lambda a: factor(a)(), A), rtol=1e-13)
    np.testing.assert_allclose(eagle.vmap(factor)(A),
                               jax.vmap(lambda a: 2 * jnp.linalg.cholesky(a.reshape(2, 2)).ravel())(A), rtol=1e-13)
    refused(TransformError, lambda: eagle.grad(lambda a: loss(np.linalg.cholesky(a.reshape(2, 2)).ravel()))(A[0]),
            "eagle_fx.grad", "<lambda>", "computed in Python from a", "inside a builder")


# -- zero instances, zero-size arguments: JAX's zero-size answers -----------------------------------

def test_vmap_over_zero_instances_gives_jax_empty_results():
    empty = np.zeros((0, 5))
    want = jax.vmap(lambda x: 2 * x)(empty)
    for got in (eagle.vmap(doubled)(empty)(), eagle.vmap(lambda x: doubled(x))(empty),
                eagle.vmap(lambda x: doubled(x * 2.0))(empty)):
        assert got.shape == want.shape and got.dtype == want.dtype
    assert eagle.vmap(lambda x: doubled(x), in_axes=1)(empty.T).shape == (0, 5)
    assert eagle.vmap(lambda x: doubled(x[1:]))(empty).shape == jax.vmap(lambda x: 2 * x[1:])(empty).shape
    g = eagle.vmap(eagle.grad(loss))(empty)
    assert g.shape == jax.vmap(jax.grad(lambda x: jnp.sum(x * x)))(empty).shape
    for shape in ((0, 2, 4), (2, 0, 4)):
        got = eagle.vmap(eagle.vmap(lambda x: doubled(x)))(np.zeros(shape))
        assert got.shape == jax.vmap(jax.vmap(lambda x: 2 * x))(np.zeros(shape)).shape


def test_jacobians_of_a_zero_size_argument_have_jax_shapes():
    z = np.zeros(0)
    cases = [(eagle.jacfwd(doubled), jax.jacfwd(lambda x: 2 * x)),
             (eagle.jacrev(doubled), jax.jacrev(lambda x: 2 * x)),
             (eagle.jacfwd(loss), jax.jacfwd(lambda x: jnp.sum(x * x, keepdims=True))),
             (eagle.jacrev(loss), jax.jacrev(lambda x: jnp.sum(x * x, keepdims=True))),
             (eagle.hessian(loss), jax.hessian(lambda x: jnp.sum(x * x)))]
    for ours, theirs in cases:
        got, want = ours(z), theirs(z)
        assert got.shape == want.shape and got.dtype == want.dtype
    h = eagle.hessian(lambda a, b: f(a, b), argnums=(0, 1))(z, z)
    want = jax.hessian(lambda a, b: jnp.sum(a * a * b), argnums=(0, 1))(z, z)
    assert [[x.shape for x in row] for row in h] == [[x.shape for x in row] for row in want]


# -- trees with int keys, argnums, integer inputs ----------------------------------------------------

def test_a_dict_with_int_keys_is_a_tree_as_in_jax():
    d = {1: U, 2: np.linspace(1.0, 2.0, 5)}
    fn = lambda d: f(d[1], d[2])                                   # noqa: E731
    jfn = lambda d: jnp.sum(d[1] ** 2 * d[2])                      # noqa: E731
    v, g = eagle.value_and_grad(fn)(d)
    jv, jg = jax.value_and_grad(jfn)(d)
    np.testing.assert_allclose(v, [jv], rtol=1e-13)
    assert set(g) == {1, 2}
    for k in d:
        np.testing.assert_allclose(g[k], jg[k], rtol=1e-13)
        np.testing.assert_allclose(eagle.jacfwd(fn)(d)[k][0], jg[k], rtol=1e-13)


@pytest.mark.parametrize("make, theirs", [(eagle.grad, jax.grad), (eagle.value_and_grad, jax.value_and_grad),
                                          (eagle.jacfwd, jax.jacfwd), (eagle.jacrev, jax.jacrev),
                                          (eagle.hessian, jax.hessian)])
def test_argnums_must_be_ints_as_in_jax(make, theirs):
    name = make.__name__
    for bad in (0.0, (0.0,), "0"):
        refused(TypeError, lambda: make(f, argnums=bad)(U, U), f"eagle_fx.{name}",
                f"argnums must be an int or a tuple of ints, got {bad!r}")
    for good in (0, np.int64(1), (1,)):                  # after a refused 0.0: 0 is not answered by it
        got, want = make(f, argnums=good)(U, U), theirs(lambda a, b: jnp.sum(a * a * b), argnums=good)(U, U)
        got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.reshape(a, np.shape(b)), b, rtol=1e-13, atol=1e-13)


def test_grad_of_an_integer_input_says_integer_inputs_have_no_derivative():
    with pytest.raises(TypeError, match="requires real- or complex-valued inputs"):
        jax.grad(lambda x: jnp.sum(x * x))(np.arange(3))
    for make in (eagle.grad, eagle.value_and_grad, eagle.jacrev, eagle.hessian):
        refused(TypeError, lambda: make(loss)(np.arange(3)), f"eagle_fx.{make.__name__}",
                "only integer values (int64)", "integer inputs have no derivative", "pass a float array")
    refused(TypeError, lambda: eagle.grad(lambda d: loss(d["a"]))({"a": np.arange(3)}), "argument d",
            "integer inputs have no derivative")


# -- the class of both: generated plain functions u -> f(u, <an array derived from u>) -----------------

VECTOR_STEPS = [   # (name, NumPy on the (guarded) array, the same in jax.numpy); each keeps the shape (5,)
    ("copy", lambda v: v.copy(), lambda v: v),
    ("np.array", lambda v: np.array(v), lambda v: v),
    ("np.asarray", lambda v: np.asarray(v), lambda v: v),
    ("reversed view", lambda v: v[::-1], lambda v: v[::-1]),
    ("fancy index", lambda v: v[[2, 0, 4, 1, 3]], lambda v: v[jnp.array([2, 0, 4, 1, 3])]),
    ("arithmetic", lambda v: v * 1.5 + 0.25, lambda v: v * 1.5 + 0.25),
    ("np.sin", lambda v: np.sin(v), lambda v: jnp.sin(v)),
    ("roll", lambda v: np.concatenate([v[1:], v[:1]]), lambda v: jnp.concatenate([v[1:], v[:1]])),
    ("plus its sum", lambda v: v + v.sum(), lambda v: v + jnp.sum(v)),
]
SCALAR_STEPS = [   # (name, NumPy: a Python number or a one-cell array, for a Param; jax.numpy: a scalar)
    ("float", lambda v: float(v[1]), lambda v: v[1]),
    ("np.float64", lambda v: np.float64(v[1]), lambda v: v[1]),
    ("np.asarray item", lambda v: np.asarray(v)[1], lambda v: v[1]),
    ("sum keepdims", lambda v: v.sum(keepdims=True), lambda v: jnp.sum(v)),
    ("max keepdims", lambda v: v.max(keepdims=True), lambda v: jnp.max(v)),
    ("one-cell view", lambda v: v[1:2], lambda v: v[1]),
]


def _generated(seed):
    """A plain function `plain(u)` = f(u, c) (or fp(u, c) for a Param c) with c derived from u by 0-2
    vector steps and, half the time, a scalar step; its loss in jax.numpy; and the steps' names."""
    rng = np.random.default_rng(seed)
    steps = [VECTOR_STEPS[i] for i in rng.integers(len(VECTOR_STEPS), size=rng.integers(3))]
    if rng.integers(2):
        steps.append(SCALAR_STEPS[rng.integers(len(SCALAR_STEPS))])
    builder = fp if steps and steps[-1] in SCALAR_STEPS else f

    def derive(v, which):
        for step in steps:
            v = step[which](v)
        return v

    def plain(u):
        return builder(u, derive(u, 1))
    return plain, (lambda u: jnp.sum(u * u * derive(u, 2))), builder, derive, " -> ".join(s[0] for s in steps)


def _refused_or_equal(call, want, api, what):
    """'refused' (with the API, the function and what to change named) or 'equal' (to `want`)."""
    try:
        got = call()
    except (TypeError, ValueError) as exc:            # TransformError, VmapError and ValueReadError among them
        msg = str(exc)
        assert api in msg and "plain" in msg, f"{what}: {msg}"
        assert "builder" in msg or "pass the whole array" in msg, f"{what}: {msg}"
        return "refused"
    np.testing.assert_allclose(np.reshape(got, np.shape(want)), want, rtol=1e-11, atol=1e-12, err_msg=what)
    return "equal"


def _check_generated(seeds):
    tally = {}
    for seed in seeds:
        plain, jax_loss, builder, derive, what = _generated(seed)
        outcomes = []
        u = np.linspace(0.5, 1.5, 5) + 0.1 * seed % 0.3
        outcomes.append(_refused_or_equal(lambda: eagle.grad(plain)(u), jax.grad(jax_loss)(u), "eagle_fx.grad",
                                          f"grad, {what}"))
        fn = eagle.vmap(plain)
        for xs in (X, X[::-1] * 1.5 + 0.25):           # the second call: a cached graph must read the new values
            want = loop(lambda x: builder(x, derive(x, 1))(), xs)
            np.testing.assert_allclose(want.ravel(), jax.vmap(jax_loss)(xs), rtol=1e-11)   # the oracles agree
            outcomes.append(_refused_or_equal(lambda: fn(xs), want, "eagle_fx.vmap", f"vmap, {what}"))
        for o in outcomes:
            tally[o] = tally.get(o, 0) + 1
    return tally


def test_generated_plain_functions_are_refused_or_match_jax_and_the_loop():
    tally = _check_generated(range(24))
    assert tally.get("equal", 0) >= 12 and tally.get("refused", 0) >= 12, tally


@pytest.mark.slow
def test_generated_plain_functions_many():
    tally = _check_generated(range(24, 324))
    assert tally.get("equal", 0) >= 150 and tally.get("refused", 0) >= 150, tally
