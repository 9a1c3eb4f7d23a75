"""vmap of a Jacobian (jacrev, jacfwd) or Hessian of a gradient against JAX: random kernels of a
Scalar x and Params w, v whose result is a hawk.sum of products (sin, exp), batched over any of
the arguments. The Jacobian's seed rows batch the gradient's program once and vmap batches it
again: a cotangent sum of a seeded and an unseeded value must keep both batch axes aligned."""
from __future__ import annotations

import linecache
import random

import numpy as np
import pytest

import eagle_fx as ef
from eagle_fx.backends.select import use_backend

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

N = 4          # samples
B = 3          # instances
NAMES = ("w", "x", "v")
OUTER = {"jacrev": (ef.jacrev, jax.jacrev), "jacfwd": (ef.jacfwd, jax.jacfwd), "hessian": (ef.hessian, jax.hessian)}
IN_AXES = [(None, 0, None), (0, None, None), (0, 0, None), (None, 0, 0), (0, 0, 0)]
_UNARY = [("hm.sin", "jnp.sin"), ("hm.exp", "jnp.exp")]


def _load(text, tag):
    filename = f"<vmap jacrev grad {tag}>"
    text = "import eagle_fx as ef\nimport hawk_fx as hk\nimport hawk_fx.math as hm\n" \
           "from hawk_fx import Param, Scalar\n\n" + text
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns: dict = {}
    exec(compile(text, filename, "exec"), ns)
    return ns["f"]


def _expr(rng, depth):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(["w", "x", "v", repr(round(rng.uniform(0.5, 1.5), 2))])
    if rng.random() < 0.3:
        return f"{rng.choice(_UNARY)[0]}({_expr(rng, depth - 1)})"
    return f"({_expr(rng, depth - 1)} {rng.choice(['+', '-', '*'])} {_expr(rng, depth - 1)})"


def _jax_text(e):
    for h, j in _UNARY:
        e = e.replace(h, j)
    return e


class Kernel:
    """A random kernel k(x: Scalar, w: Param, v: Param) -> hawk.sum(...) of products (nonlinear in
    each argument, so third derivatives are not 0), its builder f(w, x, v), and JAX's same math
    (a one-cell result, as hawk.sum's)."""

    def __init__(self, seed):
        rng = random.Random(seed)
        e = f"({_expr(rng, 2)}) * x + hm.sin(x * w) * x * v + hm.exp(v * x) * w * w"
        if rng.random() < 0.5:         # a product of two reductions
            body, jbody = f"hk.sum({e}) * hk.sum(hm.sin(w * x) * v)", \
                f"jnp.sum({_jax_text(e)}) * jnp.sum(jnp.sin(w * x) * v)"
        else:
            body, jbody = f"hk.sum({e})", f"jnp.sum({_jax_text(e)})"
        self.src = (f"@hk.kernel\ndef k(x: Scalar, w: Param, v: Param) -> Scalar:\n    return {body}\n\n\n"
                    "@ef.Graph.builder\ndef f(w, x, v):\n    g = ef.Graph()\n    g.result = k(x, w, v)\n    return g\n")
        self.f = _load(self.src, f"kernel {seed}")
        ns = {"jnp": jnp}
        exec(f"def fj(w, x, v):\n    return ({jbody}).reshape(1)\n", ns)
        self.fj = ns["fj"]

    def __repr__(self):
        return self.src


def _pair(kernel, outer, a, b):
    """(ours, JAX's) of outer(grad(f, a), b)."""
    ours_outer, theirs_outer = OUTER[outer]
    grad_j = jax.grad(lambda *args: jnp.sum(kernel.fj(*args)), argnums=a)
    theirs = theirs_outer((lambda *args: jnp.sum(grad_j(*args))) if outer == "hessian" else grad_j, argnums=b)
    return ours_outer(ef.grad(kernel.f, argnums=a), argnums=b), theirs


def _args(rng, in_axes):
    return [rng.uniform(-1, 1, ((B,) if ax == 0 else ()) + ((N,) if name == "x" else (1,)))
            for name, ax in zip(NAMES, in_axes)]


def check(kernel, outer, a, b, in_axes, rng):
    ours, theirs = _pair(kernel, outer, a, b)
    args = _args(rng, in_axes)
    what = f"{kernel!r}vmap({outer}(grad(f, {NAMES[a]}), {NAMES[b]}), in_axes={in_axes})"
    got = np.asarray(ef.vmap(ours, in_axes=in_axes)(*args))
    want = np.asarray(jax.vmap(theirs, in_axes=in_axes)(*[jnp.asarray(x) for x in args]))
    assert got.shape == want.shape, f"{what}: shape {got.shape}, JAX {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, JAX {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10, err_msg=what)


def _draws(seed, n):
    r = random.Random(seed * 104729 + 11)
    for _ in range(n):
        outer = r.choice(list(OUTER))
        a = r.choice([0, 2]) if outer == "hessian" else r.choice([0, 1, 2])   # hessian: a one-value gradient
        yield outer, a, r.choice([0, 1, 2]), r.choice(IN_AXES)


def run(seed, n):
    kernel, rng = Kernel(seed), np.random.default_rng(seed)
    for outer, a, b, in_axes in _draws(seed, n):
        check(kernel, outer, a, b, in_axes, rng)


@pytest.mark.parametrize("outer", list(OUTER))
@pytest.mark.parametrize("in_axes", IN_AXES[:3])
def test_vmap_of_a_jacobian_of_grad_of_a_sum_of_products(outer, in_axes):
    """The product of a Param shared by the instances and a batched Scalar (sin(x * w) * x)."""
    check(Kernel(0), outer, 0, 0, in_axes, np.random.default_rng(1))


def test_random_kernels_vmap_jacobian_of_grad_match_jax():
    for seed in range(2):
        run(seed, 4)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 30))
def test_random_kernels_vmap_jacobian_of_grad_match_jax_sweep(seed):
    run(seed, 8)


@pytest.mark.parametrize("backend", ["jax", "fake-cuda"])
@pytest.mark.parametrize("outer", ["jacrev", "jacfwd"])
def test_vmap_of_a_jacobian_of_grad_on_another_backend(outer, backend):
    with use_backend(backend):
        check(Kernel(0), outer, 0, 0, (None, 0, None), np.random.default_rng(2))
