"""An outer transform over a tree of results of several inner transforms that read the same
argument: the parts are joined into one Program with one input per array, so the outer derivative
sums every part's contribution (it once kept only one part's cotangent for a shared argument).
Checked against JAX's nested transforms of the same math (x64)."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hk
import hawk_fx.math as hm
from hawk_fx import Param, Scalar

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


@hk.kernel
def wave(x: Scalar, a: Param) -> Scalar:
    return hk.sum(hm.sin(a * x) * x * x)


@ef.Graph.builder
def one(x, a):
    g = ef.Graph()
    g.result = wave(x, a)
    return g


def jone(x, a):
    return jnp.sum(jnp.sin(a * x) * x * x)


def _parts(ours, t):
    """The inner transforms, ours and JAX's, each a function of (u, a) -> an array."""
    t2 = 2.0 * t
    if ours:
        return {"jvp": lambda u, a: ef.jvp(lambda v: one(v, a), (u,), (t,))[1],
                "grad": lambda u, a: ef.grad(one)(u, a),
                "jvp_twice": lambda u, a: ef.jvp(lambda v: one(v, a), (u,), (t2,))[1],
                "value": lambda u, a: one(u, a)}
    return {"jvp": lambda u, a: jax.jvp(lambda v: jone(v, a), (u,), (t,))[1],
            "grad": lambda u, a: jax.grad(jone)(u, a),
            "jvp_twice": lambda u, a: jax.jvp(lambda v: jone(v, a), (u,), (t2,))[1],
            "value": lambda u, a: jone(u, a)}


@pytest.mark.parametrize("seed", range(8))
def test_vjp_of_several_inner_transforms_reading_one_argument_equals_jax(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    x, t = rng.normal(size=n), rng.normal(size=n)
    a = float(rng.uniform(0.5, 1.5))
    names = list(rng.choice(["jvp", "grad", "jvp_twice", "value"], size=int(rng.integers(2, 4)), replace=True))
    ours, theirs = _parts(True, t), _parts(False, t)
    out, pull = ef.vjp(lambda u: tuple(ours[k](u, a) for k in names), x)
    jout, jpull = jax.vjp(lambda u: tuple(theirs[k](u, a) for k in names), x)
    cts = tuple(rng.normal(size=np.shape(o)) for o in jout)
    for o, w in zip(out, jout):
        np.testing.assert_allclose(np.asarray(o).reshape(np.shape(w)), w, rtol=1e-12, atol=1e-12)
    got = pull(tuple(np.asarray(c).reshape(np.shape(o)) for c, o in zip(cts, out)))
    want = jpull(cts)
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_allclose(np.asarray(got).reshape(np.shape(want[0])), want[0], rtol=1e-10, atol=1e-12,
                               err_msg=f"parts {names}")
