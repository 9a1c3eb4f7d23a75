"""The kernel primitives behind per-sample random numbers, with their rules on every backend.

    threefry2x32[xor] key counter   Threefry-2x32 with 20 rounds (Salmon et al., SC'11; the block
                                    cipher of Random123 and of jax.random): a (2,) uint32 key and a
                                    (2,) uint32 counter give two uint32 words, or with xor=True
                                    their exclusive or (one word, as jax.random.bits draws 32 bits)
    sample_index                    the index of the sample in the call, uint32 (per sample)
    nondiff[api why] x              x itself; marks a parameter (bernoulli's p, poisson's lam,
                                    randint's bounds) that differentiation refuses, naming `api`
                                    (and `why`, when the reason is not that the draw is discrete)
    implicit_gamma x a              x itself (a Gamma(a) draw), differentiated in a implicitly

The NumPy rule runs the rounds in place on uint32 arrays (a handful of scratch arrays per chunk);
JAX runs the same rounds in jax.numpy (XLA fuses them); CUDA calls `hawk_threefry2x32` from the
emitter's prelude. All three compute the same words, exactly.
"""
from __future__ import annotations

import numpy as np

from .caches import LRU
from .core import SAMPLE, AVal, abstract_eval, eager_impl
from .prims import _prim, broadcast_kind
from .emit import numpy as np_emit
from .emit.jax import jax_rules, _jnp
from .emit import cuda as cuda_emit
from . import diff

ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
PARITY = 0x1BD11BDA           # the key-schedule constant of Threefry's 32-bit words

threefry_p = _prim("threefry2x32")
sample_index_p = _prim("sample_index")
nondiff_p = _prim("nondiff")

U32 = np.dtype(np.uint32)


# ---------------------------------------------------------------------------------------------
# the cipher on NumPy arrays (the reference every backend matches)

def threefry2x32(k0, k1, x0, x1):
    """The two output words of Threefry-2x32-20 for keys (k0, k1) and counters (x0, x1), uint32
    arrays (or numbers) broadcast together. New arrays; the operands are not written."""
    k0, k1, x0, x1 = (np.asarray(a, U32) for a in (k0, k1, x0, x1))
    shape = np.broadcast_shapes(k0.shape, k1.shape, x0.shape, x1.shape)
    y0, y1, t = np.empty(shape, U32), np.empty(shape, U32), np.empty(shape, U32)
    _rounds(k0, k1, x0, x1, y0, y1, t)
    return y0, y1


def _rounds(k0, k1, x0, x1, y0, y1, t):
    """Threefry-2x32-20 into y0, y1 (t: scratch of their shape). In place, one ufunc per step."""
    ks2 = np.bitwise_xor(np.bitwise_xor(k0, k1), np.uint32(PARITY))
    ks = (k0, k1, ks2)
    np.add(x0, k0, out=y0)
    np.add(x1, k1, out=y1)
    for group in range(5):
        for r in ROTATIONS[4 * (group % 2): 4 * (group % 2) + 4]:
            np.add(y0, y1, out=y0)
            np.left_shift(y1, np.uint32(r), out=t)
            np.right_shift(y1, np.uint32(32 - r), out=y1)
            np.bitwise_or(y1, t, out=y1)
            np.bitwise_xor(y1, y0, out=y1)
        np.add(y0, ks[(group + 1) % 3], out=y0)
        np.add(y1, ks[(group + 2) % 3], out=y1)
        np.add(y1, np.uint32(group + 1), out=y1)


def _eager_threefry(key, ctr, *, xor):
    key, ctr = np.asarray(key, U32), np.asarray(ctr, U32)
    y0, y1 = threefry2x32(key[0], key[1], ctr[0], ctr[1])
    return [np.bitwise_xor(y0, y1) if xor else np.stack([y0, y1])]


# ---------------------------------------------------------------------------------------------
# abstract evaluation and eager values

@abstract_eval.register(threefry_p)
def _threefry_abstract(key, ctr, *, xor):
    for what, a in (("key", key), ("counter", ctr)):
        if a.shape != (2,) or a.dtype != U32:
            raise TypeError(f"hawk.random: the {what} of a draw is two uint32 words per sample (per-sample shape "
                            f"(2,), dtype uint32), got per-sample shape {a.shape} and dtype {a.dtype}")
    return [AVal(() if xor else (2,), U32, broadcast_kind(key, ctr))]


eager_impl[threefry_p] = _eager_threefry


@abstract_eval.register(sample_index_p)
def _sample_index_abstract():
    return [AVal((), U32, SAMPLE)]


def _no_eager_index():
    raise TypeError("hawk.math.sample_index: there is no sample outside a kernel body; call it inside "
                    "a @hawk.kernel function")


eager_impl[sample_index_p] = _no_eager_index


@abstract_eval.register(nondiff_p)
def _nondiff_abstract(x, *, api, why=None):
    return [x]


eager_impl[nondiff_p] = lambda x, *, api, why=None: [x]


# ---------------------------------------------------------------------------------------------
# NumPy emission

def _np_threefry(key, ctr, out, xor):
    """Threefry into `out` ((2, *m) words, or (*m) with xor), in this chunk's own scratch."""
    key, ctr = np.asarray(key), np.asarray(ctr)
    if xor:
        y1 = np.empty_like(out)
        t = np.empty_like(out)
        _rounds(key[0], key[1], ctr[0], ctr[1], out, y1, t)
        np.bitwise_xor(out, y1, out=out)
    else:
        _rounds(key[0], key[1], ctr[0], ctr[1], out[0], out[1], np.empty_like(out[0]))


@np_emit.numpy_emit.register(threefry_p)
def _threefry_np(ctx, out, ins, params):
    return [f"{ctx.const(_np_threefry, 'threefry')}({ins[0]}, {ins[1]}, {out}, {params['xor']})"]


def _np_sample_index(out, s0):
    """Sample indices s0, s0 + 1, ... along the last axis of `out` (a chunk starting at sample s0)."""
    m = out.shape[-1]
    np.copyto(out, np.arange(s0, s0 + m, dtype=U32))


@np_emit.numpy_emit.register(sample_index_p)
def _sample_index_np(ctx, out, ins, params):
    return [f"{ctx.const(_np_sample_index, 'sample_index')}({out}, s0)"]


@np_emit.numpy_emit.register(nondiff_p)
def _nondiff_np(ctx, out, ins, params):
    return [f"np.copyto({out}, {ins[0]})"]


np_emit.SAMPLE_SOURCES.add(sample_index_p)


# ---------------------------------------------------------------------------------------------
# JAX emission

def jax_threefry(k0, k1, x0, x1):
    """Threefry-2x32-20 in jax.numpy, the rounds of _rounds (jnp uint32 arithmetic wraps)."""
    jnp = _jnp()
    k0, k1, x0, x1 = (jnp.asarray(a, jnp.uint32) for a in (k0, k1, x0, x1))
    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(PARITY))
    y0, y1 = x0 + k0, x1 + k1
    for group in range(5):
        for r in ROTATIONS[4 * (group % 2): 4 * (group % 2) + 4]:
            y0 = y0 + y1
            y1 = (y1 << jnp.uint32(r)) | (y1 >> jnp.uint32(32 - r))
            y1 = y1 ^ y0
        y0 = y0 + ks[(group + 1) % 3]
        y1 = y1 + ks[(group + 2) % 3] + jnp.uint32(group + 1)
    return y0, y1


@jax_rules.register(threefry_p)
def _threefry_jax(ctx, aval, key, ctr, *, xor):
    jnp = _jnp()
    y0, y1 = jax_threefry(key[0], key[1], ctr[0], ctr[1])
    return (y0 ^ y1) if xor else jnp.stack(jnp.broadcast_arrays(y0, y1))


jax_rules[sample_index_p] = lambda ctx, aval: _jnp().arange(ctx.n, dtype=_jnp().uint32)
jax_rules[nondiff_p] = lambda ctx, aval, x, *, api, why=None: (
    x if isinstance(x, (bool, int, float)) else _jax_nondiff(api, why)(x))


# ---------------------------------------------------------------------------------------------
# CUDA emission (the device function is in the emitter's prelude)

def _threefry_cuda(em, e, vals):
    key, ctr = (v.broadcast((2,)).cast(U32) for v in vals)
    call = f"hawk_threefry2x32({key[0]}, {key[1]}, {ctr[0]}, {ctr[1]})"
    if e.params["xor"]:
        return [f"({call}.x ^ {call}.y)"]
    return [f"{call}.x", f"{call}.y"]


cuda_emit.CUDA_RULES[threefry_p] = _threefry_cuda
cuda_emit.CUDA_RULES[sample_index_p] = lambda em, e, vals: ["((unsigned int)hawk_i)"]
cuda_emit.CUDA_RULES[nondiff_p] = lambda em, e, vals: vals[0].cast(e.outputs[0].aval.dtype)


# ---------------------------------------------------------------------------------------------
# derivatives: random words are integers (no tangent); nondiff refuses before the rules run

diff.jvp_rules[threefry_p] = lambda primals, tangents, outs, **kw: [None]
diff.vjp_rules[threefry_p] = lambda cts, primals, outs, **kw: [None, None]
diff.jvp_rules[sample_index_p] = lambda primals, tangents, outs: [None]
diff.vjp_rules[sample_index_p] = lambda cts, primals, outs: []


def _nondiff_rule(*args, api, why=None):
    """Differentiation refuses the parameter of a discrete draw (refuse_nondiff raises first)."""
    raise TypeError(f"{api}: not differentiable with respect to its parameters")


diff.jvp_rules.refuse(nondiff_p)(_nondiff_rule)
diff.vjp_rules.refuse(nondiff_p)(_nondiff_rule)
diff.NONDIFF.add(nondiff_p)


# ---------------------------------------------------------------------------------------------
# implicit_gamma x a: x itself (a Gamma(a, 1) draw), with the derivative in a of implicit
# reparameterisation, dx/da = -(dF/da)(x; a) / f(x; a) (F, f: the Gamma(a, 1) CDF and density).
# dF/da = integral over t < x of f(t; a) (log t - digamma(a)) dt, taken in v = log t by
# Gauss-Legendre, where the integrand exp(a v - e^v - lgamma(a)) (v - digamma(a)) is smooth and
# log-concave: below the median from far in the left tail up to log x, above it as minus the
# integral from log x into the right tail (no cancellation in either tail).

implicit_gamma_p = _prim("implicit_gamma")
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(96)


@abstract_eval.register(implicit_gamma_p)
def _implicit_gamma_abstract(x, a):
    return [x]


eager_impl[implicit_gamma_p] = lambda x, a: [x]
np_emit.numpy_emit[implicit_gamma_p] = lambda ctx, out, ins, params: [f"np.copyto({out}, {ins[0]})"]


class _JnpMath:
    """The hawk.math names gamma_dx_da uses, as jax.numpy functions."""

    def __getattr__(self, name):
        jnp = _jnp()
        return {"where": jnp.where, "minimum": jnp.minimum, "maximum": jnp.maximum}.get(name) or getattr(jnp, name)


_jax_fns = LRU("random numbers' JAX functions", 64)


def _jax_implicit_gamma():
    """x itself, with JAX's derivative in a the implicit one (a jax.custom_jvp, made once)."""
    fn = _jax_fns.get("implicit_gamma")
    if fn is None:
        import jax

        @jax.custom_jvp
        def fn(x, a):
            return x

        @fn.defjvp
        def _jvp(primals, tangents):
            x, a = primals
            tx, ta = tangents
            return x, tx + gamma_dx_da(x, a, _JnpMath()) * ta
        _jax_fns["implicit_gamma"] = fn
    return fn


def _jax_nondiff(api, why):
    """x itself; a JAX derivative through it is refused, as in a kernel's own derivatives."""
    key = ("nondiff", api, why)
    fn = _jax_fns.get(key)
    if fn is None:
        import jax

        @jax.custom_jvp
        def fn(x):
            return x

        @fn.defjvp
        def _jvp(primals, tangents):
            reason = why or "its result is discrete, so it has no derivative with respect to its parameters"
            raise TypeError(f"{api}: {reason}, and this JAX derivative would pass through them. Wrap the "
                            "parameter in hm.stop_gradient(...) to treat it as a constant")
        _jax_fns[key] = fn
    return fn


jax_rules[implicit_gamma_p] = lambda ctx, aval, x, a: _jax_implicit_gamma()(x, a)
cuda_emit.CUDA_RULES[implicit_gamma_p] = lambda em, e, vals: vals[0].cast(e.outputs[0].aval.dtype)


def _digamma(a, hm):
    """digamma(a), a > 0: the recurrence up by 8, then the asymptotic series (error < 1e-12)."""
    shift = 0.0
    for j in range(8):
        shift = shift + 1.0 / (a + j)
    z = a + 8.0
    iz2 = 1.0 / (z * z)
    return hm.log(z) - 0.5 / z - iz2 * (1 / 12 - iz2 * (1 / 120 - iz2 * (1 / 252 - iz2 * (1 / 240 - iz2 / 132)))) - shift


def _lgamma(a, hm):
    """lgamma(a), a > 0: Stirling's series at a + 8 and the recurrence down (error ~1e-13)."""
    z = a + 8.0
    prod = a
    for j in range(1, 8):
        prod = prod * (a + j)
    iz = 1.0 / z
    iz2 = iz * iz
    series = iz * (1 / 12 - iz2 * (1 / 360 - iz2 * (1 / 1260 - iz2 / 1680)))
    return (z - 0.5) * hm.log(z) - z + 0.5 * np.log(2 * np.pi) + series - hm.log(prod)


def gamma_dx_da(x, a, hm=None):
    """dx/da of a Gamma(a, 1) draw x held at its quantile (implicit reparameterisation), in the
    functions of `hm`: hawk_fx.math (a kernel's derivative) or jax.numpy's (the JAX emitter)."""
    if hm is None:
        from . import math as hm
    lg, psi = _lgamma(a, hm), _digamma(a, hm)
    logx = hm.log(x)
    m = hm.log(a)                                   # the mode of the integrand in v = log t
    left = x < a
    lo = hm.minimum(logx, m) - 25.0 / a - 9.0 / hm.sqrt(a)     # the left tail to exp(-25)
    hi = hm.log(hm.maximum(x, a) + 40.0 + 12.0 * hm.sqrt(a))
    a0 = hm.where(left, lo, logx)                   # the interval of the integral taken
    b0 = hm.where(left, logx, hi)
    half, mid = 0.5 * (b0 - a0), 0.5 * (b0 + a0)
    total = 0.0 * x
    for node, weight in zip(_GL_NODES, _GL_WEIGHTS):
        v = mid + half * float(node)
        total = total + float(weight) * hm.exp(a * v - hm.exp(v) - lg) * (v - psi)
    dF = hm.where(left, 1.0, -1.0) * half * total
    logf = (a - 1.0) * logx - x - lg
    return -dF * hm.exp(-logf)


def _implicit_gamma_jvp(primals, tangents, outs):
    x, a = primals
    _, ta = tangents
    return [None if ta is None else gamma_dx_da(x, a) * ta]


def _implicit_gamma_vjp(cts, primals, outs):
    x, a = primals
    return [None, None if cts[0] is None else gamma_dx_da(x, a) * cts[0]]


diff.jvp_rules[implicit_gamma_p] = _implicit_gamma_jvp
diff.vjp_rules[implicit_gamma_p] = _implicit_gamma_vjp
