"""vmap of derivative transforms (grad, value_and_grad, jacfwd, jacrev) against JAX on the same math
and against a Python loop of the unbatched transform: shapes, dtypes and values.

A Param may be given as a Python float, a 0-d array, a one-cell array, or batched ((B,) or (B, 1));
each instance's derivative has the shape the direct call gives (and JAX): 0-d for a float, a 0-d
array or a (B,) batch, (1,) for a one-cell array or a (B, 1) batch."""
from __future__ import annotations

import linecache
import random
import zlib

import numpy as np
import pytest

import eagle_fx as ef

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

N = 5          # samples
B = 3          # instances


# ---------------------------------------------------------------------------------------------
# the two defects, as first seen


def _load(text, name, tag):
    """Compile generated source as if from a file (kernels and builders read their own text)."""
    filename = f"<vmap grad {tag}>"
    text = "import numpy as np\nimport eagle_fx as ef\nimport hawk_fx as hk\nimport hawk_fx.math as hm\n" \
           "from hawk_fx import Vector, Param, Scalar\n\n" + text
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns: dict = {}
    exec(compile(text, filename, "exec"), ns)
    return ns[name]


LIN = _load('''
@hk.kernel
def lin(x: Vector[2], w: Param) -> Scalar:
    return hk.sum(w * x[0] * x[1])


@ef.Graph.builder
def f(w, x):
    g = ef.Graph()
    g.result = lin(x, w)
    return g
''', "f", "lin")

SCALED = _load('''
@hk.kernel
def mul(x: Vector[2], w: Param) -> Vector[2]:
    return w * x


@hk.kernel
def red(v: Vector[2]) -> Scalar:
    return hk.sum(v[0] + 2.0 * v[1])


@ef.Graph.builder
def f(w, x):
    g = ef.Graph()
    g.result = red(mul(x, w))
    return g
''', "f", "scaled")


def _lin_jax(w, x):
    return jnp.sum(w * x[0] * x[1])


def _scaled_jax(w, x):
    v = w * x
    return jnp.sum(v[0] + 2.0 * v[1])


@pytest.mark.parametrize("w", [0.5, np.array(0.5), np.array([0.5])], ids=["float", "0d", "cell"])
def test_vmap_grad_of_a_shared_param_has_the_instance_shape(w):
    x = np.random.default_rng(0).random((B, 2, N))
    got = ef.vmap(ef.grad(LIN), in_axes=(None, 0))(w, x)
    want = jax.vmap(jax.grad(_lin_jax), in_axes=(None, 0))(jnp.asarray(w), x)
    one = ef.grad(LIN)(w, x[0])
    assert got.shape == want.shape == (B,) + np.shape(one)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12)
    np.testing.assert_allclose(got, np.stack([ef.grad(LIN)(w, x[b]) for b in range(B)]), rtol=1e-12)


@pytest.mark.parametrize("argnum", [0, 1])
@pytest.mark.parametrize("case", ["shared-cell", "shared-float", "batched", "batched-flat", "w-only"])
def test_vmap_grad_through_a_vector_kernel_with_a_param(argnum, case):
    """A Vector kernel of a Param (w * x) then a reduction: the batched vjp ran a weak zero built
    from an instance's values as one Python number."""
    rng = np.random.default_rng(1)
    x = rng.random((B, 2, N))
    w, axes = {"shared-cell": (np.array([0.5]), (None, 0)), "shared-float": (0.5, (None, 0)),
               "batched": (rng.random((B, 1)), (0, 0)), "batched-flat": (rng.random(B), (0, 0)),
               "w-only": (rng.random((B, 1)), (0, None))}[case]
    xx = x if axes[1] == 0 else x[0]
    got = ef.vmap(ef.grad(SCALED, argnum), in_axes=axes)(w, xx)
    wj = jnp.asarray(w)
    want = jax.vmap(jax.grad(_scaled_jax, argnum), in_axes=axes)(wj, xx)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12)


def test_a_shared_0d_param_is_read_at_every_call():
    """A 0-d array handed to a derivative inside vmap is read, not baked in when first staged."""
    x = np.random.default_rng(2).random((B, 2, N))
    F = ef.vmap(ef.value_and_grad(SCALED), in_axes=(None, 0))
    for w in (0.5, 0.75):
        got = F(np.array(w), x)[1]
        want = jax.vmap(jax.grad(_scaled_jax), in_axes=(None, 0))(jnp.asarray(w), x)
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12)


OFFSET = _load('''
@hk.kernel
def shift(x: Vector[2], w: Param) -> Vector[2]:
    return x + w


@hk.kernel
def total(v: Vector[2]) -> Scalar:
    return hk.sum(1.5 * v[0] - 0.5 * v[1])


@ef.Graph.builder
def f(w, x):
    g = ef.Graph()
    g.result = total(shift(x, w))
    return g
''', "f", "offset")

OFFSET_SCALAR = _load('''
@hk.kernel
def shifted_total(x: Scalar, w: Param) -> Scalar:
    return hk.sum(x + w)


@ef.Graph.builder
def f(w, x):
    g = ef.Graph()
    g.result = shifted_total(x, w)
    return g
''', "f", "offset scalar")


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("vector", [True, False], ids=["vector", "scalar"])
@pytest.mark.parametrize("w", [0.7, np.array([0.7])], ids=["float", "cell"])
def test_a_param_added_to_every_sample_sums_its_cotangent_over_the_samples(w, vector):
    """d/dw sum_i (1.5 (x0_i + w) - 0.5 (x1_i + w)) = n, and d/dw sum_i (x_i + w) = n in one
    kernel: the reduction's one cotangent reaches w through no per-sample factor, and still
    counts once per sample."""
    f = OFFSET if vector else OFFSET_SCALAR
    x = np.random.default_rng(3).random((B, 2, N) if vector else (B, N))
    np.testing.assert_allclose(ef.grad(f)(w, x[0]), np.full(np.shape(w), float(N)), rtol=1e-12)
    got = ef.vmap(ef.grad(f), in_axes=(None, 0))(w, x)
    np.testing.assert_allclose(got, np.full((B,) + np.shape(w), float(N)), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# a seeded sweep over small random kernels

_UNARY = [("hm.sin", "jnp.sin"), ("hm.cos", "jnp.cos"), ("hm.tanh", "jnp.tanh")]


def _expr(rng, atoms, depth):
    """A random smooth expression over `atoms` (as source text, with hm. for the math)."""
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(atoms + [repr(round(rng.uniform(0.5, 2.0), 2))])
    op = rng.random()
    if op < 0.25:
        return f"{rng.choice(_UNARY)[0]}({_expr(rng, atoms, depth - 1)})"
    sym = rng.choice(["+", "-", "*"])
    return f"({_expr(rng, atoms, depth - 1)} {sym} {_expr(rng, atoms, depth - 1)})"


def _to_jax(src):
    for h, j in _UNARY:
        src = src.replace(h, j)
    return src


class Case:
    """One random kernel pair (elementwise, then a reduction) and its builder and JAX function."""

    def __init__(self, seed):
        rng = random.Random(seed)
        self.seed = seed
        self.k = rng.choice([0, 2, 3])                       # 0: a Scalar plane
        self.np = rng.choice([1, 2])                         # Params
        self.vector_out = self.k and rng.random() < 0.5
        ws = [f"w{i}" for i in range(self.np)]
        xs = [f"x[{i}]" for i in range(self.k)] if self.k else ["x"]
        e = _expr(rng, ws + xs, 3)
        e = f"({e}) * {rng.choice(xs)} + {rng.choice(ws)}"   # reads x and a Param
        role = f"Vector[{self.k}]" if self.k else "Scalar"
        params = ", ".join(f"{w}: Param" for w in ws)
        coef = [round(rng.uniform(0.5, 2.0), 2) for _ in range(max(self.k, 1))]
        if self.vector_out:
            body = f"    return ({e}) * x\n"
            red = " + ".join(f"{c} * v[{i}]" for i, c in enumerate(coef))
            kernels = (f"@hk.kernel\ndef elem(x: {role}, {params}) -> {role}:\n{body}\n\n"
                       f"@hk.kernel\ndef red(v: {role}) -> Scalar:\n    return hk.sum({red})\n")
            jax_body = f"    v = ({_to_jax(e)}) * x\n    return jnp.sum({red})\n"
        else:
            kernels = (f"@hk.kernel\ndef elem(x: {role}, {params}) -> Scalar:\n    return {e}\n\n"
                       f"@hk.kernel\ndef red(v: Scalar) -> Scalar:\n    return hk.sum({coef[0]} * v)\n")
            jax_body = f"    return jnp.sum({coef[0]} * ({_to_jax(e)}))\n"
        args = ", ".join(ws + ["x"])
        builder = (f"@ef.Graph.builder\ndef f({args}):\n    g = ef.Graph()\n"
                   f"    g.result = red(elem(x, {', '.join(ws)}))\n    return g\n")
        self.src = kernels + "\n\n" + builder
        self.f = _load(self.src, "f", f"case {seed}")
        ns = {"jnp": jnp}
        exec(f"def fj({args}):\n{jax_body}", ns)
        self.fj = ns["fj"]
        self.nargs = self.np + 1

    def __repr__(self):
        return f"Case({self.seed}):\n{self.src}"


FORMS = ["float", "0d", "cell", "batched-flat", "batched-cell"]


def _param(rng, form):
    v = rng.uniform(0.3, 1.2, size=B)
    return {"float": float(v[0]), "0d": np.array(v[0]), "cell": np.array([v[0]]),
            "batched-flat": v, "batched-cell": v[:, None]}[form]


def _instance(a, ax, b):
    """Instance b of argument a batched along ax (None: shared), as the unbatched call takes it."""
    if ax is None:
        return a
    return np.moveaxis(np.asarray(a), ax, 0)[b, ...]


_TRANSFORMS = {
    "grad": (lambda f, k: ef.grad(f, k), lambda f, k: jax.grad(f, k)),
    "value_and_grad": (lambda f, k: ef.value_and_grad(f, k), lambda f, k: jax.value_and_grad(f, k)),
    "jacfwd": (lambda f, k: ef.jacfwd(f, k), lambda f, k: jax.jacfwd(lambda *a: f(*a).reshape(1), k)),
    "jacrev": (lambda f, k: ef.jacrev(f, k), lambda f, k: jax.jacrev(lambda *a: f(*a).reshape(1), k)),
}


def _leaves(t):
    return list(t) if isinstance(t, tuple) else [t]


def _compare(got, want, what):
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert np.shape(g) == w.shape, f"{what}: shape {np.shape(g)}, JAX {w.shape}"
        assert np.asarray(g).dtype == w.dtype, f"{what}: dtype {np.asarray(g).dtype}, JAX {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=what)


def _value_as_jax(name, out):
    """value_and_grad's value is a one-cell array (hawk.sum's result); JAX's jnp.sum gives it 0-d."""
    if name == "value_and_grad":
        v = np.asarray(out[0])
        assert v.shape[-1:] == (1,), v.shape
        return (v.reshape(v.shape[:-1]), out[1])
    return out


def run_case(seed, draws):
    case = Case(seed)
    rng = np.random.default_rng(seed)
    prng = random.Random(seed * 7919 + 1)
    x_shape = ((case.k,) if case.k else ()) + (N,)
    for _ in range(draws):
        name = prng.choice(sorted(_TRANSFORMS))
        ours, theirs = _TRANSFORMS[name]
        forms = [prng.choice(FORMS) for _ in range(case.np)]
        x_ax = prng.choice([None, 0, 1, -1])
        if x_ax is None and not any(fm.startswith("batched") for fm in forms):
            x_ax = 0
        axes = [0 if fm.startswith("batched") else None for fm in forms] + [x_ax]
        params = [_param(rng, fm) for fm in forms]
        if x_ax is None:
            x = rng.uniform(-1, 1, x_shape)
        else:
            x = np.moveaxis(rng.uniform(-1, 1, (B,) + x_shape), 0, x_ax)
        args = params + [x]
        argnum = prng.randrange(case.nargs)
        what = f"{case!r}\n{name} argnum={argnum} forms={forms} in_axes={axes}"
        if any(fm == "0d" and i != argnum for i, fm in enumerate(forms)):
            # a Param not differentiated is a number or a one-cell array: a 0-d array is refused, by name
            with pytest.raises(ValueError, match=r"has shape \(\); a Param is a Python number or a one-cell"):
                ef.vmap(ours(case.f, argnum), in_axes=tuple(axes))(*args)
            continue
        got = _value_as_jax(name, ef.vmap(ours(case.f, argnum), in_axes=tuple(axes))(*args))
        jargs = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        want = jax.vmap(theirs(case.fj, argnum), in_axes=tuple(axes))(*jargs)
        _compare(got, want, what)
        # a (B,) Param's instance is 0-d where it is differentiated; elsewhere the one cell a Param takes
        cells = [i != argnum and fm == "batched-flat" for i, fm in enumerate(forms)] + [False]

        def inst(b):
            return [_instance(a, ax, b).reshape(1) if c else _instance(a, ax, b) for a, ax, c in zip(args, axes, cells)]
        loop = [_value_as_jax(name, ours(case.f, argnum)(*inst(b))) for b in range(B)]
        stacked = tuple(np.stack([_leaves(r)[j] for r in loop]) for j in range(len(_leaves(loop[0]))))
        _compare(got, stacked if len(stacked) > 1 else stacked[0], what + " (a loop of the unbatched call)")
        # the unbatched transform itself, on instance 0, against JAX
        one = inst(0)
        _compare(loop[0], theirs(case.fj, argnum)(*[jnp.asarray(a) if isinstance(a, np.ndarray) else a
                                                     for a in one]), what + " (unbatched)")


@pytest.mark.parametrize("seed", range(6))
def test_random_kernels_vmap_of_derivatives_match_jax(seed):
    run_case(seed, 3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 60))
def test_random_kernels_vmap_of_derivatives_match_jax_sweep(seed):
    run_case(seed, 8)


@pytest.mark.parametrize("w", [0.5, np.array(0.5), np.array([0.5])], ids=["float", "0d", "cell"])
def test_nested_vmap_of_grad_has_the_instance_shape(w):
    x = np.random.default_rng(4).random((2, B, 2, N))
    got = ef.vmap(ef.vmap(ef.grad(SCALED), in_axes=(None, 0)), in_axes=(None, 0))(w, x)
    want = jax.vmap(jax.vmap(jax.grad(_scaled_jax), in_axes=(None, 0)), in_axes=(None, 0))(jnp.asarray(w), x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# dtypes: a float32 x beside a Param given as a Python float (weakly typed, as in JAX), a 0-d or
# a one-cell array of either dtype; the derivative's dtype and values, batched and direct

def _dtype_case(fj, f, api, argnum, x_dt, form, w_dt, batched):
    rng = np.random.default_rng(zlib.crc32(f"{api} {argnum} {np.dtype(x_dt)} {form} {np.dtype(w_dt)}".encode()))
    x = rng.uniform(0.2, 1.0, (B, 2, N)).astype(x_dt)
    v = float(rng.uniform(0.3, 1.2))
    w = {"float": v, "0d": np.array(v, w_dt), "cell": np.array([v], w_dt)}[form]
    ours, theirs = _TRANSFORMS[api]
    wj = w if form == "float" else jnp.asarray(w)        # a Python float stays weakly typed in JAX too
    if batched:
        got = ef.vmap(ours(f, argnum), in_axes=(None, 0))(w, x)
        want = jax.vmap(theirs(fj, argnum), in_axes=(None, 0))(wj, x)
    else:
        got = ours(f, argnum)(w, x[0])
        want = theirs(fj, argnum)(wj, x[0])
    what = f"{api} argnum={argnum} x {np.dtype(x_dt)} w {form} {np.dtype(w_dt)} {'vmap' if batched else 'direct'}"
    got, want = _leaves(_value_as_jax(api, got)), _leaves(want)
    assert len(got) == len(want), what
    for g, w_ in zip(got, want):
        w_ = np.asarray(w_)
        assert np.shape(g) == w_.shape, f"{what}: shape {np.shape(g)}, JAX {w_.shape}"
        assert np.asarray(g).dtype == w_.dtype, f"{what}: dtype {np.asarray(g).dtype}, JAX {w_.dtype}"
        single = np.float32 in (x_dt, w_dt) or form == "float" and x_dt == np.float32
        np.testing.assert_allclose(g, w_, rtol=3e-6 if single else 1e-12, err_msg=what)
    return got


def _dtype_draws(seed, n):
    r = random.Random(seed)
    for _ in range(n):
        form = r.choice(["float", "0d", "cell"])
        yield (r.choice(sorted(_TRANSFORMS)), r.choice([0, 1]) if form != "0d" else 0,
               r.choice([np.float32, np.float64]), form, r.choice([np.float32, np.float64]))


@pytest.mark.parametrize("api", sorted(_TRANSFORMS))
def test_vmap_of_a_derivative_at_a_python_float_beside_float32_has_jax_s_dtype(api):
    """d/dw at a Python float w beside a float32 x: JAX computes in float32 (w is weakly typed)
    and gives a reverse-mode derivative float64 (a Python float's dtype), a forward one float32;
    vmap of it gives each instance what the direct call gives."""
    direct = _dtype_case(_scaled_jax, SCALED, api, 0, np.float32, "float", np.float64, False)
    batched = _dtype_case(_scaled_jax, SCALED, api, 0, np.float32, "float", np.float64, True)
    assert [np.asarray(d).dtype for d in direct] == [np.asarray(b).dtype for b in batched]


@pytest.mark.parametrize("seed", range(2))
def test_a_seeded_sweep_of_dtypes_and_param_forms_matches_jax(seed):
    for api, argnum, x_dt, form, w_dt in _dtype_draws(seed, 3):
        for batched in (False, True):
            _dtype_case(_lin_jax, LIN, api, argnum, x_dt, form, w_dt, batched)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 30))
def test_a_seeded_sweep_of_dtypes_and_param_forms_matches_jax_sweep(seed):
    f, fj = (SCALED, _scaled_jax) if seed % 2 else (LIN, _lin_jax)
    for api, argnum, x_dt, form, w_dt in _dtype_draws(seed, 6):
        for batched in (False, True):
            _dtype_case(fj, f, api, argnum, x_dt, form, w_dt, batched)


def test_derivatives_of_a_gradient_at_a_python_float_have_jax_s_dtype():
    """jvp / jacfwd / jacrev of grad(f) at a Python float w beside a float32 x: float64 where the
    outer derivative reads grad's float64 result or w's cotangent, float32 where it is x's."""
    x = np.random.default_rng(5).uniform(0.2, 1.0, (2, N)).astype(np.float32)
    t = np.ones_like(x)
    pairs = [
        (ef.jvp(ef.grad(SCALED), (0.5, x), (1.0, t)), jax.jvp(jax.grad(_scaled_jax), (0.5, x), (1.0, t))),
        (ef.jacfwd(ef.grad(SCALED))(0.5, x), jax.jacfwd(jax.grad(_scaled_jax))(0.5, x)),
        (ef.jacrev(ef.grad(SCALED))(0.5, x), jax.jacrev(jax.grad(_scaled_jax))(0.5, x)),
        (ef.jacfwd(ef.grad(SCALED), 1)(0.5, x), jax.jacfwd(jax.grad(_scaled_jax), 1)(0.5, x)),
        (ef.jacrev(ef.grad(SCALED), 1)(0.5, x), jax.jacrev(jax.grad(_scaled_jax), 1)(0.5, x)),
        (ef.vjp(SCALED, 0.5, x)[1](np.ones(1, np.float32)), jax.vjp(_scaled_jax, 0.5, x)[1](np.float32(1.0))),
        (ef.hessian(SCALED)(0.5, x), jax.hessian(_scaled_jax)(0.5, x)),
    ]
    for k, (got, want) in enumerate(pairs):
        for g, w in zip(_leaves(got), _leaves(want)):
            g, w = np.asarray(g), np.asarray(w)
            assert g.dtype == w.dtype, f"case {k}: dtype {g.dtype}, JAX {w.dtype}"
            assert g.size == w.size, f"case {k}: shape {g.shape}, JAX {w.shape}"
            np.testing.assert_allclose(g.reshape(w.shape), w, rtol=3e-6, err_msg=f"case {k}")
