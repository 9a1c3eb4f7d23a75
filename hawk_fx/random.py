"""hawk_fx.random (also `hawk_fx.math.random`, `hm.random`): counter-based random numbers per sample.

A key is two uint32 words (the `Key` role: a (2, n) plane of per-sample keys or one (2, 1) key for
all samples). A draw is a pure function of (key, sample index, counter): Threefry-2x32-20, the block
cipher of Random123 and of jax.random, applied to the key and the counter words (c, i), where i is
the sample's index in the call and c a small constant of the draw. So

  * the numbers of sample i depend on its key and on i only: not on n, on chunking, on threads, or
    on the backend (NumPy, JAX and CUDA compute the same words, bit for bit);
  * the same key gives the same numbers (as in JAX): to draw several, split the key or fold a
    counter (a loop's turn) into it, `k1, k2 = hm.random.split(key)`, `hm.random.fold_in(key, t)`.

With a one-cell key, sample i's 32 random bits are `jax.random.bits(key, (n,))[i]` (JAX's default
partitionable Threefry), its float32 `uniform` is `jax.random.uniform(key, (n,), jnp.float32)[i]`,
and `split`/`fold_in` give JAX's keys. `normal`, `exponential`, `randint`, `poisson` and `gamma` use
their own transforms (Box-Muller; inversion; rejection with a fixed number of tries), so their
streams differ from jax.random's: JAX's normal needs erfinv, whose last bits differ between
backends, where these use functions every backend computes to the same bits on the same words...
up to each backend's last-ulp math (log, cos), which is why bit equality is promised for the
words and the uniforms, and closeness for the rest.

Derivatives: `uniform` (minval, maxval), `normal` (loc, scale), `exponential` (rate) are
reparameterised (the draw is a differentiable function of its parameters and the fixed bits);
`gamma` by implicit reparameterisation (dx/da = -(dF/da) / f at the drawn x, F its CDF).
`bernoulli`, `poisson` and `randint` are discrete: a derivative through their parameters is refused.
"""
from __future__ import annotations

import math as _math

import numpy as np

from . import math as hm
from .context import CONTEXT
from .core import Tracer, literal_aval
from .prims import P
from .rng_prims import implicit_gamma_p, nondiff_p, sample_index_p, threefry2x32, threefry_p

__all__ = ["key", "sample_keys", "split", "fold_in", "bits", "uniform", "normal", "exponential", "bernoulli",
           "randint", "poisson", "gamma", "sample_index", "n_samples"]

U32 = np.dtype(np.uint32)
_MASK = (1 << 64) - 1


# ---------------------------------------------------------------------------------------------
# keys on the host

def key(seed: int) -> np.ndarray:
    """A one-cell key (2, 1) uint32 from an integer seed: the words of jax.random.PRNGKey(seed)
    (the seed's high and low 32 bits; a negative seed in two's complement)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"hawk_fx.random.key: the seed is an integer, got {type(seed).__name__} {seed!r}")
    s = int(seed) & _MASK
    return np.array([[s >> 32], [s & 0xFFFFFFFF]], U32)


def _host_key(k, api) -> np.ndarray:
    a = np.asarray(k)
    if a.dtype != U32 or a.ndim not in (1, 2) or a.shape[0] != 2:
        raise TypeError(f"{api}: a key is a uint32 array of shape (2,), (2, 1) or a plane (2, n), got "
                        f"shape {a.shape} and dtype {a.dtype}; make one with hawk_fx.random.key(seed)")
    return a


def sample_keys(k, n: int) -> np.ndarray:
    """A (2, n) plane of per-sample keys from one key: key i is split(k, n)[i] (jax.random.split(k, n)[i])."""
    k = _host_key(k, "hawk_fx.random.sample_keys")
    if k.ndim == 2 and k.shape[1] != 1:
        raise ValueError(f"hawk_fx.random.sample_keys: needs one key, (2,) or (2, 1), got a plane {k.shape}")
    k = k.reshape(2)
    y0, y1 = threefry2x32(k[0], k[1], np.zeros(n, U32), np.arange(n, dtype=U32))
    return np.stack([y0, y1])


# ---------------------------------------------------------------------------------------------
# keys anywhere: in a kernel body (traced) or on host arrays

def _kernel_trace():
    return CONTEXT.innermost("kernel_traces")


def _aval(x):
    return x.aval if isinstance(x, Tracer) else literal_aval(x)


def _as_key(k, api):
    """A key operand: a traced (2,) uint32 value, or a constant key as a (2,) uint32 array."""
    if isinstance(k, Tracer):
        a = k.aval
        if a.shape != (2,) or a.dtype != U32:
            raise TypeError(f"{api}: the key must be two uint32 words per sample (a `Key` parameter, or a key "
                            f"from hm.random.split/fold_in), got a value of per-sample shape {a.shape} and dtype "
                            f"{a.dtype}")
        return k
    a = np.asarray(k)
    if a.dtype != U32 or a.shape not in ((2,), (2, 1)):
        raise TypeError(f"{api}: the key must be two uint32 words (a `Key` parameter, or "
                        f"hawk_fx.random.key(seed)), got shape {a.shape} and dtype {a.dtype}")
    return a.reshape(2).copy()


def _words(k, c, i, api, xor=False):
    """Threefry of key k and counter (c, i): traced when either is, else computed now."""
    ctr = P["stack"].bind(np.uint32(c), i) if isinstance(i, Tracer) else np.array([c, i], U32)
    k = _as_key(k, api)
    if not isinstance(k, Tracer) and not isinstance(ctr, Tracer):
        y0, y1 = threefry2x32(k[0], k[1], ctr[0], ctr[1])      # a constant key and counter: now
        if xor:
            return U32.type(y0 ^ y1)
        trace = _kernel_trace()                                 # in a body: a value of it, as vec makes
        words = [U32.type(y0), U32.type(y1)]
        return trace.process(P["stack"], words, {})[0] if trace is not None else np.array(words, U32)
    return threefry_p.bind(k, ctr, xor=xor)


def split(k, num: int = 2):
    """`num` new keys from `k` (a tuple), as jax.random.split: key j is Threefry(k, (0, j)).
    In a kernel body, of a traced key; on the host, of a key array ((2,), (2, 1) or a (2, n) plane)."""
    if not isinstance(num, (int, np.integer)) or isinstance(num, bool) or num < 1:
        raise ValueError(f"hawk.random.split: num is a positive Python int, got {num!r}")
    if not isinstance(k, Tracer) and _kernel_trace() is None:
        k = _host_key(k, "hawk_fx.random.split")
        return tuple(np.stack(threefry2x32(k[0], k[1], np.uint32(0), np.uint32(j))) for j in range(int(num)))
    return tuple(_words(k, 0, int(j), "hawk.random.split") for j in range(int(num)))


def fold_in(k, data):
    """A new key from `k` and a uint32 `data` (a loop's turn, a stream number), as
    jax.random.fold_in: Threefry(k, (0, data)). `data` may be traced (a UInt32 parameter)."""
    if isinstance(data, Tracer):
        if data.aval.dtype.kind not in "iu":
            raise TypeError(f"hawk.random.fold_in: data is an integer (a turn or stream number), got dtype "
                            f"{data.aval.dtype}")
        d = data if data.aval.dtype == U32 else hm.uint32(data)
        return threefry_p.bind(_as_key(k, "hawk.random.fold_in"), P["stack"].bind(np.uint32(0), d), xor=False)
    if isinstance(data, (bool, np.bool_)) or not isinstance(data, (int, np.integer)):
        raise TypeError(f"hawk.random.fold_in: data is an integer, got {type(data).__name__} {data!r}")
    data = int(data) & 0xFFFFFFFF
    if not isinstance(k, Tracer) and _kernel_trace() is None:
        k = _host_key(k, "hawk_fx.random.fold_in")
        return np.stack(threefry2x32(k[0], k[1], np.uint32(0), np.uint32(data)))
    return _words(k, 0, data, "hawk.random.fold_in")


# ---------------------------------------------------------------------------------------------
# draws (in a kernel body only: they need the sample index)

def sample_index():
    """The index of this sample in the call (uint32: 0, 1, ..., n - 1), inside a kernel body."""
    trace = _kernel_trace()
    if trace is None:
        raise TypeError("hawk.math.sample_index: there is no sample outside a kernel body; call it inside a "
                        "@hawk.kernel function")
    index = getattr(trace, "_hawk_sample_index", None)       # one per body: draws share it
    if index is None:
        index = trace._hawk_sample_index = trace.process(sample_index_p, [], {})[0]
    return index


def n_samples():
    """The number of samples n of the call, as a Python number in the body (float64 when it meets
    arrays: `(i + 0.5) / n`), inside a kernel body. One value for all samples."""
    trace = _kernel_trace()
    if trace is None:
        raise TypeError("hawk.math.n_samples: there are no samples outside a kernel body; call it inside a "
                        "@hawk.kernel function")
    return trace.process(P["sample_count"], [0.0], {})[0]


def _draw(k, c, api, xor=False):
    if _kernel_trace() is None:
        raise TypeError(f"{api}: draws are per sample, so they are made inside a kernel body (@hawk.kernel); on "
                        "the host, call a kernel that draws, or use hawk_fx.random.sample_keys for per-sample keys")
    return _words(k, c, sample_index(), api, xor)


def bits(k):
    """32 random bits (uint32) per sample: jax.random.bits(k, (n,))[i] for a one-cell key k."""
    return _draw(k, 0, "hawk.random.bits", xor=True)


def _float_dtype(dtype, api):
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"{api}: dtype is float32 or float64, got {dt}")
    return dt


def _unit(k, dt, api, c=0):
    """A uniform number in [0, 1) of dtype dt from the bits of counter c: float32 from 23 bits of
    the 32 (JAX's), float64 from 52 bits of the 64 (word 0 high, word 1 low, as JAX's)."""
    if dt == np.float32:
        w = _draw(k, c, api, xor=True)
        return hm.float32(w // 512) * 2.0 ** -23          # exact: (bits >> 9) / 2**23
    y = _draw(k, c, api)
    return (hm.float64(y[0]) * 2.0 ** 20 + hm.float64(y[1] // 4096)) * 2.0 ** -52


def _is(x, v):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == v


def uniform(k, minval=0.0, maxval=1.0, dtype=np.float64):
    """Uniform on [minval, maxval) per sample; differentiable in minval and maxval (x = min + u (max - min))."""
    dt = _float_dtype(dtype, "hawk.random.uniform")
    u = _unit(k, dt, "hawk.random.uniform")
    if _is(minval, 0) and _is(maxval, 1):
        return u
    return hm.maximum(minval, u * (maxval - minval) + minval)


def normal(k, loc=0.0, scale=1.0, dtype=np.float64):
    """Normal(loc, scale) per sample, by Box-Muller from two independent uniforms; differentiable in
    loc and scale (x = loc + scale z). float32 draws reach |z| <= 5.6, float64 |z| <= 8.5."""
    dt = _float_dtype(dtype, "hawk.random.normal")
    api = "hawk.random.normal"
    if dt == np.float32:
        y = _draw(k, 0, api)
        u1 = 1.0 - hm.float32(y[0] // 512) * 2.0 ** -23      # (0, 1]: log is finite
        u2 = hm.float32(y[1] // 512) * 2.0 ** -23
    else:
        u1 = 1.0 - _unit(k, dt, api, 0)
        u2 = _unit(k, dt, api, 1)
    z = hm.sqrt(-2.0 * hm.log(u1)) * hm.cos((2 * _math.pi) * u2)
    if _is(loc, 0) and _is(scale, 1):
        return z
    return z * scale + loc


def exponential(k, rate=1.0, dtype=np.float64):
    """Exponential with this rate per sample (mean 1 / rate), by inversion -log(1 - u) / rate;
    differentiable in rate."""
    dt = _float_dtype(dtype, "hawk.random.exponential")
    e = -hm.log(1.0 - _unit(k, dt, "hawk.random.exponential"))
    return e if _is(rate, 1) else e / rate


def _mark(x, api, why=None):
    """x as a parameter differentiation refuses (a traced x; numbers need no mark)."""
    return nondiff_p.bind(x, api=api, why=why) if isinstance(x, Tracer) else x


def bernoulli(k, p=0.5):
    """True with probability p per sample (u < p, u uniform in the dtype of p: float32 for a float32
    p, as jax.random.bernoulli). Not differentiable in p: a derivative through it is refused."""
    api = "hawk.random.bernoulli"
    dt = np.float32 if _aval(p).dtype == np.float32 else np.float64
    return _unit(k, np.dtype(dt), api) < _mark(p, api)


def randint(k, minval, maxval, dtype=np.int32):
    """An integer uniform on [minval, maxval) per sample (int32 by default), from 52 random bits:
    minval + floor(u (maxval - minval)), off uniform by at most (maxval - minval) / 2**52. Not
    differentiable in its bounds."""
    api = "hawk.random.randint"
    dt = np.dtype(dtype)
    if dt.kind not in "iu":
        raise TypeError(f"{api}: dtype is an integer dtype, got {dt}")
    lo, hi = hm.float64(_mark(minval, api)), hm.float64(_mark(maxval, api))
    u = _unit(k, np.dtype(np.float64), api)
    x = hm.minimum(lo + hm.floor(u * (hi - lo)), hi - 1.0)
    return P["convert"].bind(x, dtype=dt)


def poisson(k, lam, tries: int = 12):
    """A Poisson(lam) count per sample (int32). Below lam = 10 by inversion of the CDF (40 terms:
    exact to ~1e-16 in probability); above by Hormann's PTRS rejection with `tries` candidates
    (all rejected with probability < 0.15**tries; then the last candidate is kept). Not
    differentiable in lam."""
    api = "hawk.random.poisson"
    lam = hm.float64(_mark(lam, api))
    # small lam: count how many CDF terms u exceeds
    small = lam < 10.0
    ls = hm.where(small, lam, 1.0)
    u = _unit(k, np.dtype(np.float64), api, 0)
    p = hm.exp(-ls)
    cdf = p
    count = hm.where(u > cdf, 1.0, 0.0)
    for j in range(1, 40):
        p = p * ls / j
        cdf = cdf + p
        count = count + hm.where(u > cdf, 1.0, 0.0)
    # large lam: transformed rejection (PTRS), a fixed number of candidates, the first accepted kept
    lb = hm.where(small, 10.0, lam)
    slam = hm.sqrt(lb)
    loglam = hm.log(lb)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    vr = 0.9277 - 3.6224 / (b - 2)
    big = lb * 0.0
    done = lb < 0.0
    for t in range(tries):
        y = _draw(k, 1 + t, api)
        uu = hm.float64(y[0] // 2048) * 2.0 ** -21 - 0.5 + hm.float64(y[0] % 2048) * 2.0 ** -32   # [-0.5, 0.5)
        v = hm.float64(y[1]) * 2.0 ** -32 + 2.0 ** -33                                             # (0, 1)
        us = hm.maximum(0.5 - hm.abs(uu), 2.0 ** -33)          # > 0: every lane stays finite
        kk = hm.floor((2 * a / us + b) * uu + lb + 0.43)
        kp = hm.maximum(kk, 0.0)
        quick = (us >= 0.07) & (v <= vr)
        ok = quick | ((kk >= 0) & ~((us < 0.013) & (v > us)) &
                      (hm.log(v * inv_alpha / (a / (us * us) + b)) <= -lb + kp * loglam - _lgamma1p(kp)))
        take = ok & ~done if t < tries - 1 else ~done
        big = hm.where(take, kk, big)
        done = done | ok
    return hm.int32(hm.where(small, count, hm.maximum(big, 0.0)))


def _lgamma1p(x):
    """log(x!) = lgamma(x + 1) for x >= 0, by Stirling's series at x + 9 and the recurrence down:
    accurate to ~1e-13, enough for an acceptance test."""
    z = x + 9.0
    prod = (x + 1.0) * (x + 2.0) * (x + 3.0) * (x + 4.0) * (x + 5.0) * (x + 6.0) * (x + 7.0) * (x + 8.0)
    iz = 1.0 / z
    iz2 = iz * iz
    series = iz * (1 / 12 - iz2 * (1 / 360 - iz2 * (1 / 1260 - iz2 / 1680)))
    return (z - 0.5) * hm.log(z) - z + 0.5 * _math.log(2 * _math.pi) + series - hm.log(prod)


def gamma(k, a, dtype=np.float64, tries: int = 8):
    """Gamma(a, 1) per sample (multiply by a scale), a > 0, by Marsaglia and Tsang's method with
    `tries` candidates (all rejected with probability < 0.05**tries; then the last is kept), and
    a < 1 by the boost x u**(1/a). Differentiable in a by implicit reparameterisation:
    dx/da = -(dF/da)(x; a) / f(x; a), F the Gamma(a) CDF, at the drawn x."""
    api = "hawk.random.gamma"
    dt = _float_dtype(dtype, api)
    traced = isinstance(a, Tracer)
    a = hm.float64(a) if traced else float(a)
    a0 = hm.stop_gradient(a) if traced else a
    boost = a0 < 1.0
    ab = hm.where(boost, a0 + 1.0, a0)
    d = ab - 1.0 / 3.0
    c = 1.0 / hm.sqrt(9.0 * d)
    x, done = None, None
    for t in range(tries):
        z = normal(fold_in(k, 2 * t))
        u = _unit(fold_in(k, 2 * t + 1), np.dtype(np.float64), api)
        w = 1.0 + c * z
        v = w * w * w
        ok = (w > 0) & (hm.log(1.0 - u) < 0.5 * z * z + d - d * v + d * hm.log(hm.maximum(v, 1e-300)))
        cand = d * v
        if x is None:
            x, done = cand, ok
        else:
            x = hm.where((ok & ~done) if t < tries - 1 else ~done, cand, x)
            done = done | ok
    ub = _unit(fold_in(k, 2 * tries), np.dtype(np.float64), api)
    x = hm.where(boost, x * hm.exp(hm.log(1.0 - ub) / a0), x)
    if traced:
        x = implicit_gamma_p.bind(x, a)              # its derivative in a: implicit reparameterisation
    return hm.float32(x) if dt == np.float32 else x
