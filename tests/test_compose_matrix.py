"""Every pair (and a sample of triples) of grad, value_and_grad, vjp, jvp, vmap, jacfwd, jacrev and
hessian over one program with a capped loop (its guard read from the data), a counted loop and a
`match`, against JAX on the same math in float64: the capped loop unrolled to its cap with
jnp.where freezing finished turns, the counted loop a Python loop, the match a Python branch.

A composition JAX refuses (grad of a function whose result is not one value) is refused here too.
A derivative over a vmap (jacfwd(vmap(f)): the capped loop runs per instance, and the result spans
the instances) is compared with JAX's own composition of the same math.
Our programs are one-sample (x has shape (1,): "one value"), where JAX's x is a scalar: results
are compared leaf by leaf in value and size, and the tree of the result must be JAX's."""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar, UInt32
from hawk_fx import math as hm
from hawk_fx.tree import tree_flatten

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

CAP, LIM = 6, 0.5


@hawk.kernel
def big(x: Scalar, lim: Param) -> UInt32:
    return hm.uint32(hawk.sum(hm.abs(x) > lim))


@hawk.kernel
def shrink(x: Scalar) -> Scalar:
    return 0.6 * x + 0.1 * hm.sin(x)


@hawk.kernel
def step(x: Scalar, a: Param) -> Scalar:
    return a * x + 0.1 * hm.tanh(x)


@hawk.kernel
def wob(x: Scalar) -> Scalar:
    return hm.sin(x) * x


@hawk.kernel
def score(x: Scalar) -> Scalar:
    return hawk.sum(x * x + 0.3 * x)


@ef.Graph.builder
def prog(x, a, n, sel):
    g = ef.Graph()
    flag = big(x, LIM)
    for _ in range(CAP):                 # a capped loop: its guard is read from the data
        if not flag:
            break
        x = shrink(x)
        flag = big(x, LIM)
    for _ in range(n):                   # a counted loop: n is a cell
        x = step(x, a)
    match sel:
        case 0:
            x = wob(x)
        case _:
            x = step(x, 0.7)
    g.result = score(x)
    return g


A = np.array([1.1])
N, SEL = 2, 0


def jprog(s, a=1.1, n=N, sel=SEL):
    """The same math in JAX on a scalar."""
    def capped(_, state):
        s, run = state
        s = jnp.where(run, 0.6 * s + 0.1 * jnp.sin(s), s)
        return s, run & (jnp.abs(s) > LIM)
    s = jax.lax.fori_loop(0, CAP, capped, (s, jnp.abs(s) > LIM))[0]
    s = jax.lax.fori_loop(0, n, lambda _, s: a * s + 0.1 * jnp.tanh(s), s)
    s = jnp.sin(s) * s if sel == 0 else 0.7 * s + 0.1 * jnp.tanh(s)
    return s * s + 0.3 * s


def base(lib):
    if lib is ef:
        n, sel = np.array([N], np.uint32), np.array([SEL], np.uint32)
        return lambda x: prog(x, A, n, sel)
    return jprog


INNER = ["grad", "value_and_grad", "jvp", "vmap", "jacfwd", "jacrev", "hessian"]
OUTER = INNER + ["vjp"]


def wrap(lib, name, fn):
    """Transform `name` of fn (one argument) as a function of one argument; inner results that are
    trees are indexed, as a user of JAX would."""
    if name == "value_and_grad":
        return lambda x: lib.value_and_grad(fn)(x)[1]
    if name == "jvp":
        return lambda x: lib.jvp(fn, (x,), (np.ones(np.shape(x)) * 0.7,))[1]
    return getattr(lib, name)(fn)


def outer(lib, name, fn, x):
    """The outermost transform, its whole result (a vjp: the result and the pullback of ones)."""
    if name == "value_and_grad":
        return lib.value_and_grad(fn)(x)
    if name == "jvp":
        return lib.jvp(fn, (x,), (np.ones(np.shape(x)) * 0.7,))
    if name == "vjp":
        y, pb = lib.vjp(fn, x)
        return y, pb(np.ones(np.shape(y)))
    return getattr(lib, name)(fn)(x)


X0 = 1.3                               # three turns of the capped loop
XS = np.array([1.3, 0.3, -0.8])        # per instance: three, none, two turns


def inputs(chain):
    """Our x and JAX's for a chain of transforms: one batch axis per vmap."""
    k = chain.count("vmap")
    if k == 0:
        return np.array([X0]), np.float64(X0)
    xs = XS
    for scale in ([1.0, 0.7], [1.0, 1.2])[:k - 1]:
        xs = np.multiply.outer(scale, xs)
    return xs[..., None].copy(), xs.copy()


def compose(lib, chain, x):
    fn = base(lib)
    for name in reversed(chain[1:]):
        fn = wrap(lib, name, fn)
    return outer(lib, chain[0], fn, x)


ORDER = {"grad": 1, "value_and_grad": 1, "jvp": 1, "jacfwd": 1, "jacrev": 1, "hessian": 2, "vjp": 1}
TANGENT = 0.7


@functools.lru_cache(maxsize=None)
def derivative(k):
    """x -> the k-th derivative of jprog at scalar x, by nested jax.grad (jit-compiled once)."""
    fn = jprog
    for _ in range(k):
        fn = jax.grad(fn)
    return jax.jit(jax.vmap(fn))


def expected(chain, xs):
    """JAX's result of the chain at xs (its instances, flat), None where JAX refuses it: inside, each
    result is c * f^(k)(x) per instance; the outermost transform gives its tree."""
    k, c = 0, 1.0
    for at in reversed(range(len(chain))):
        name = chain[at]
        if name in ("grad", "value_and_grad") and "vmap" in chain[at + 1:]:
            return None                                   # grad of a batched (not one-value) result
        if at == 0 and name in ("value_and_grad", "jvp", "vjp"):
            y = c * np.asarray(derivative(k)(xs))
            d = c * np.asarray(derivative(k + 1)(xs)) * (TANGENT if name == "jvp" else 1.0)
            return (y, (d,)) if name == "vjp" else (y, d)
        if name != "vmap":
            k, c = k + ORDER[name], c * (TANGENT if name == "jvp" else 1.0)
    return c * np.asarray(derivative(k)(xs))


def check(chain, against_jax=False):
    ours_x, jax_x = inputs(chain)
    want = expected(chain, np.atleast_1d(jax_x).ravel())
    if want is not None and _derivative_over_vmap(chain):
        # the derivative's result spans the instances (a block-diagonal Jacobian): JAX's own composition
        want = jax.tree_util.tree_map(np.asarray, jax.jit(lambda x: compose(jax, chain, x))(jax_x))
    elif against_jax:                                       # JAX's own composition: the oracle's trees and values
        try:
            direct = compose(jax, chain, jax_x)
        except (TypeError, ValueError):
            direct = None
        assert (direct is None) == (want is None)
        if direct is not None:
            d_leaves, d_tree = jax.tree_util.tree_flatten(direct)
            w_leaves, w_tree = jax.tree_util.tree_flatten(want)
            assert d_tree == w_tree
            for d, w in zip(d_leaves, w_leaves):
                np.testing.assert_allclose(np.ravel(d), np.ravel(w), rtol=1e-9, atol=1e-11)
    if want is None:                                      # JAX refuses it (a result that is not one value)
        with pytest.raises((TypeError, ValueError)):
            compose(ef, chain, ours_x)
        return None
    keep = ours_x.copy()
    got = compose(ef, chain, ours_x)
    g_leaves, g_tree = tree_flatten(got)
    w_leaves, w_tree = tree_flatten(want)
    assert str(g_tree) == str(w_tree), f"result tree {g_tree}, JAX's {w_tree}"
    for g, w in zip(g_leaves, w_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.size == w.size, f"{g.shape} vs JAX's {w.shape}"
        np.testing.assert_allclose(g.ravel(), w.ravel(), rtol=1e-9, atol=1e-11)
    np.testing.assert_array_equal(ours_x, keep)
    return None


DERIVATIVES = {"grad", "value_and_grad", "vjp", "jvp", "jacfwd", "jacrev", "hessian"}


def _derivative_over_vmap(chain):
    """A derivative with a vmap below it, whose capped loop then runs per instance (XS's instances
    run different turns), and whose result spans the instances."""
    if "vmap" not in chain:
        return False
    last = len(chain) - 1 - chain[::-1].index("vmap")
    return any(t in DERIVATIVES for t in chain[:last])


PAIRS = list(itertools.product(OUTER, INNER))


@pytest.mark.parametrize("o,i", PAIRS, ids=[f"{o}-{i}" for o, i in PAIRS])
def test_pair(o, i):
    check([o, i])


TRIPLES = list(itertools.product(OUTER, INNER, INNER))
CHEAP = [t for t in TRIPLES if sum(ORDER.get(n, 0) for n in t) <= 4]       # fifth derivatives: the slow sweep
SAMPLED = [CHEAP[k] for k in np.random.default_rng(23).choice(len(CHEAP), 24, replace=False)]
CHECKED = [("grad", "grad"), ("jacfwd", "jvp"), ("vjp", "jacrev"), ("vmap", "hessian"), ("jvp", "vmap"),
           ("value_and_grad", "value_and_grad"), ("grad", "vmap"), ("hessian", "vmap")]


@pytest.mark.parametrize("o,i", CHECKED, ids=[f"{o}-{i}" for o, i in CHECKED])
def test_the_oracle_is_jax_composed(o, i):
    """The derivative table gives what JAX's own composition gives (trees, values, refusals)."""
    check([o, i], against_jax=True)


@pytest.mark.parametrize("t", SAMPLED, ids=["-".join(t) for t in SAMPLED])
def test_sampled_triple(t):
    check(list(t))


@pytest.mark.slow
@pytest.mark.parametrize("t", TRIPLES, ids=["-".join(t) for t in TRIPLES])
def test_triple(t):
    check(list(t))


ON_CUDA = [["vmap", "jacfwd"], ["jacfwd", "jacfwd"], ["grad", "grad"], ["jvp", "vmap"]]


@pytest.mark.parametrize("chain", ON_CUDA, ids=["-".join(c) for c in ON_CUDA])
def test_compositions_on_the_cuda_lowering(chain):
    """The same checks with the CUDA lowering on the fake device (an inner batch spread over an
    outer one, reverse over reverse); reverse over a batched program is refused there."""
    from eagle_fx.backends.select import use_backend
    with use_backend("fake-cuda"):
        check(chain)
        with pytest.raises(NotImplementedError, match="sums over the batch"):
            compose(ef, ["grad", "jacfwd"], inputs(["grad"])[0])


def test_derivatives_of_a_vmap_with_a_shared_condition_match_jax():
    """jacfwd, jacrev and vjp of vmap(f) where the if and the loop count are shared (cells with
    in_axes None): the loops stay unmasked and reverse mode sums nothing it should not."""
    from tour_kernels import cell, loss

    def jloss(x):
        x = jnp.sin(x) * x
        x = jax.lax.fori_loop(0, 3, lambda i, v: 1.1 * v + 0.1 * jnp.tanh(v), x)
        return jnp.sum(x * x)
    xs = np.random.default_rng(3).normal(size=(3, 4))
    keep = xs.copy()
    batched = ef.vmap(loss, in_axes=(0, None, None))
    for name in ("jacfwd", "jacrev"):
        got = getattr(ef, name)(batched)(xs, cell(1), cell(3))
        want = np.asarray(getattr(jax, name)(jax.vmap(jloss))(xs))
        assert np.size(got) == want.size
        np.testing.assert_allclose(np.reshape(got, want.shape), want, rtol=1e-10, atol=1e-12)
    y, pullback = ef.vjp(batched, xs, cell(1), cell(3))
    ct = np.arange(3.0).reshape(3, 1)
    _, jpb = jax.vjp(jax.vmap(jloss), xs)
    np.testing.assert_allclose(pullback(ct)[0], np.asarray(jpb(ct.ravel())[0]), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(xs, keep)
