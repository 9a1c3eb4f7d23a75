"""hawk_fx.linalg against jax.numpy.linalg / jax.scipy.linalg under jax.vmap (the sample axis moved
last: our planes are (k, k, n)): values, forward derivatives (hawk_fx.diff.jvp against jax.jvp) and
reverse derivatives (hawk_fx.diff.vjp against jax.vjp), in float32 and float64, on random
well-conditioned matrices; then pivoting, singular systems, refusals and build time."""

import time
import zlib

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.diff as hdiff
from hawk_fx import Matrix, Mutable, Vector
from hawk_fx import math as hm

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
jsl = jax.scipy.linalg

FLOATS = [np.float32, np.float64]
IDS = ["f32", "f64"]
VAL_TOL = {np.float32: 2e-4, np.float64: 1e-11}
DER_TOL = {np.float32: 2e-3, np.float64: 1e-9}
N = 24


# ---------------------------------------------------------------------------------------------
# inputs: planes with the sample axis last

def _planes(x, dtype=np.float64):
    return np.ascontiguousarray(np.moveaxis(x, 0, -1)).astype(dtype)


def _orth(rng, n, k):
    q, r = np.linalg.qr(rng.normal(size=(n, k, k)))
    return q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]


def general(rng, n, k, m=None, lo=1.0, hi=3.0):
    """n random matrices with singular values in [lo, hi] (condition number <= hi / lo); m rows
    (m >= k) for a tall one."""
    m = k if m is None else m
    u = _orth(rng, n, m)[:, :, :k]
    return (u * rng.uniform(lo, hi, (n, 1, k))) @ _orth(rng, n, k)


def spd(rng, n, k):
    q = _orth(rng, n, k)
    return (q * rng.uniform(1.0, 3.0, (n, 1, k))) @ np.swapaxes(q, 1, 2)


def symmetric(rng, n, k):
    """Symmetric with eigenvalues spread apart (at least 0.5), of both signs."""
    q = _orth(rng, n, k)
    w = np.sort(rng.uniform(-0.2, 0.2, (n, k)) + np.arange(k) - k / 2, axis=1)
    return (q * w[:, None, :]) @ np.swapaxes(q, 1, 2)


# ---------------------------------------------------------------------------------------------
# the harness

def kernel_of(fn, roles):
    if len(roles) == 1:
        r0 = roles[0]

        @hawk.kernel
        def k1(a: r0):
            return fn(a)
        return k1
    r0, r1 = roles

    @hawk.kernel
    def k2(a: r0, b: r1):
        return fn(a, b)
    return k2


def role(shape):
    return Vector[shape[0]] if len(shape) == 1 else Matrix[shape[0], shape[1]]


def leaves(x):
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(x)]


def close(got, want, tol, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (what, i, g.shape, w.shape)
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, err_msg=f"{what} [{i}]")


_ORACLES = {}


def oracle(key, theirs, args, sign_free=None):
    """jax.vmap(theirs) in float64 on args (planes, the sample axis last): values, the jvp along
    seeded tangents and the vjp of seeded cotangents, in one jax.jit; cached by key, since the
    float32 run is checked against the same float64 results."""
    if key in _ORACLES:
        return _ORACLES[key]
    post = sign_free or (lambda outs: outs)
    jf = jax.vmap(lambda *xs: post(theirs(*xs)), in_axes=-1, out_axes=-1)
    rng = np.random.default_rng(7)
    args = tuple(np.asarray(a, np.float64) for a in args)
    tans = tuple(rng.normal(size=a.shape) for a in args)
    cts = jax.tree_util.tree_map(lambda o: rng.normal(size=o.shape).astype(o.dtype), jax.eval_shape(jf, *args))

    @jax.jit
    def run(xs, ts, cs):
        out, pull = jax.vjp(jf, *xs)
        return out, jax.jvp(jf, xs, ts)[1], pull(cs)

    _ORACLES[key] = (tans, cts) + tuple(leaves(r) for r in run(args, tans, cts))
    return _ORACLES[key]


def check(key, ours, theirs, args, dtype, derivatives=True, sign_free=None):
    """ours (per-sample values) in a kernel against the JAX oracle: values, jvp and vjp.
    sign_free(outputs) -> outputs that do not depend on an arbitrary sign (eigenvectors): then
    values and derivatives are compared through it."""
    post = sign_free or (lambda outs: outs)
    tans, cts, want, want_t, want_g = oracle(key, theirs, args, sign_free)
    args = [a.astype(dtype) for a in args]
    k = kernel_of(lambda *xs: post(ours(*xs)), [role(a.shape[:-1]) for a in args])
    got = leaves(k(*args))
    for g, w in zip(got, want):
        assert g.dtype == (dtype if w.dtype.kind == "f" else w.dtype), (g.dtype, w.dtype)
    close(got, want, VAL_TOL[dtype], "values")
    if not derivatives:
        return
    names = k.param_names
    cast = (lambda x: np.asarray(x, dtype) if np.asarray(x).dtype.kind == "f" else np.asarray(x))
    _, got_t = hdiff.jvp(k, wrt=names)(*args, tangents={nm: cast(t) for nm, t in zip(names, tans)})
    close(got_t, want_t, DER_TOL[dtype], "jvp")
    got_g = hdiff.vjp(k, wrt=names)(*args, cotangent=jax.tree_util.tree_map(cast, cts))
    close([got_g[nm] for nm in names], want_g, DER_TOL[dtype], "vjp")


# ---------------------------------------------------------------------------------------------
# values and derivatives against JAX

K = 4


def _a(rng, k=K):
    return _planes(general(rng, N, k))


CASES = {
    "solve_vector": (lambda a, b: hm.linalg.solve(a, b), jnp.linalg.solve, lambda r: [_a(r), r.normal(size=(K, N))]),
    "solve_matrix": (lambda a, b: hm.linalg.solve(a, b), jnp.linalg.solve,
                     lambda r: [_a(r), r.normal(size=(K, 2, N))]),
    "inv": (hm.linalg.inv, jnp.linalg.inv, lambda r: [_a(r)]),
    "det": (hm.linalg.det, jnp.linalg.det, lambda r: [_a(r)]),
    "slogdet": (lambda a: hm.linalg.slogdet(a), lambda a: tuple(jnp.linalg.slogdet(a)), lambda r: [_a(r)]),
    "lu": (hm.linalg.lu, jsl.lu, lambda r: [_a(r)]),
    "lu_factor": (hm.linalg.lu_factor, jsl.lu_factor, lambda r: [_a(r)]),
    "lu_solve": (lambda a, b: hm.linalg.lu_solve(hm.linalg.lu_factor(a), b),
                 lambda a, b: jsl.lu_solve(jsl.lu_factor(a), b), lambda r: [_a(r), r.normal(size=(K, N))]),
    "cholesky": (hm.linalg.cholesky, jnp.linalg.cholesky, lambda r: [_planes(spd(r, N, K))]),
    "cho_solve_lower": (lambda a, b: hm.linalg.cho_solve((hm.linalg.cholesky(a), True), b),
                        lambda a, b: jsl.cho_solve((jnp.linalg.cholesky(a), True), b),
                        lambda r: [_planes(spd(r, N, K)), r.normal(size=(K, N))]),
    "cho_solve_upper": (lambda c, b: hm.linalg.cho_solve((c, False), b), lambda c, b: jsl.cho_solve((c, False), b),
                        lambda r: [_planes(np.triu(general(r, N, K))), r.normal(size=(K, 3, N))]),
    "qr_square": (hm.linalg.qr, lambda a: tuple(jnp.linalg.qr(a)), lambda r: [_a(r)]),
    "qr_tall": (hm.linalg.qr, lambda a: tuple(jnp.linalg.qr(a)), lambda r: [_planes(general(r, N, 3, m=5))]),
    "qr_tall_complete": (lambda a: hm.linalg.qr(a, mode="complete"), lambda a: tuple(jnp.linalg.qr(a, mode="complete")),
                         lambda r: [_planes(general(r, N, 2, m=4))]),
    "qr_r": (lambda a: hm.linalg.qr(a, mode="r"), lambda a: jnp.linalg.qr(a, mode="r"),
             lambda r: [_planes(general(r, N, 3, m=4))]),
    "lstsq_vector": (hm.linalg.lstsq, lambda a, b: jnp.linalg.lstsq(a, b)[0],
                     lambda r: [_planes(general(r, N, 3, m=5)), r.normal(size=(5, N))]),
    "lstsq_matrix": (hm.linalg.lstsq, lambda a, b: jnp.linalg.lstsq(a, b)[0],
                     lambda r: [_planes(general(r, N, 2, m=4)), r.normal(size=(4, 3, N))]),
    "norm_vector": (lambda v: [hm.linalg.norm(v, o) for o in (None, 1, np.inf, -np.inf, 3, 0.5, 0)],
                    lambda v: [jnp.linalg.norm(v, o) for o in (None, 1, np.inf, -np.inf, 3, 0.5, 0)],
                    lambda r: [r.normal(size=(5, N))]),
    "norm_matrix": (lambda a: [hm.linalg.norm(a, o) for o in (None, "fro", 1, -1, np.inf, -np.inf)],
                    lambda a: [jnp.linalg.norm(a, o) for o in (None, "fro", 1, -1, np.inf, -np.inf)],
                    lambda r: [r.normal(size=(3, 4, N))]),
}

NO_DERIVATIVE = {"lu_factor"}       # its pivots are integers: compared by value (the rest is lu's)


# the rest of CASES run with -m slow (a JAX compile each)
DEFAULT = {"solve_vector", "inv", "det", "slogdet", "cholesky", "qr_square", "lstsq_vector", "norm_vector"}


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)])
def test_values_and_derivatives_match_jax(name, dtype):
    ours, theirs, make = CASES[name]
    check(name, ours, theirs, make(np.random.default_rng(zlib.crc32(name.encode()))), dtype,
          derivatives=name not in NO_DERIVATIVE)


def _eigh_sign_free(outs):
    w, v = outs
    return w, v * v         # each column's sign is arbitrary (LAPACK's, and ours)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_eigh_matches_jax_up_to_signs(dtype):
    a = _planes(symmetric(np.random.default_rng(3), N, K))
    check("eigh", hm.linalg.eigh, jnp.linalg.eigh, [a], dtype, sign_free=_eigh_sign_free)


def test_eigh_vectors_are_orthonormal_and_diagonalise():
    rng = np.random.default_rng(4)
    k = 5
    a = symmetric(rng, N, k)
    kern = kernel_of(hm.linalg.eigh, [Matrix[k, k]])
    w, v = (np.moveaxis(x, -1, 0) for x in kern(_planes(a, np.float64)))
    np.testing.assert_allclose(np.swapaxes(v, 1, 2) @ v, np.broadcast_to(np.eye(k), (N, k, k)), atol=1e-13)
    np.testing.assert_allclose((v * w[:, None, :]) @ np.swapaxes(v, 1, 2), a, atol=1e-12)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), atol=1e-12)


def test_eigh_keeps_opposite_eigenvalues_apart_and_takes_zero():
    rng = np.random.default_rng(8)
    q = _orth(rng, 6, 4)
    a = (q * np.array([1.0, -1.0, 2.0, -2.0])) @ np.swapaxes(q, 1, 2)      # |w| ties between +-1 and +-2
    a = np.concatenate([a, np.zeros((1, 4, 4))])
    w, v = (np.moveaxis(x, -1, 0) for x in kernel_of(hm.linalg.eigh, [Matrix[4, 4]])(_planes(a)))
    np.testing.assert_allclose(w[:6], np.broadcast_to([-2.0, -1.0, 1.0, 2.0], (6, 4)), atol=1e-13)
    np.testing.assert_allclose((v * w[:, None, :]) @ np.swapaxes(v, 1, 2), a, atol=1e-13)
    np.testing.assert_array_equal(w[6], np.zeros(4))
    np.testing.assert_array_equal(v[6], np.eye(4))


# ---------------------------------------------------------------------------------------------
# a seeded sweep over sizes: values against NumPy's LAPACK

@pytest.mark.parametrize("k", [1, 2, 3, 5, pytest.param(8, marks=pytest.mark.slow)])
def test_sizes_against_numpy(k):
    rng = np.random.default_rng(100 + k)
    a, b = general(rng, N, k, lo=0.5, hi=4.0), rng.normal(size=(N, k))
    s = spd(rng, N, k)

    @hawk.kernel
    def many(a: Matrix[k, k], b: Vector[k], s: Matrix[k, k]):
        return (hm.linalg.solve(a, b), hm.linalg.inv(a), hm.linalg.det(a), hm.linalg.slogdet(a)[1],
                hm.linalg.cholesky(s), hm.linalg.qr(a)[1], hm.linalg.eigh(s)[0])

    got = [np.moveaxis(x, -1, 0) for x in many(_planes(a, np.float64), b.T.copy(), _planes(s, np.float64))]
    want = [np.linalg.solve(a, b[..., None])[..., 0], np.linalg.inv(a), np.linalg.det(a), np.linalg.slogdet(a)[1],
            np.linalg.cholesky(s), np.linalg.qr(a)[1], np.linalg.eigvalsh(s)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11)


# ---------------------------------------------------------------------------------------------
# pivoting, singular systems

def test_pivoting_handles_a_zero_leading_entry():
    a = np.array([[[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]])         # no LU without a row swap
    kern = kernel_of(lambda a: (hm.linalg.solve(a, hm.vec(1.0, 2.0, 3.0)), hm.linalg.det(a)), [Matrix[3, 3]])
    x, d = kern(_planes(a, np.float64))
    np.testing.assert_allclose(x[:, 0], np.linalg.solve(a[0], [1.0, 2.0, 3.0]), rtol=1e-14)
    np.testing.assert_allclose(d, np.linalg.det(a), rtol=1e-14)


def test_pivots_are_lapacks():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(N, 5, 5))
    a[:3, :, 0] = [1.0, -1.0, 1.0, 0.5, -0.5]                                   # ties: the first largest wins
    lu_, piv = kernel_of(hm.linalg.lu_factor, [Matrix[5, 5]])(_planes(a, np.float64))
    for i in range(N):
        want_lu, want_piv = jsl.lu_factor(a[i])
        np.testing.assert_array_equal(piv[:, i], want_piv)
        np.testing.assert_allclose(lu_[..., i], want_lu, rtol=1e-12, atol=1e-13)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_singular_sample_gives_inf_or_nan_and_leaves_the_others():
    a = np.stack([np.eye(3), [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], np.zeros((3, 3)),
                  [[0.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 3.0]]])
    kern = kernel_of(lambda a: (hm.linalg.solve(a, hm.vec(1.0, 1.0, 1.0)), hm.linalg.det(a), hm.linalg.slogdet(a),
                                hm.linalg.inv(a)), [Matrix[3, 3]])
    x, d, (sign, logabs), ai = kern(_planes(a, np.float64))
    np.testing.assert_array_equal(x[:, 0], [1.0, 1.0, 1.0])
    assert not np.isfinite(x[:, 1:]).all(axis=0).any()                          # each singular sample: inf/nan
    assert not np.isfinite(ai[..., 1:]).all(axis=(0, 1)).any()
    np.testing.assert_array_equal(d, [1.0, 0.0, 0.0, 0.0])                       # as numpy.linalg.det
    np.testing.assert_array_equal(sign, np.linalg.slogdet(a)[0])
    np.testing.assert_array_equal(logabs, np.linalg.slogdet(a)[1])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cholesky_of_an_indefinite_matrix_is_nan_not_an_error():
    a = np.stack([np.eye(2) * 4.0, np.array([[1.0, 2.0], [2.0, 1.0]])])
    L = kernel_of(hm.linalg.cholesky, [Matrix[2, 2]])(_planes(a, np.float64))
    np.testing.assert_array_equal(L[..., 0], [[2.0, 0.0], [0.0, 2.0]])
    assert np.isnan(L[1, 1, 1])


# ---------------------------------------------------------------------------------------------
# refusals name the kernel line

def test_a_non_square_solve_names_the_kernel_line():
    @hawk.kernel
    def bad(a: Matrix[2, 3], b: Vector[2]):
        return hm.linalg.solve(a, b)

    with pytest.raises(ValueError, match=r"(?s)bad.*line \d+.*hm\.linalg\.solve\(a, b\).*hawk\.linalg\.solve: needs a "
                                         r"square Matrix\[k, k\].*\(2, 3\).*lstsq"):
        bad(np.zeros((2, 3, 4)), np.zeros((2, 4)))


def test_refusals():
    @hawk.kernel
    def wrong_rhs(a: Matrix[2, 2], b: Vector[3]):
        return hm.linalg.solve(a, b)

    with pytest.raises(ValueError, match=r"wrong_rhs.*right-hand side must be a Vector\[2\]"):
        wrong_rhs(np.zeros((2, 2, 4)), np.zeros((3, 4)))

    @hawk.kernel
    def wide(a: Matrix[2, 3], b: Vector[2]):
        return hm.linalg.lstsq(a, b)

    with pytest.raises(ValueError, match=r"wide.*m >= n"):
        wide(np.zeros((2, 3, 4)), np.zeros((2, 4)))

    @hawk.kernel
    def spectral(a: Matrix[2, 2]):
        return hm.linalg.norm(a, 2)

    with pytest.raises(ValueError, match=r"spectral.*ord=2 needs singular values"):
        spectral(np.zeros((2, 2, 4)))


def test_a_refused_kernel_writes_nothing():
    @hawk.kernel
    def step(x: Mutable[Vector[2]], a: Matrix[2, 3]):
        x = hm.linalg.solve(a, x)

    x = np.ones((2, 4))
    with pytest.raises(ValueError, match=r"step.*x = hm\.linalg\.solve\(a, x\).*square"):
        step(x, np.zeros((2, 3, 4)))
    np.testing.assert_array_equal(x, np.ones((2, 4)))


# ---------------------------------------------------------------------------------------------
# the JAX backend: a kernel called on jax.Arrays, under jax.grad

def test_on_jax_arrays_and_under_jax_grad():
    rng = np.random.default_rng(9)
    a, b = _planes(general(rng, N, 3)), rng.normal(size=(3, N))

    @hawk.kernel
    def solve_det(a: Matrix[3, 3], b: Vector[3]):
        return hm.linalg.solve(a, b), hm.linalg.det(a)

    x, d = solve_det(jnp.asarray(a), jnp.asarray(b))
    x0, d0 = solve_det(a, b)
    np.testing.assert_allclose(np.asarray(x), x0, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(d), d0, rtol=1e-12)
    g = jax.grad(lambda m: solve_det(m, jnp.asarray(b))[1].sum())(jnp.asarray(a))
    am = np.moveaxis(a, -1, 0)
    want = np.linalg.det(am)[:, None, None] * np.swapaxes(np.linalg.inv(am), 1, 2)      # d det / dA = det A^-T
    np.testing.assert_allclose(np.moveaxis(np.asarray(g), -1, 0), want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# build time of the unrolled code

def test_a_16x16_solve_builds_in_well_under_a_second_per_call():
    rng = np.random.default_rng(6)
    a, b = general(rng, 64, 16), rng.normal(size=(64, 16))

    @hawk.kernel
    def solve16(a: Matrix[16, 16], b: Vector[16]):
        return hm.linalg.solve(a, b)

    t = time.perf_counter()
    x = solve16(_planes(a, np.float64), b.T.copy())
    first = time.perf_counter() - t
    np.testing.assert_allclose(x.T, np.linalg.solve(a, b[..., None])[..., 0], rtol=1e-10, atol=1e-12)
    assert first < 5.0, f"an unrolled 16 x 16 solve took {first:.2f} s to trace and build"
