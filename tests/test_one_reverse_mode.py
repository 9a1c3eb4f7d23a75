"""`eagle_fx.diff.reverse` over a recorded run and `eagle_fx.vjp` of the plain builder are one
reverse mode: on every control-flow form they agree with each other and with central finite
differences of the plain graph (an oracle that runs no derivative code)."""
from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx import math as hm
from test_grad_graph import (capped, choose, chooser, counted, early_exit, fd_grads, forks, keep, mutating,
                             nested, skipping, whole)
from tour_kernels import below, cell, dbl, total

X3 = np.array([0.3, -0.7, 1.1])

# (builder, its arguments by name, the float arguments to differentiate)
CASES = {
    "cond": (choose, {"x": X3, "flag": cell(1), "which": cell(0)}, ["x"]),
    "cond, other arm": (choose, {"x": X3, "flag": cell(0), "which": cell(0)}, ["x"]),
    "switch": (chooser, {"x": X3, "sel": cell(2)}, ["x"]),
    "switch, default": (chooser, {"x": X3, "sel": cell(7)}, ["x"]),
    "capped loop": (capped, {"x": np.array([0.5, 1.0, 1.5]), "c": np.array([1.3]), "flag": cell(1)}, ["x", "c"]),
    "counted loop": (counted, {"x": X3, "n": cell(4)}, ["x"]),
    "break mid-body": (early_exit, {"x": X3, "flag": cell(1), "done": cell(0)}, ["x"]),
    "continue": (skipping, {"x": X3, "flag": cell(1), "skip": cell(0)}, ["x"]),
    "nested loops": (nested, {"x": np.array([0.1, 0.2, 0.3]), "a": np.array([0.9]), "flag": cell(1),
                              "n": cell(2)}, ["x", "a"]),
    "forks": (forks, {"x": X3}, ["x"]),
    "buffers": (keep, {"x": np.array([0.3, -0.7, 1.1, 0.4])}, ["x"]),
    "written argument": (mutating, {"x": X3, "y": np.array([1.0, 2.0, 0.5])}, ["x", "y"]),
    "everything": (whole, {"x": np.arange(1.0, 9.0) / 8, "flag": cell(1), "y": np.zeros(8)}, ["x"]),
}


def _seed_like(out, rng):
    if isinstance(out, dict):
        return {k: _seed_like(v, rng) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_seed_like(v, rng) for v in out)
    return rng.normal(size=np.shape(out))


@pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)
@pytest.mark.parametrize("form", list(CASES))
def test_reverse_of_a_record_equals_vjp_and_finite_differences(form):
    builder, args, wrt = CASES[form]
    rng = np.random.default_rng(len(form))
    fresh = lambda: {k: v.copy() for k, v in args.items()}         # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gr = builder(**fresh(), record=True)
        out = gr()
        seed = _seed_like(out, rng)
        got = eagle.diff.reverse(gr.record, {"result": seed}, wrt=tuple(wrt))
        names = list(args)
        _, pull = eagle.vjp(builder, *fresh().values())
        cts = pull(seed)
        fd = fd_grads(builder, fresh(), {"result": seed}, wrt)
    for w in wrt:
        via_vjp = cts[names.index(w)]
        scale = max(1.0, float(np.max(np.abs(fd[w]))))
        np.testing.assert_allclose(got[w], via_vjp, rtol=1e-12, atol=1e-12 * scale, err_msg=f"{form}: d/d{w}")
        np.testing.assert_allclose(got[w], fd[w], rtol=1e-6, atol=1e-6 * scale, err_msg=f"{form}: d/d{w} vs fd")


@eagle.Graph.builder
def uncapped(x, flag, record=False):
    g = eagle.Graph(record=record)
    while flag:
        x = dbl(x)
        below(x, 10.0, flag)
    g.result = x
    return g


@pytest.mark.usefixtures("backend_heavy")
def test_an_uncapped_loop_cannot_be_recorded_but_vjp_takes_it():
    """record=True refuses an uncapped loop at build (the builder tour prints it); vjp saves the
    turns it runs, however many: the gradient of x doubled until no sample is below 10 is 2**k."""
    x = np.array([0.3, 1.1, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="uncapped device loop cannot be recorded"):
            uncapped(x.copy(), cell(1), record=True)
        y, pull = eagle.vjp(uncapped, x.copy(), cell(1))
    k = next(k for k in range(64) if np.all(x * 2.0 ** k >= 10.0))
    np.testing.assert_allclose(y, x * 2.0 ** k)
    seed = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(pull(seed)[0], seed * 2.0 ** k)


# ---------------------------------------------------------------------------------------------
# memory that follows the turns run: a loop capped at 200 000 turns that stops after ~50 saves
# ~50 turns (a stack that doubles: at most 4 x the turns' bytes at its peak, while it grows),
# not 200 000 (3.2 GB at n = 2000)

@hawk.kernel
def creep(x: Scalar) -> Scalar:
    return 1.1 * x + 0.05 * hm.sin(x)


@eagle.Graph.builder
def settle(x, flag):
    g = eagle.Graph()
    for _ in range(200_000):
        if not flag: break
        x = creep(x)
        below(x, 100.0, flag)
    g.result = total(x)
    return g


@eagle.Graph.builder
def settle_uncapped(x, flag):
    g = eagle.Graph()
    while flag:
        x = creep(x)
        below(x, 100.0, flag)
    g.result = total(x)
    return g


@eagle.Graph.builder
def settle_counted(x, n):
    g = eagle.Graph()
    for i in range(n):
        x = creep(x)
    g.result = total(x)
    return g


def numpy_turns(x, lim=100.0):
    """How many turns `settle` runs from x (plain NumPy)."""
    k = 0
    while np.any(x < lim):
        x = 1.1 * x + 0.05 * np.sin(x)
        k += 1
    return k


def jax_grad(x, turns):
    """jax.grad of sum(x * x) after `turns` turns, written as a Python loop: the oracle."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy

    def f(v):
        for _ in range(turns):
            v = 1.1 * v + 0.05 * jnp.sin(v)
        return jnp.sum(v * v)
    return np.asarray(jax.grad(f)(jnp.asarray(x)))


def peak_of(run):
    """(result, peak bytes traced) of the first run of a built graph: its stacks grow in it."""
    tracemalloc.start()
    try:
        out = run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return out, peak


@pytest.mark.numpy_only          # stacks that grow with the turns run: the NumPy backend's (XLA needs a static size)
@pytest.mark.parametrize("builder", [settle, settle_uncapped])
def test_reverse_through_a_loop_saves_the_turns_it_runs(builder):
    n = 2000
    x = np.linspace(1.0, 2.0, n)
    turns = numpy_turns(x)
    assert 40 < turns < 60
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = eagle.grad(builder).graph(x, cell(1))
    grad, peak = peak_of(g)
    np.testing.assert_allclose(grad, jax_grad(x, turns), rtol=1e-12)
    bound = 4 * turns * n * 8 + 32 * n * 8          # the stack while it doubles, and a few planes
    assert peak < bound, (peak, bound)


@pytest.mark.numpy_only          # growing stacks and checkpointing run on the NumPy backend; JAX refuses both at build
@pytest.mark.parametrize("checkpoints", [None, 2])
def test_counted_loop_gradient_for_more_turns_than_at_build(checkpoints):
    x = np.linspace(0.1, 1.0, 7)
    n = cell(3)
    g = eagle.grad(settle_counted, checkpoints=checkpoints).graph(x, n)
    for turns in (3, 1, 9, 0):
        n[0] = turns
        np.testing.assert_allclose(g(), jax_grad(x, turns), rtol=1e-12, err_msg=f"{turns} turns")


def test_under_vmap_the_saved_turns_follow_the_longest_instance():
    B, n = 3, 1000
    xs = np.stack([np.linspace(1.0, 2.0, n), np.linspace(30.0, 40.0, n), np.linspace(5.0, 6.0, n)])
    turns = [numpy_turns(x) for x in xs]
    g = eagle.vmap(eagle.grad(settle), in_axes=(0, 0)).graph(xs, np.ones((B, 1), np.uint32))
    grads, peak = peak_of(g)
    for b in range(B):
        np.testing.assert_allclose(grads[b], jax_grad(xs[b], turns[b]), rtol=1e-12, err_msg=f"instance {b}")
    bound = 4 * max(turns) * B * n * 8 + 32 * B * n * 8
    assert peak < bound, (peak, bound)


# ---------------------------------------------------------------------------------------------
# a call's forward keeps the costly values its backward would compute again

@hawk.kernel
def wave_k(x: Scalar) -> Scalar:
    return hm.sin(x) * x


@hawk.kernel
def bell_k(x: Scalar, a: Param) -> Scalar:
    return hm.exp(-a * x * x) + x


@eagle.Graph.builder
def wave_bell(x, a):
    g = eagle.Graph()
    g.result = total(bell_k(wave_k(x), a))
    return g


def test_a_kernel_backward_reads_the_costly_values_of_its_forward():
    x, a = np.linspace(-1.0, 1.5, 6), np.array([0.7])
    prog = eagle.make_program(eagle.grad(wave_bell, argnums=(0, 1)))(x, a)
    prims = {e.params["kernel"].name: [q.prim.name for q in e.params["spec"].prog.eqns]
             for e in prog.eqns if e.prim.name == "call"}
    assert "sin" in prims["wave_k"] and "sin" not in prims["vjp(wave_k)"]      # read back, not recomputed
    assert "exp" in prims["bell_k"] and "exp" not in prims["vjp(bell_k)"]
    assert "cos" in prims["vjp(wave_k)"]                                     # the forward never had it
    dx, da = eagle.grad(wave_bell, argnums=(0, 1))(x, a)
    w = np.sin(x) * x                                                        # the chain rule in NumPy
    e = np.exp(-a * w * w)
    y = e + w
    dy = 2 * y
    np.testing.assert_allclose(dx, dy * (1 - 2 * a * w * e) * (np.sin(x) + x * np.cos(x)), rtol=1e-12)
    np.testing.assert_allclose(da, [np.sum(dy * -w * w * e)], rtol=1e-12)


@eagle.Graph.builder
def settle_rec(x, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(500):
        if not flag: break
        x = creep(x)
        below(x, 100.0, flag)
    g.result = x
    return g


def test_a_kept_record_holds_its_own_saved_turns():
    """record.copy() keeps the stacks of a run (numpy_stack.Stack): a later launch with other
    turns does not change the gradients it gives."""
    x, seed = np.linspace(1.0, 2.0, 50), np.linspace(-1.0, 1.0, 50)
    g = settle_rec(x.copy(), cell(1), record=True)
    g()
    kept = g.record.copy()
    first = eagle.diff.reverse(g.record, {"result": seed}, wrt="x")["x"]
    assert kept.nbytes >= numpy_turns(x) * 50 * 8
    g.bind(x=x + 40.0, flag=cell(1))                 # fewer turns
    g()
    np.testing.assert_array_equal(eagle.diff.reverse(kept, {"result": seed}, wrt="x")["x"], first)
    turns = numpy_turns(x)
    want = seed.copy()
    v = [x.copy()]
    for _ in range(turns - 1):
        v.append(1.1 * v[-1] + 0.05 * np.sin(v[-1]))
    for u in reversed(v):                            # d/du of 1.1 u + 0.05 sin(u), last turn first
        want = want * (1.1 + 0.05 * np.cos(u))
    np.testing.assert_allclose(first, want, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# a record's forward writes the caller's arrays as the plain graph does, and saves only what the
# reverse reads that the run itself would not keep

@hawk.kernel
def square_plus(x: Scalar) -> Scalar:
    return x * x + 1.0


@hawk.kernel
def affine(x: Scalar) -> Scalar:          # linear: its derivative reads none of its inputs
    return 3.0 * x - 2.0


@eagle.Graph.builder
def chain(x, record=False):
    g = eagle.Graph(record=record)
    g.result = affine(square_plus(affine(square_plus(x))))
    return g


@pytest.mark.numpy_only        # the NumPy backend's stacks and bitwise values; JAX records: test_recorded_backends.py
def test_a_chain_without_overwrites_saves_no_copy_of_its_input():
    """d/dx of the chain reads x (the caller's array, read where it lies) and the input of the
    second square_plus: one plane saved, not a plane per kernel."""
    n = 1000
    x = np.linspace(-1.0, 1.0, n)
    g = chain(x, record=True)
    out = g()
    np.testing.assert_array_equal(out, chain(x.copy())())
    assert g.record.nbytes == n * 8, g.record.nbytes
    seed = np.cos(np.arange(n))
    c = 3.0 * (x * x + 1.0) - 2.0                       # the chain rule in NumPy
    want = seed * 3.0 * 2.0 * c * 3.0 * 2.0 * x
    np.testing.assert_allclose(eagle.diff.reverse(g.record, {"result": seed}, wrt="x")["x"], want, rtol=1e-13)


@hawk.kernel
def nudge(s: Scalar, y: hawk.Mutable[Scalar]):          # reads the value it overwrites
    y = 0.9 * y + 0.1 * hm.sin(s)


@eagle.Graph.builder
def writes(x, y, out, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(20):
        if not flag: break
        nudge(x, y)                                     # a loop carry in the caller's array
        below(y, 0.0, flag)                             # runs while some y is below 0
    m = square_plus(y, buffer=out)                      # into the caller's array
    nudge(m, y)                                         # y written after the loop too
    g.result = affine(m)
    return g


def _writes_args():
    return {"x": np.array([0.4, -1.3, 2.2]), "y": np.array([-0.5, 0.2, -0.05]), "out": np.zeros(3),
            "flag": cell(1)}


@pytest.mark.numpy_only        # the NumPy backend's stacks and bitwise values; JAX records: test_recorded_backends.py
def test_a_record_writes_the_callers_arrays_as_the_plain_graph_does():
    """Mutable arguments, a buffer= array and the result after each launch, g(n) and bind: the
    arrays of the recorded graph equal those of the plain one, bit for bit."""
    a, b = _writes_args(), _writes_args()
    plain, rec = writes(**a), writes(**b, record=True)
    for step in range(3):
        if step == 1:
            r_plain, r_rec = plain(3), rec(3)
        else:
            r_plain, r_rec = plain(), rec()
        np.testing.assert_array_equal(r_rec, r_plain)
        for k in a:
            np.testing.assert_array_equal(b[k], a[k], err_msg=f"launch {step}: {k}")
        a["flag"][0] = b["flag"][0] = 1
    a2, b2 = _writes_args(), _writes_args()
    for d in (a2, b2):
        d["y"] -= 0.3
    plain.bind(**a2)
    rec.bind(**b2)
    plain.launch()
    rec.launch()
    for k in a2:
        np.testing.assert_array_equal(b2[k], a2[k], err_msg=f"after bind: {k}")
    assert not np.array_equal(a2["y"], a["y"])


def test_gradients_of_a_record_that_writes_the_callers_arrays():
    """The record's gradients (y's value on entry, x; seeds on the result, y's value on exit and
    the buffer= array) against central differences of the plain graph."""
    args = _writes_args()
    rng = np.random.default_rng(5)
    seeds = {"result": rng.normal(size=3), "y": rng.normal(size=3), "out": rng.normal(size=3)}
    g = writes(**{k: v.copy() for k, v in args.items()}, record=True)
    g()
    got = eagle.diff.reverse(g.record, seeds, wrt=("x", "y"))
    fd = fd_grads(writes, args, seeds, ["x", "y"])
    for w in ("x", "y"):
        np.testing.assert_allclose(got[w], fd[w], rtol=1e-6, atol=1e-7, err_msg=f"d/d{w}")


@hawk.kernel
def halve_up(y: hawk.Mutable[Scalar]):          # linear: its derivative reads nothing
    y = 0.5 * y + 1.0


@hawk.kernel
def square_in_place(y: hawk.Mutable[Scalar]):   # its derivative reads the value the write destroys
    y = y * y


@eagle.Graph.builder
def ten_writes(y, linear, record=False):
    g = eagle.Graph(record=record)
    for _ in range(10):                          # a Python loop: ten writes staged
        if linear:
            halve_up(y)
        else:
            square_in_place(y)
    return g


@pytest.mark.numpy_only        # the NumPy backend's stacks and bitwise values; JAX records: test_recorded_backends.py
@pytest.mark.parametrize("linear", [True, False])
def test_a_record_saves_what_a_later_write_destroys_and_nothing_else(linear):
    """Ten in-place writes of y: a linear one saves nothing; y*y saves each version of y its
    write destroys (the value on entry and nine more), ten planes, and reverses to prod(2 y_k)."""
    n = 1000
    y0 = np.linspace(0.5, 1.0, n)
    y, y_plain = y0.copy(), y0.copy()
    g = ten_writes(y, linear, record=True)
    g()
    ten_writes(y_plain, linear)()
    np.testing.assert_array_equal(y, y_plain)
    assert g.record.nbytes == (0 if linear else 10 * n * 8), g.record.nbytes
    seed = np.cos(np.arange(n))
    want, v = seed.copy(), y0.copy()
    for _ in range(10):                          # the chain rule in NumPy
        want = want * (0.5 if linear else 2.0 * v)
        v = 0.5 * v + 1.0 if linear else v * v
    np.testing.assert_allclose(v, y, rtol=1e-13)
    np.testing.assert_allclose(eagle.diff.reverse(g.record, {"y": seed}, wrt="y")["y"], want, rtol=1e-12)
