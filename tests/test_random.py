"""Per-sample random numbers (hawk_fx.random, hm.random): the cipher against the published Random123
known answers and jax's threefry, the streams against jax.random, NumPy vs JAX vs the emitted CUDA C
(run by the host emulation), independence of n and chunking, statistics (moments, KS), derivatives
(against finite differences with common random numbers and the closed forms), a device loop that
folds its turn into the key, and bad keys."""
from __future__ import annotations

import math

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.diff as hd
import hawk_fx.math as hm
from hawk_fx import Key, Mutable, Param, Scalar, UInt32, Vector
from hawk_fx.emit import numpy as np_emit
from hawk_fx.emit.numpy import NumpyKernel
from hawk_fx.rng_prims import threefry2x32, threefry_p

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
jrandom = jax.random
from jax.extend.random import threefry_2x32 as _jax_threefry_2x32  # noqa: E402


def jax_threefry(k, c):
    """jax's Threefry-2x32 of keys (k0, k1) and counters (c0, c1), per element: two word arrays."""
    k0, k1 = (np.broadcast_to(np.asarray(w, U32), np.shape(c[0])) for w in k)
    one = jax.vmap(lambda a, b, x, y: _jax_threefry_2x32((a, b), jnp.stack([x, y])))
    out = np.asarray(one(k0, k1, np.asarray(c[0], U32), np.asarray(c[1], U32)))
    return out[:, 0], out[:, 1]


stats = pytest.importorskip("scipy.stats")

# Random123 kat_vectors, threefry2x32 with 20 rounds: (counter words, key words) -> output words
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]
U32 = np.uint32


@hawk.kernel
def cipher(key: Key, ctr: Vector[2]):
    return threefry_p.bind(key, ctr, xor=False)


def _kat_planes():
    ctr = np.array([c for c, _, _ in KAT], U32).T.copy()
    key = np.array([k for _, k, _ in KAT], U32).T.copy()
    want = np.array([w for _, _, w in KAT], U32).T
    return key, ctr, want


def test_known_answers_host_numpy_and_jax():
    key, ctr, want = _kat_planes()
    y0, y1 = threefry2x32(key[0], key[1], ctr[0], ctr[1])
    np.testing.assert_array_equal(np.stack([y0, y1]), want)
    np.testing.assert_array_equal(cipher(key, ctr), want)                       # NumPy emitter
    np.testing.assert_array_equal(np.asarray(cipher(jnp.asarray(key), jnp.asarray(ctr))), want)   # JAX emitter


def test_cipher_matches_jax_threefry_on_random_words():
    rng = np.random.default_rng(1)
    for _ in range(5):
        key = rng.integers(0, 2 ** 32, (2, 257), dtype=U32)
        ctr = rng.integers(0, 2 ** 32, (2, 257), dtype=U32)
        want = np.stack(jax_threefry((key[0], key[1]), (ctr[0], ctr[1])))
        np.testing.assert_array_equal(cipher(key, ctr), want)
        one = key[:, :1].copy()                                   # one key for all samples
        want1 = np.stack(jax_threefry(one[:, 0], (ctr[0], ctr[1])))
        np.testing.assert_array_equal(cipher(one, ctr), want1)


def test_emitted_cuda_computes_the_same_words(tmp_path, nvrtc):
    """The emitted CUDA C, compiled for the host (the CUDA emitter tests' emulation), against the KAT."""
    import shutil
    emu = pytest.importorskip("test_cuda_emit")
    if shutil.which("g++") is None:
        pytest.skip("no g++ for the host emulation")
    from hawk_fx.emit import cuda
    key, ctr, want = _kat_planes()
    rng = np.random.default_rng(2)
    n = 200
    key = np.concatenate([key, rng.integers(0, 2 ** 32, (2, n - 3), dtype=U32)], axis=1)
    ctr = np.concatenate([ctr, rng.integers(0, 2 ** 32, (2, n - 3), dtype=U32)], axis=1)

    @hawk.kernel
    def draws(key: Key, ctr: Vector[2], x: Scalar):
        k1, k2 = hm.random.split(key)
        return (threefry_p.bind(key, ctr, xor=False), hm.random.bits(k1), hm.random.uniform(k2),
                hm.random.fold_in(key, 7), hm.sample_index())

    x = np.zeros(n)
    spec = draws.specialize(draws.layout_of([key, ctr, x])[0])
    ek = cuda.emit_specialization(spec)
    cuda.compile_ptx(ek.source)                              # NVRTC accepts it
    lib = emu.emu_build([ek], tmp_path)
    outs = [np.zeros(spec.result_shape(j, n), spec.result_dtype(j)) for j in range(spec.n_results)]
    emu.emu_run(lib, ek, [key, ctr, x], outs, n=n)
    np.testing.assert_array_equal(outs[0][:, :3], want)
    for got, ref in zip(outs, draws(key, ctr, x)):
        np.testing.assert_array_equal(got, ref)


# ---------------------------------------------------------------------------------------------
# keys and streams against jax.random

@pytest.mark.parametrize("seed", [0, 1, 42, 2 ** 32 + 5, 2 ** 63 - 1, -1])
def test_key_split_fold_in_match_jax(seed):
    jk = jrandom.PRNGKey(seed)
    k = hawk.random.key(seed)
    assert k.shape == (2, 1) and k.dtype == U32
    np.testing.assert_array_equal(k[:, 0], np.asarray(jrandom.key_data(jk)))
    for got, want in zip(hawk.random.split(k, 3), jrandom.split(jk, 3)):
        np.testing.assert_array_equal(got[:, 0], np.asarray(want))
    for d in (0, 1, 12345, 2 ** 32 - 1):
        np.testing.assert_array_equal(hawk.random.fold_in(k, d)[:, 0], np.asarray(jrandom.fold_in(jk, d)))
    np.testing.assert_array_equal(hawk.random.sample_keys(k, 50), np.asarray(jrandom.split(jk, 50)).T)


@hawk.kernel
def streams(key: Key, x: Scalar):
    k1, k2, k3 = hm.random.split(key, 3)
    return {"bits": hm.random.bits(key), "u32": hm.random.uniform(key, dtype=np.float32),
            "u64": hm.random.uniform(key), "split": k2, "fold": hm.random.fold_in(key, hm.uint32(x)),
            "k3bits": hm.random.bits(k3), "i": hm.sample_index(), "n": hm.n_samples() + 0.0 * x}


@pytest.mark.parametrize("seed", [0, 7, 2 ** 40 + 3])
def test_one_cell_key_streams_are_jax_random_streams(seed):
    n = 70_000                                     # more than two NumPy chunks
    k, jk = hawk.random.key(seed), jrandom.PRNGKey(seed)
    x = np.arange(n) % 5.0
    r = streams(k, x)
    np.testing.assert_array_equal(r["bits"], np.asarray(jrandom.bits(jk, (n,), jnp.uint32)))
    np.testing.assert_array_equal(r["u32"], np.asarray(jrandom.uniform(jk, (n,), jnp.float32)))
    np.testing.assert_array_equal(r["u64"], np.asarray(jrandom.uniform(jk, (n,), jnp.float64)))
    jsplit = jrandom.split(jk, 3)
    np.testing.assert_array_equal(r["split"][:, 0], np.asarray(jsplit[1]))
    np.testing.assert_array_equal(r["k3bits"], np.asarray(jrandom.bits(jsplit[2], (n,), jnp.uint32)))
    np.testing.assert_array_equal(r["fold"][:, :5].T, np.asarray([jrandom.fold_in(jk, d) for d in x[:5].astype(int)]))
    np.testing.assert_array_equal(r["i"], np.arange(n, dtype=U32))
    assert r["n"][0] == n


def test_per_sample_keys_mix_in_the_sample_index():
    """A plane of keys: sample i draws from its own key at counter (0, i), as
    jax.random.bits(key_i, (n,))[i]."""
    k = hawk.random.key(5)
    keys = hawk.random.sample_keys(k, 40)
    r = streams(keys, np.zeros(40))
    jkeys = jrandom.split(jrandom.PRNGKey(5), 40)
    want = [np.asarray(jrandom.bits(jkeys[i], (40,), jnp.uint32))[i] for i in range(40)]
    np.testing.assert_array_equal(r["bits"], want)


@hawk.kernel
def draws_all(key: Key, p: Scalar, lam: Scalar, a: Scalar):
    ks = hm.random.split(key, 8)
    return (hm.random.normal(ks[0]), hm.random.normal(ks[1], dtype=np.float32), hm.random.exponential(ks[2]),
            hm.random.bernoulli(ks[3], p), hm.random.randint(ks[4], -3, 11), hm.random.poisson(ks[5], lam),
            hm.random.gamma(ks[6], a), hm.random.uniform(ks[7], -2.0, 5.0))


def _draws_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return (hawk.random.key(seed), rng.uniform(0, 1, n), rng.uniform(0.1, 40, n), rng.uniform(0.2, 6, n))


@hawk.kernel
def draws_cheap(key: Key, p: Scalar, lam: Scalar, a: Scalar):
    ks = hm.random.split(key, 5)
    return (hm.random.normal(ks[0]), hm.random.normal(ks[1], dtype=np.float32), hm.random.exponential(ks[2]),
            hm.random.bernoulli(ks[3], p), hm.random.randint(ks[4], -3, 11))


@pytest.mark.parametrize("kern", [draws_cheap, pytest.param(draws_all, marks=pytest.mark.slow)],
                         ids=["cheap", "all"])
def test_numpy_and_jax_backends_agree(kern):
    """Integer words and uniforms bit for bit; draws through log/cos to the last ulps, discrete ones
    except where a last-ulp difference flips a comparison (rare)."""
    ins = _draws_inputs(3000)
    a = kern(*ins)
    b = kern(*[jnp.asarray(v) for v in ins])
    for j, (x, y) in enumerate(zip(a, b)):
        y = np.asarray(y)
        assert x.dtype == y.dtype, j
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=1e-5 if x.dtype == np.float32 else 1e-12, atol=1e-12)
        else:
            assert np.mean(x == y) > 0.998, j


def test_normal_is_box_muller_of_the_cipher_words():
    """An oracle from jax's threefry and plain NumPy: z = sqrt(-2 log(1 - u1)) cos(2 pi u2), u1 and
    u2 from 52 bits of the words at counters (0, i) and (1, i)."""
    n = 1000
    k = hawk.random.key(11)

    @hawk.kernel
    def nrm(key: Key, x: Scalar):
        return hm.random.normal(key, x, 3.0)

    loc = np.linspace(-1, 1, n)
    got = nrm(k, loc)
    idx = np.arange(n, dtype=U32)

    def unit(c):
        w0, w1 = (np.asarray(w, np.float64) for w in jax_threefry(k[:, 0], (np.full(n, c, U32), idx)))
        return (w0 * 2.0 ** 20 + np.floor(w1 / 4096)) * 2.0 ** -52
    z = np.sqrt(-2 * np.log(1 - unit(0))) * np.cos(2 * np.pi * unit(1))
    np.testing.assert_allclose(got, loc + 3.0 * z, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# independence of n, chunks and threads

def test_a_sample_does_not_depend_on_n_or_chunking(monkeypatch):
    big = _draws_inputs(20_000, seed=3)
    full = draws_all(*big)
    for n in (1, 7, 1000):
        part = draws_all(big[0], *(v[:n] for v in big[1:]))
        for x, y in zip(part, full):
            np.testing.assert_array_equal(x, y[..., :n])
    spec = draws_all.specialize(draws_all.layout_of(list(big))[0])
    outs_avals = [a.aval for a in spec.prog.outputs]
    for chunk, threads in ((1000, 1), (4096, 2)):
        monkeypatch.setattr(np_emit, "THREADS", threads)
        monkeypatch.setattr(np_emit, "PARALLEL_MIN", 2048)
        k = NumpyKernel(spec.prog, [True] * len(outs_avals), chunk=chunk)
        outs = [np.empty(a.shape + (20_000,), a.dtype) for a in outs_avals]
        k(list(big), outs, 20_000)
        for x, y in zip(outs, full):
            np.testing.assert_array_equal(x, y)


def test_property_prefix_and_seed_sweep():
    """A seeded sweep: for random seeds and sizes, sample i's bits are jax.random.bits(key, (n,))[i]
    and do not change with n."""
    rng = np.random.default_rng(7)
    for _ in range(3):
        seed = int(rng.integers(0, 2 ** 62))
        n = int(rng.integers(1, 3000))
        k = hawk.random.key(seed)
        r = streams(k, np.zeros(n))["bits"]
        np.testing.assert_array_equal(r, np.asarray(jrandom.bits(jrandom.PRNGKey(seed), (n,), jnp.uint32)))
        m = int(rng.integers(1, n + 1))
        np.testing.assert_array_equal(streams(k, np.zeros(m))["bits"], r[:m])


# ---------------------------------------------------------------------------------------------
# statistics (fixed seeds)

@hawk.kernel
def draws_fast(key: Key, x: Scalar):
    ks = hm.random.split(key, 5)
    return (hm.random.normal(ks[0]), hm.random.normal(ks[1], dtype=np.float32), hm.random.uniform(ks[2]),
            hm.random.exponential(ks[3], 2.0), hm.random.randint(ks[4], 0, 10))


@pytest.mark.parametrize("n", [100_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
def test_statistics(n):
    z64, z32, u, e, r = draws_fast(hawk.random.key(2024), np.zeros(n))
    for z in (z64, z32.astype(np.float64)):
        assert abs(z.mean()) < 5 / math.sqrt(n) and abs(z.var() - 1) < 5 * math.sqrt(2 / n)
        assert abs(stats.skew(z)) < 0.02 and abs(stats.kurtosis(z)) < 0.04
        assert stats.kstest(z, "norm").pvalue > 1e-3
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert stats.kstest(e, "expon", args=(0, 0.5)).pvalue > 1e-3
    counts = np.bincount(r, minlength=10)
    assert r.min() == 0 and r.max() == 9 and stats.chisquare(counts).pvalue > 1e-3
    assert abs(np.corrcoef(z64[:-1], z64[1:])[0, 1]) < 5 / math.sqrt(n)       # neighbours independent
    assert abs(np.corrcoef(z64, u)[0, 1]) < 5 / math.sqrt(n)                 # split keys independent


@hawk.kernel
def draws_discrete(key: Key, p: Param, lam: Param, a: Param):
    ks = hm.random.split(key, 3)
    return hm.random.bernoulli(ks[0], p), hm.random.poisson(ks[1], lam), hm.random.gamma(ks[2], a)


@pytest.mark.parametrize("lam,a,n", [(0.7, 0.4, 20_000)] + [pytest.param(lam, a, 1_000_000, marks=pytest.mark.slow)
                                      for lam, a in [(0.7, 0.4), (4.0, 1.0), (25.0, 3.5), (300.0, 40.0)]])
def test_statistics_of_bernoulli_poisson_gamma(lam, a, n):
    k = hawk.random.key(int(lam * 10) + n)
    b, c, g = draws_discrete(np.broadcast_to(k, (2, n)).copy(), 0.3, lam, a)
    assert abs(b.mean() - 0.3) < 5 * math.sqrt(0.21 / n)
    assert abs(c.mean() - lam) < 5 * math.sqrt(lam / n) and abs(c.var() / lam - 1) < 0.03
    top = int(lam + 8 * math.sqrt(lam) + 10)
    observed = np.bincount(np.minimum(c, top), minlength=top + 1)
    expected = stats.poisson.pmf(np.arange(top + 1), lam) * n
    expected[-1] += stats.poisson.sf(top, lam) * n
    keep = expected > 20
    obs, exp = observed[keep], expected[keep]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4
    assert stats.kstest(g, "gamma", args=(a,)).pvalue > 1e-3


# ---------------------------------------------------------------------------------------------
# derivatives

@hawk.kernel
def reparam(key: Key, loc: Scalar, scale: Scalar, lo: Scalar, hi: Scalar, rate: Scalar):
    ks = hm.random.split(key, 3)
    return hm.random.normal(ks[0], loc, scale) + hm.random.uniform(ks[1], lo, hi) + hm.random.exponential(ks[2], rate)


def test_reparameterised_derivatives_against_finite_differences_and_closed_forms():
    n = 64
    rng = np.random.default_rng(4)
    k = hawk.random.key(9)
    args = [rng.uniform(-1, 1, n), rng.uniform(0.5, 2, n), rng.uniform(-2, -1, n), rng.uniform(1, 2, n),
            rng.uniform(0.5, 3, n)]
    names = ["loc", "scale", "lo", "hi", "rate"]
    g = hd.vjp(reparam, names)(k, *args, cotangent=np.ones(n))
    np.testing.assert_array_equal(g["loc"], 1.0)
    # closed forms: d/dscale = z, d/dlo = 1 - u, d/dhi = u, d/drate = -e / rate, with z, u, e the
    # standard draws of the same keys (normal at loc 0 scale 1, ...)
    zero, one = np.zeros(n), np.ones(n)
    z = reparam(k, zero, one, zero, zero, np.full(n, np.inf))
    u = reparam(k, zero, zero, zero, one, np.full(n, np.inf))
    e = reparam(k, zero, zero, zero, zero, one)
    np.testing.assert_allclose(g["scale"], z, rtol=1e-12)
    np.testing.assert_allclose(g["hi"], u, rtol=1e-12)
    np.testing.assert_allclose(g["lo"], 1 - u, rtol=1e-12)
    np.testing.assert_allclose(g["rate"], -e / args[4] ** 2, rtol=1e-12)
    for j, name in enumerate(names):
        h = 1e-6 * max(1.0, float(np.max(np.abs(args[j]))))
        up = [a + h if i == j else a for i, a in enumerate(args)]
        dn = [a - h if i == j else a for i, a in enumerate(args)]
        fd = (reparam(k, *up) - reparam(k, *dn)) / (2 * h)
        np.testing.assert_allclose(g[name], fd, rtol=1e-6, atol=1e-7, err_msg=name)
    t = {nm: rng.normal(size=n) for nm in names}
    _, (tan,) = hd.jvp(reparam, names)(k, *args, tangents=t)
    np.testing.assert_allclose(tan, sum(g[nm] * t[nm] for nm in names), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("which,line", [("bernoulli", "hm.random.bernoulli(key, p)"),
                                        ("poisson", "hm.random.poisson(key, p * 10.0)"),
                                        ("randint", "hm.random.randint(key, p, p + 4.0)")])
def test_discrete_draws_refuse_derivatives(which, line):
    @hawk.kernel
    def b(key: Key, p: Scalar):
        return hm.float64(hm.random.bernoulli(key, p)) * p

    @hawk.kernel
    def po(key: Key, p: Scalar):
        return hm.float64(hm.random.poisson(key, p * 10.0))

    @hawk.kernel
    def ri(key: Key, p: Scalar):
        return hm.float64(hm.random.randint(key, p, p + 4.0))

    kern = {"bernoulli": b, "poisson": po, "randint": ri}[which]
    k, p = hawk.random.key(1), np.full(8, 0.4)
    kern(k, p)                                           # runs without derivatives
    for call in (lambda: hd.vjp(kern, "p")(k, p, cotangent=np.ones(8)),
                 lambda: hd.jvp(kern, "p")(k, p, tangents={"p": np.ones(8)})):
        with pytest.raises(TypeError) as info:
            call()
        msg = str(info.value)
        assert f"hawk.random.{which}" in msg and "no derivative" in msg and line in msg and "stop_gradient" in msg

    @hawk.kernel
    def frozen(key: Key, p: Scalar):
        return hm.float64(hm.random.bernoulli(key, hm.stop_gradient(p))) * p
    g = hd.vjp(frozen, "p")(k, p, cotangent=np.ones(8))["p"]
    np.testing.assert_array_equal(g, frozen(k, p) / p)


# ---------------------------------------------------------------------------------------------
# a device loop: fresh numbers each turn, the same run on replay

@hawk.kernel
def walk_step(x: Mutable[Scalar], key: Key, turn: UInt32):
    x = x + hm.random.normal(hm.random.fold_in(key, turn))


def test_device_loop_folds_the_turn_and_replays():
    import eagle_fx as eagle

    @eagle.Graph.builder
    def walk(x, key, n):
        g = eagle.Graph()
        for i in range(n):
            walk_step(x, key, i)
        g.result = x
        return g

    x, key, turns = np.zeros(500), hawk.random.key(3), np.array([6], U32)
    g = walk(x, key, turns)
    first = np.array(g())
    x[:] = 0.0
    again = np.array(g())
    np.testing.assert_array_equal(first, again)
    # the oracle: JAX's fold_in keys, and the draws of one kernel call per turn
    want = np.zeros(500)
    for t in range(6):
        kt = np.asarray(jrandom.fold_in(jrandom.PRNGKey(3), t), U32)[:, None]

        @hawk.kernel
        def one(key: Key, x: Scalar):
            return hm.random.normal(key) + 0.0 * x
        want = want + one(kt, want)
    np.testing.assert_allclose(first, want, rtol=1e-13, atol=1e-13)
    assert np.std(first) > 1.5                           # six independent normals: variance 6


# ---------------------------------------------------------------------------------------------
# bad keys

@hawk.kernel
def writes(key: Key, y: Mutable[Scalar]):
    y = hm.random.uniform(key)


def test_bad_keys_are_refused_and_nothing_is_written():
    y = np.full(4, 7.0)
    with pytest.raises(TypeError, match=r"argument 'key' \(Key\) has dtype int64; it needs dtype uint32"):
        writes(np.zeros((2, 4), np.int64), y)
    with pytest.raises(ValueError, match=r"argument 'key' \(Key\) has shape \(3, 4\); it needs a plane of shape \(2, n\)"):
        writes(np.zeros((3, 4), U32), y)
    with pytest.raises(TypeError, match=r"dtype float64; it needs dtype uint32"):
        writes(np.zeros((2, 1)), y)
    np.testing.assert_array_equal(y, 7.0)

    @hawk.kernel
    def wrong(x: Scalar, y: Mutable[Scalar]):
        y = hm.random.normal(x)
    with pytest.raises(TypeError) as info:
        wrong(np.zeros(4), y)
    msg = str(info.value)
    assert "hawk.kernel wrong" in msg and "y = hm.random.normal(x)" in msg and "two uint32 words" in msg
    np.testing.assert_array_equal(y, 7.0)
    with pytest.raises(TypeError, match="inside a kernel body"):
        hm.random.uniform(hawk.random.key(0))
    with pytest.raises(TypeError, match="no sample outside a kernel body"):
        hm.sample_index()
    with pytest.raises(TypeError, match="shape"):
        hawk.random.split(np.zeros(3, U32))
    with pytest.raises(TypeError, match="seed is an integer"):
        hawk.random.key(1.5)


def test_the_random_page_runs(tmp_path):
    """docs/random.md: its code (the option price and delta against Black-Scholes, the device loop)
    runs and its asserts hold."""
    import pathlib
    import re
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "random.md").read_text(), re.S)
    script = tmp_path / "random_page.py"
    script.write_text("\n".join(blocks))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Black-Scholes" in run.stdout


from hypothesis import given, settings, strategies as st  # noqa: E402

WORD = st.integers(0, 2 ** 32 - 1)


@settings(max_examples=40, deadline=None)
@given(st.tuples(WORD, WORD), st.tuples(WORD, WORD))
def test_property_the_cipher_is_jax_threefry(key, ctr):
    """For any key and counter words, the host cipher and the NumPy emitter give jax's words."""
    want = np.array(jax_threefry(key, (np.array([ctr[0]], U32), np.array([ctr[1]], U32))), U32)
    y = threefry2x32(*key, *ctr)
    np.testing.assert_array_equal(np.array(y, U32).reshape(2, 1), want)
    np.testing.assert_array_equal(cipher(np.array(key, U32).reshape(2, 1), np.array(ctr, U32).reshape(2, 1)), want)


@hawk.kernel
def advance(key: Mutable[Key], x: Mutable[Scalar]):
    k1, k2 = hm.random.split(key)
    x = x + hm.random.normal(k2)
    key = k1


def test_a_mutable_key_plane_advances_in_place():
    keys = hawk.random.sample_keys(hawk.random.key(0), 6)
    before, x = keys.copy(), np.zeros(6)
    advance(keys, x)
    want = np.stack([np.asarray(jrandom.split(jnp.asarray(before[:, i]))[0]) for i in range(6)], axis=1)
    np.testing.assert_array_equal(keys, want)
    assert np.all(x != 0.0)


def test_a_jax_graph_draws_the_jax_random_stream():
    import eagle_fx as eagle

    @hawk.kernel
    def step(x: Mutable[Scalar], key: Key):
        x = x + hm.random.uniform(key)

    @eagle.Graph.builder
    def run(x, key):
        g = eagle.Graph(backend="jax")
        step(x, key)
        g.result = x
        return g
    r = np.asarray(run(np.zeros(5), hawk.random.key(2))())
    np.testing.assert_array_equal(r, np.asarray(jrandom.uniform(jrandom.PRNGKey(2), (5,), jnp.float64)))


K4 = hawk.random.key(4)


@hawk.kernel
def const_key(x: Scalar):
    k1, k2 = hm.random.split(K4)
    return hm.random.uniform(K4) + 0.0 * x, hm.random.bits(k2), hm.random.fold_in(K4, 3)


def test_a_constant_key_in_the_body():
    jk = jrandom.PRNGKey(4)
    for backend in (np.asarray, jnp.asarray):
        u, b, fk = (np.asarray(r) for r in const_key(backend(np.zeros(6))))
        np.testing.assert_array_equal(u, np.asarray(jrandom.uniform(jk, (6,), jnp.float64)))
        np.testing.assert_array_equal(b, np.asarray(jrandom.bits(jrandom.split(jk)[1], (6,), jnp.uint32)))
        np.testing.assert_array_equal(fk, np.broadcast_to(np.asarray(jrandom.fold_in(jk, 3))[:, None], (2, 6)))


@hawk.kernel
def gamma_draw(key: Key, a: Scalar):
    return hm.random.gamma(key, a)


def _gamma_oracle(x, a):
    """dx/da = -(dF/da) / f from scipy's regularised incomplete gamma, dF/da by central differences
    with a Richardson step (an oracle that shares nothing with the kernel's quadrature)."""
    from scipy import special

    def d(h):
        return (special.gammainc(a + h, x) - special.gammainc(a - h, x)) / (2 * h)
    h = 1e-3 * a
    return -((4 * d(h / 2) - d(h)) / 3) / stats.gamma.pdf(x, a)


def test_gamma_derivative_is_implicit_reparameterisation():
    n = 300
    rng = np.random.default_rng(12)
    a = np.exp(rng.uniform(np.log(0.02), np.log(5e3), n))           # small shapes (the boost) to large
    keys = hawk.random.sample_keys(hawk.random.key(8), n)
    x = gamma_draw(keys, a)
    g = hd.vjp(gamma_draw, "a")(keys, a, cotangent=np.ones(n))["a"]
    np.testing.assert_allclose(g, _gamma_oracle(x, a), rtol=2e-6)
    _, (t,) = hd.jvp(gamma_draw, "a")(keys, a, tangents={"a": np.full(n, 0.5)})
    np.testing.assert_allclose(t, 0.5 * g, rtol=1e-12)
    np.testing.assert_array_equal(gamma_draw(keys, a), x)            # the value is the draw itself


def test_gamma_derivative_has_mean_one():
    """E[dx/da] = d E[x] / da = 1 for Gamma(a, 1): a statistical check of the derivative."""
    n = 50_000
    keys = hawk.random.sample_keys(hawk.random.key(5), n)
    for a in (0.3, 2.5, 40.0):
        g = hd.vjp(gamma_draw, "a")(keys, np.full(n, a), cotangent=np.ones(n))["a"]
        assert abs(g.mean() - 1.0) < 5 * g.std() / math.sqrt(n)


@pytest.mark.slow
def test_jax_grad_through_a_gamma_draw():
    """jax.grad of a kernel called on jax.Arrays: the gamma's implicit derivative, as the NumPy
    derivative computes it and as the scipy oracle says."""
    n = 40
    a = np.linspace(0.3, 30.0, n)
    keys = hawk.random.sample_keys(hawk.random.key(1), n)
    want = hd.vjp(gamma_draw, "a")(keys, a, cotangent=np.ones(n))["a"]
    got = jax.grad(lambda aa: jnp.sum(gamma_draw(jnp.asarray(keys), aa)))(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got), _gamma_oracle(gamma_draw(keys, a), a), rtol=2e-6)


def test_jax_grad_through_a_kernel_draw():
    """jax.grad of a kernel called on jax.Arrays: the normal's pathwise derivative, and the refusal
    through bernoulli's p."""
    n = 40
    keys = hawk.random.sample_keys(hawk.random.key(1), n)

    @hawk.kernel
    def nrm(key: Key, loc: Scalar, scale: Scalar):
        return hm.random.normal(key, loc, scale)
    z = nrm(keys, np.zeros(n), np.ones(n))
    g = jax.grad(lambda s: jnp.sum(nrm(jnp.asarray(keys), jnp.zeros(n), s)))(jnp.full(n, 2.0))
    np.testing.assert_allclose(np.asarray(g), z, rtol=1e-12)

    @hawk.kernel
    def b(key: Key, p: Scalar):
        return hm.float64(hm.random.bernoulli(key, p)) * p
    with pytest.raises(TypeError, match="hawk.random.bernoulli: its result is discrete"):
        jax.grad(lambda p: jnp.sum(b(jnp.asarray(keys), p)))(jnp.full(n, 0.4))


@pytest.mark.slow
def test_every_draw_and_the_gamma_derivative_compile_with_nvrtc(nvrtc):
    from hawk_fx.emit import cuda
    ins = _draws_inputs(8)
    spec = draws_all.specialize(draws_all.layout_of(list(ins))[0])
    cuda.compile_ptx(cuda.emit_specialization(spec).source)
    keys, a = hawk.random.sample_keys(hawk.random.key(1), 8), np.linspace(0.5, 3.0, 8)
    gspec = gamma_draw.specialize(gamma_draw.layout_of([keys, a])[0])
    back = hd.vjp_program(gspec.prog, [False, True])
    src = cuda.emit_kernel(back, "gamma_vjp", [a.aval.kind == "sample" for a in back.outputs])
    cuda.compile_ptx(src)
