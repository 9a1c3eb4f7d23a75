"""A cached graph is replayed only where a fresh staging would make the same one: a kernel or
global rebound after staging, arguments that share memory, static Python values that are equal but not the same (0.0 and -0.0, 1 and True, NaN), and the backend
use_backend asks for. Every expected value is computed here with NumPy or JAX, or is what a
fresh, uncached call does (a refusal); none is read from an earlier call."""
import math
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import eagle_fx as ef
import hawk_fx as hawk
from eagle_fx.frontend import cache
from eagle_fx.backends.select import use_backend
from hawk_fx import Mutable, Param, Scalar
from test_one_reverse_mode import settle_counted
from conftest import refused
from tour_kernels import cell


@pytest.fixture(autouse=True)
def fresh():
    ef.clear_caches()
    yield
    ef.clear_caches()


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@hawk.kernel
def scaled(x: Scalar, a: Param) -> Scalar:
    return a * x


@hawk.kernel
def acc(s: Scalar, y: Mutable[Scalar]):
    y = s + y


@hawk.kernel
def mul(a: Scalar, b: Scalar) -> Scalar:
    return a * b


# -- a kernel (or block, or global) rebound after staging --------------------------------

@hawk.kernel
def model(x: Scalar) -> Scalar:
    return 2.0 * x


@ef.Graph.builder
def fit(x):
    g = ef.Graph()
    g.result = total(model(x))
    return g


@ef.Graph.builder
def layer(g: ef.Graph, x):
    return model(x)


@ef.Graph.builder
def fit_through_a_block(x):
    g = ef.Graph()
    g.result = total(layer(g, x))
    return g


K = types.ModuleType("user_kernels")     # `import user_kernels as K`, then K.model is reassigned
K.model = model


@ef.Graph.builder
def fit_through_a_module(x):
    g = ef.Graph()
    g.result = total(K.model(x))
    return g


X5 = np.linspace(-1.0, 1.0, 5)


def sum_sq(c, x):
    """sum((c x)^2) and its gradient 2 c^2 x."""
    return np.sum((c * x) ** 2), 2 * c * c * x


def check(value_and_grad, c, x=X5):
    v, dx = value_and_grad
    want_v, want_dx = sum_sq(c, x)
    np.testing.assert_allclose(v, [want_v], rtol=1e-13)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-13)


def test_a_kernel_redefined_in_a_notebook_is_seen_by_value_and_grad():
    global model
    old = model
    same = ef.value_and_grad(fit)
    check(same(X5), 2.0)
    check(ef.value_and_grad(fit_through_a_block)(X5), 2.0)
    try:
        @hawk.kernel
        def model(x: Scalar) -> Scalar:        # the notebook cell run again, edited
            return 3.0 * x
        for vg in (ef.value_and_grad(fit), same):       # made again, and the one made before
            check(vg(X5), 3.0)
        np.testing.assert_allclose(fit(X5)()[0], sum_sq(3.0, X5)[0], rtol=1e-13)
        check(ef.value_and_grad(fit_through_a_block)(X5), 3.0)       # reached through a block
    finally:
        model = old
    check(ef.value_and_grad(fit)(X5), 2.0)                          # and back


def test_a_kernel_reassigned_in_a_module_or_a_closure_is_seen():
    dfit = ef.grad(fit_through_a_module)
    np.testing.assert_allclose(dfit(X5), sum_sq(2.0, X5)[1], rtol=1e-13)

    @hawk.kernel
    def tripled(x: Scalar) -> Scalar:
        return 3.0 * x
    K.model = tripled
    try:
        np.testing.assert_allclose(dfit(X5), sum_sq(3.0, X5)[1], rtol=1e-13)
    finally:
        K.model = model

    f = fit

    def call(x):                               # a plain function reaching the builder by closure
        return f(x)
    dcall = ef.grad(call)
    np.testing.assert_allclose(dcall(X5), sum_sq(2.0, X5)[1], rtol=1e-13)
    f = fit_through_a_module
    K.model = tripled
    try:
        np.testing.assert_allclose(dcall(X5), sum_sq(3.0, X5)[1], rtol=1e-13)
    finally:
        K.model = model


def test_a_kernel_rebound_in_the_enclosing_function_is_seen_by_its_builder():
    # the builder shares the enclosing function's cells, as a Python closure does (it used to copy
    # them when decorated, so the first kernel stayed, even uncached)
    @hawk.kernel
    def inner(x: Scalar) -> Scalar:
        return 2.0 * x

    @ef.Graph.builder
    def nested(x):
        g = ef.Graph()
        g.result = total(inner(x))
        return g

    dnested = ef.grad(nested)
    np.testing.assert_allclose(nested(X5)(), sum_sq(2.0, X5)[0], rtol=1e-13)
    np.testing.assert_allclose(dnested(X5), sum_sq(2.0, X5)[1], rtol=1e-13)

    @hawk.kernel
    def inner(x: Scalar) -> Scalar:         # noqa: F811  rebinds the cell nested reads
        return 3.0 * x

    np.testing.assert_allclose(nested(X5)(), sum_sq(3.0, X5)[0], rtol=1e-13)
    np.testing.assert_allclose(dnested(X5), sum_sq(3.0, X5)[1], rtol=1e-13)


def test_to_jax_sees_a_redefined_kernel():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    global model
    old = model
    f = ef.to_jax(fit)
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[0])(X5), sum_sq(2.0, X5)[1], rtol=1e-13)
    try:
        @hawk.kernel
        def model(x: Scalar) -> Scalar:
            return 3.0 * x
        np.testing.assert_allclose(jax.grad(lambda x: f(x)[0])(X5), sum_sq(3.0, X5)[1], rtol=1e-13)
    finally:
        model = old


# -- arguments that share memory ---------------------------------------------------------

@ef.Graph.builder
def acc3(x, m):
    g = ef.Graph()
    for _ in range(3):
        acc(x, m)
    g.result = total(m)
    return g


def numpy_acc3(x, m):
    """What acc3 does, in NumPy (x and m may be views of one buffer): m is written in place."""
    for _ in range(3):
        m[...] = x + m                  # NumPy reads the right side before it writes
    return np.sum(m * m)


def loop_oracle(buf, views):
    """(results, buffer after) of the loop over instances, in NumPy, on a copy of buf."""
    out = buf.copy()
    x, m = views(out)
    return np.array([[numpy_acc3(x[b], m[b])] for b in range(len(out))]), out


SAME = lambda a: (a, a)                                          # noqa: E731  one array passed twice
SHIFTED = lambda a: (a[:, :-1], a[:, 1:])                        # noqa: E731  x one sample behind m
APART = lambda a: (a[:, :3], a[:, 3:6])                          # noqa: E731  one buffer, no overlap


@pytest.mark.parametrize("views", [SAME, SHIFTED, APART], ids=["same", "shifted", "apart"])
def test_aliased_arguments_keep_their_aliasing_in_a_cached_call(views):
    f = ef.vmap(lambda x, m: acc3(x, m))
    A = np.arange(1.0, 15.0).reshape(2, 7)
    f(*views(np.arange(14.0).reshape(2, 7)))                      # the same layout, staged first
    for _ in range(2):                                            # then a hit, on new values
        want, want_A = loop_oracle(A, views)
        np.testing.assert_allclose(f(*views(A)), want, rtol=1e-13)
        np.testing.assert_allclose(A, want_A, rtol=1e-13)         # written as the loop writes it
    assert f.cache_info()[:2] == (2, 1)


def test_separate_arrays_then_one_array_twice_do_not_share_an_entry():
    f = ef.vmap(lambda x, m: acc3(x, m))
    A = np.arange(1.0, 7.0).reshape(2, 3)
    want_apart = np.array([[numpy_acc3(A[b], A[b].copy())] for b in range(2)])
    np.testing.assert_allclose(f(A, A.copy()), want_apart, rtol=1e-13)
    want, _ = loop_oracle(A, SAME)
    np.testing.assert_allclose(f(A, A), want, rtol=1e-13)
    assert f.cache_info().misses == 2


@ef.Graph.builder
def weighted(a, b):
    g = ef.Graph()
    g.result = total(mul(a, b))
    return g


def test_one_array_passed_twice_is_two_values_to_a_derivative_as_in_jax():
    # sum((a b)^2): d/da = 2 a b^2, not the derivative along the one buffer (a, b) share
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    want = jax.grad(lambda a, b: (a * b * a * b).sum())(X5, X5)
    np.testing.assert_allclose(ef.grad(weighted)(X5, X5), want, rtol=1e-13)
    np.testing.assert_allclose(ef.grad(lambda u: weighted(u, u))(X5), 2 * want, rtol=1e-13)  # u twice: both paths
    B = np.stack([X5, X5 + 1.0])
    np.testing.assert_allclose(ef.vmap(ef.grad(weighted))(B, B),
                               jax.vmap(jax.grad(lambda a, b: (a * b * a * b).sum()))(B, B), rtol=1e-13)


def test_a_derivative_takes_overlapping_written_arguments_as_values():
    # acc3 writes m; under grad the arguments are values (JAX's semantics, and a derivative's graph
    # writes no argument), so m = A[1:] starts from its own copy, not from what a write through x leaves
    A = np.arange(1.0, 8.0)
    x, m = A[:-1], A[1:]
    want = 2 * 3 * (m + 3 * x)                     # d/dx sum((m + 3x)^2)
    np.testing.assert_allclose(ef.grad(acc3)(x, m), want, rtol=1e-13)
    np.testing.assert_array_equal(A, np.arange(1.0, 8.0))          # the caller's arrays are not written


# -- static Python values equal by == but not the same ------------------------------------

def code_of(a):
    """A number that depends on a static's type and bits, as a builder may compute in Python."""
    if isinstance(a, float) and math.isnan(a):
        return 7.0
    kind = {bool: 2.0, int: 3.0}.get(type(a), 1.0)
    return kind * math.copysign(1.0, a) + 4.0


@ef.Graph.builder(static_argnames="a")             # a float read in Python must be static (floats are traced)
def by_static(x, a):
    g = ef.Graph()
    g.result = total(scaled(x, code_of(a)))          # decided once, in Python, when staged
    return g


def test_minus_zero_does_not_hit_the_entry_staged_for_zero():
    f = ef.value_and_grad(by_static)
    for a in (0.0, -0.0, 0.0):
        check(f(X5, a), code_of(a))


def test_nan_is_one_key_and_true_one_and_one_point_zero_are_three():
    f = ef.grad(by_static)
    for _ in range(3):
        np.testing.assert_allclose(f(X5, float("nan")), sum_sq(7.0, X5)[1], rtol=1e-13)
    assert f.cache_info()[:2] == (2, 1)              # a new NaN object each call: one entry
    for a in (True, 1, 1.0, np.float64(1.0), True):
        np.testing.assert_allclose(f(X5, a), sum_sq(code_of(a), X5)[1], rtol=1e-13)


def test_to_jax_keys_minus_zero_apart():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    f = ef.to_jax(by_static)
    for a in (0.0, -0.0):
        np.testing.assert_allclose(jax.grad(lambda x: f(x, a)[0])(X5), sum_sq(code_of(a), X5)[1], rtol=1e-13)


# -- the backend use_backend asks for ---------------------------------------------------

def test_a_jax_refusal_is_not_bypassed_by_a_numpy_entry():
    pytest.importorskip("jax")
    x = np.linspace(0.1, 1.0, 4)
    with use_backend("jax"), pytest.raises(ValueError, match="checkpointed") as fresh_refusal:
        ef.grad(settle_counted, checkpoints=2)(x, cell(2))           # what a fresh call does
    ef.grad(settle_counted, checkpoints=2)(x, cell(2))               # on NumPy: cached
    with use_backend("jax"), pytest.raises(ValueError) as cached:
        ef.grad(settle_counted, checkpoints=2)(x, cell(2))
    assert str(cached.value) == str(fresh_refusal.value)


def test_a_jax_entry_is_not_replayed_outside_use_backend():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    f = ef.grad(by_static)
    with use_backend("jax"):
        np.testing.assert_allclose(f(X5, 1.0), sum_sq(5.0, X5)[1], rtol=1e-13)
    np.testing.assert_allclose(f(X5, 1.0), sum_sq(5.0, X5)[1], rtol=1e-13)
    assert f.cache_info().misses == 2
    backends = {e.graph._exe.backend_name for e in cache.cache_for(f._sig).entries.values()}
    assert backends == {"jax", "cpu"}                  # cpu: the NumPy backend


# -- the class of bug: random call sequences against a fresh computation -------------------------

STATICS = [0.0, -0.0, float("nan"), True, 1, 1.0, 2.5, -2.5, np.float64(-0.0), np.float32(0.0), False, 0]
ALIASES = [SAME, SHIFTED, APART, lambda a: (a[:, :3], a[:, 1:4].copy())]


@hawk.kernel
def model_b(x: Scalar) -> Scalar:
    return -0.5 * x


def run_steps(steps, backends):
    """Run a sequence of (kind, pick, backend) steps, each call checked against NumPy: 0 rebinds the
    kernel `fit` calls, 1 passes a static from STATICS, 2 passes arguments aliased as in ALIASES."""
    global model
    old = model
    dfit, dstatic, vacc = ef.grad(fit), ef.grad(by_static), ef.vmap(lambda x, m: acc3(x, m))
    c_model = 2.0
    try:
        for kind, pick, backend in steps:
            with use_backend(backends[backend % len(backends)]):
                if kind == 0:                                 # rebind the kernel fit calls
                    model, c_model = (old, 2.0) if pick % 2 else (model_b, -0.5)
                    np.testing.assert_allclose(dfit(X5), sum_sq(c_model, X5)[1], rtol=1e-12)
                elif kind == 1:
                    a = STATICS[pick % len(STATICS)]
                    np.testing.assert_allclose(dstatic(X5, a), sum_sq(code_of(a), X5)[1], rtol=1e-12)
                else:
                    views = ALIASES[pick % len(ALIASES)]
                    A = np.arange(1.0, 15.0).reshape(2, 7) * (1 + pick % 3)
                    x, m = views(A)
                    if backends[backend % len(backends)] == "jax" and np.shares_memory(x, m):
                        # JAX arrays do not alias: the JAX backend refuses a written overlap, cached or not
                        refused(ValueError, lambda: vacc(x, m), "shares memory", untouched=[A])
                        continue
                    want, want_A = loop_oracle(A, views)
                    np.testing.assert_allclose(vacc(x, m), want, rtol=1e-12)
                    np.testing.assert_allclose(A, want_A, rtol=1e-12)
    finally:
        model = old


step = st.tuples(st.integers(0, 2), st.integers(0, 23), st.integers(0, 1))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=4, max_size=10))
def test_random_call_sequences_match_numpy(steps):
    """12 sequences, 75 calls, a few seconds."""
    ef.clear_caches()
    run_steps(steps, [None])


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=4, max_size=20))
def test_random_call_sequences_match_numpy_and_jax(steps):
    """120 sequences, 1186 calls, on the NumPy and JAX backends (about two minutes)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    ef.clear_caches()
    run_steps(steps, [None, "jax"])
