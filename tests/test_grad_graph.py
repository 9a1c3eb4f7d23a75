"""Graph gradients: Graph(record=True), g(), eagle_fx.diff.reverse(g.record, seeds, wrt=...).

Two independent oracles for every graph:
  * central finite differences of the same builder built WITHOUT record=True (the plain forward),
    rerun with its guard cells and Mutable arguments restored before each run, and
  * jax: the same computation written with jax.numpy and lax.cond / lax.switch / lax.while_loop /
    lax.fori_loop (float64). Loops with data-dependent exits are differentiated in forward mode
    (jax.jacfwd; reverse mode does not go through lax.while_loop), then contracted with the seed.
Control flow is checked on the arm / trip count that was recorded, then the cell is flipped (or
the input rebound) and the same recorded graph is rerun and reversed again.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar
from hawk_fx import math as hm
from hawk_fx.tree import tree_flatten
from tour_kernels import affine, below, cell, dbl, inc, over, square
from tour_builders import model, whole

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp, lax = jax.numpy, jax.lax

FLOATS = [np.float64, np.float32]
RTOL = {np.float64: 1e-6, np.float32: 2e-4}       # vs finite differences of the float64 twin
JTOL = {np.float64: 1e-12, np.float32: 2e-5}      # vs jax in float64


# ---------------------------------------------------------------------------------------------
# kernels

@hawk.kernel
def wave(x: Scalar) -> Scalar:
    return hm.sin(x) * x

@hawk.kernel
def bell(x: Scalar) -> Scalar:
    return hm.exp(-x * x)

@hawk.kernel
def grow(x: Scalar) -> Scalar:                   # increasing: 1.5 + 0.25 cos(x) > 0
    return 1.5 * x + 0.25 * hm.sin(x)

@hawk.kernel
def mix(a: Scalar, b: Scalar) -> Scalar:
    return a * b + hm.sin(a)

@hawk.kernel
def blend(s: Scalar, y: Mutable[Scalar]):          # reads the value it overwrites
    y = y * s + hm.sin(s)


def jwave(x):
    return jnp.sin(x) * x


def jbell(x):
    return jnp.exp(-x * x)


def jgrow(x):
    return 1.5 * x + 0.25 * jnp.sin(x)


def jmix(a, b):
    return a * b + jnp.sin(a)


# ---------------------------------------------------------------------------------------------
# oracles

def _leaves(tree):
    return tree_flatten(tree, is_leaf=lambda x: isinstance(x, np.ndarray))[0]


def fd_grads(builder, args, seeds, wrt, dtype=np.float64, h=1e-6, **build):
    """Central differences of sum(seed * output) over the plain (non-recorded) graph, in float64.

    args: the builder's arrays by name (cells included), restored before every run. seeds: as for
    reverse; 'result' takes a tree, any other key names an argument (its value after the run)."""
    arrays = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v).copy() for k, v in args.items()}
    init = {k: v.copy() for k, v in arrays.items()}
    g = builder(**arrays, **build)
    seeds = {k: ([np.asarray(s, np.float64) for s in _leaves(v)] if k == "result" else np.asarray(v, np.float64))
             for k, v in seeds.items()}

    def objective():
        for k, v in init.items():
            arrays[k][...] = v
        arrays[name][idx] += step
        out = g()
        total = 0.0
        for k, s in seeds.items():
            if k == "result":
                total += sum(float(np.sum(a * np.asarray(b))) for a, b in zip(s, _leaves(out)))
            else:
                total += float(np.sum(s * arrays[k]))
        return total

    grads = {}
    for name in wrt:
        gr = np.zeros(arrays[name].shape)
        for idx in np.ndindex(gr.shape):
            step = h
            fp = objective()
            step = -h
            fm = objective()
            gr[idx] = (fp - fm) / (2 * h)
        grads[name] = gr
    for k, v in init.items():
        arrays[k][...] = v
    return grads


def jax_vjp(f, args, seed, forward=False):
    """d(sum(seed * f(*args)))/d(args) with jax; forward=True goes through jax.jacfwd (while loops)."""
    args = tuple(jnp.asarray(np.asarray(a, np.float64)) for a in args)
    seed = jax.tree_util.tree_map(lambda s: jnp.asarray(np.asarray(s, np.float64)), seed)
    if not forward:
        out, pull = jax.vjp(f, *args)
        return [np.asarray(g) for g in pull(seed)]
    jac = jax.jacfwd(f, argnums=tuple(range(len(args))))(*args)
    seeds, tree = jax.tree_util.tree_flatten(seed)
    jacs = tree.flatten_up_to(jac)
    res = []
    for k, a in enumerate(args):
        res.append(sum(np.tensordot(np.asarray(s), np.asarray(j[k]), axes=np.ndim(s)) for s, j in zip(seeds, jacs)))
    return res


def close(got, want, rtol, what=""):
    got, want = np.asarray(got), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    assert err <= rtol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})\n got {got}\nwant {want}"


def reverse(g, seeds, wrt):
    return eagle.diff.reverse(g.record, seeds, wrt=wrt)


# ---------------------------------------------------------------------------------------------
# a chain, Params as arrays

@eagle.Graph.builder
def chain(x, record=False):
    g = eagle.Graph(record=record)
    g.result = square(affine(wave(x), 2.0, 1.0))
    return g


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_chain(dtype):
    x = np.linspace(-1.5, 2.0, 6).astype(dtype)
    seed = np.linspace(1.0, -0.5, 6).astype(dtype)
    gr = chain(x, record=True)
    gr()
    r = reverse(gr, {"result": seed}, ("x",))
    assert r["x"].dtype == dtype and r["x"].shape == (6,)
    close(r["x"], fd_grads(chain, {"x": x}, {"result": seed}, ["x"])["x"], RTOL[dtype], "chain vs fd")
    (jx,) = jax_vjp(lambda x: (2.0 * jwave(x) + 1.0) ** 2, [x], seed)
    close(r["x"], jx, JTOL[dtype], "chain vs jax")


@eagle.Graph.builder
def with_params(x, a, b, record=False):
    g = eagle.Graph(record=record)
    g.result = wave(affine(x, a, b))
    return g


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_one_cell_param_arguments_get_the_sum_over_samples(dtype):
    x = np.linspace(-1.0, 1.0, 5).astype(dtype)
    a, b = np.array([1.5], dtype), np.array([-0.25], dtype)
    seed = np.array([1.0, 2.0, -1.0, 0.5, 1.0], dtype)
    gr = with_params(x, a, b, record=True)
    gr()
    r = reverse(gr, {"result": seed}, ("x", "a", "b"))
    assert r["a"].shape == (1,) and r["a"].dtype == dtype
    fd = fd_grads(with_params, {"x": x, "a": a, "b": b}, {"result": seed}, ["x", "a", "b"])
    for k in "xab":
        close(r[k], fd[k], RTOL[dtype], f"d/d{k} vs fd")
    jx, ja, jb = jax_vjp(lambda x, a, b: jwave(a * x + b), [x, a, b], seed)
    for k, w in zip("xab", (jx, ja, jb)):
        close(r[k], w, JTOL[dtype], f"d/d{k} vs jax")


# ---------------------------------------------------------------------------------------------
# the tour's gradient section, with its numbers

def test_tour_model_numbers_and_fd():
    x, y = np.arange(4.0), np.zeros(4)
    gr = model(x, y, record=True)
    gr()
    ones = np.ones(4)
    r = eagle.diff.reverse(gr.record, {"result": ones}, wrt=("x", "a"))
    np.testing.assert_allclose(r["x"], [4.0, 12.0, 20.0, 28.0])
    np.testing.assert_allclose(r["a"], [2.0, 6.0, 10.0, 14.0])
    np.testing.assert_allclose(eagle.diff.reverse(gr.record, {"y": ones}, wrt=("x",))["x"], [2.0] * 4)
    np.testing.assert_allclose(eagle.diff.reverse(gr.record, {"a": ones}, wrt=("x",))["x"], [2.0] * 4)
    seeds = {"result": np.array([1.0, -1.0, 0.5, 2.0]), "y": np.array([0.5, 1.0, 3.0, -2.0])}
    r = eagle.diff.reverse(gr.record, seeds, wrt=("x", "y"))
    fd = fd_grads(model, {"x": x, "y": y}, seeds, ["x", "y"])
    close(r["x"], fd["x"], 1e-7, "x")
    np.testing.assert_array_equal(r["y"], np.zeros(4))     # y is overwritten without being read
    close(fd["y"], np.zeros(4), 1e-9)


# ---------------------------------------------------------------------------------------------
# the tour's "one graph with everything" (tour_builders.whole): fork + wait, blocks, a capped loop, a Mutable output

def _jwhole(x):
    a = 0.5 * x
    l = a + 1.0
    l2, r, r2 = 2.0 * l, l - 1.0, a ** 4

    def body(st):
        i, s, f = st
        s = s - l2 ** 4
        return i + 1, s, jnp.sum(s > 1.0) > 0
    _, s, _ = lax.while_loop(lambda st: (st[0] < 50) & st[2], body, (0, x, jnp.bool_(True)))
    return s, s + r + r2


def test_tour_whole_gradient_numbers():
    """The tour's numbers. Its `flag` was cleared by the runs of the plain graph before the recorded
    twin was built on the same cell, so the recorded launch runs the loop zero times (s = x)."""
    x, y = np.arange(8.0), np.zeros(8)
    gr = whole(x, cell(0), y, record=True)
    s = gr()
    np.testing.assert_array_equal(s, x)
    seeds = {"result": np.ones(8), "y": np.ones(8)}
    grads = eagle.diff.reverse(gr.record, seeds, wrt=("x",))
    np.testing.assert_allclose(grads["x"], [2.5, 2.75, 4.5, 9.25, 18.5, 33.75, 56.5, 88.25], rtol=1e-12)
    fd = fd_grads(whole, {"x": x, "flag": cell(0), "y": y}, seeds, ["x"], h=1e-5)
    close(grads["x"], fd["x"], 1e-7, "whole, no turn, vs fd")


def test_tour_whole_gradient_through_its_loop():
    x, y = np.arange(8.0) / 4.0, np.zeros(8)
    gr = whole(x, cell(1), y, record=True)
    s = gr()
    np.testing.assert_allclose(s, x - (x + 2.0) ** 4, rtol=1e-14)      # one turn: then every s <= 1
    seeds = {"result": np.linspace(1.0, 2.0, 8), "y": np.linspace(-1.0, 1.0, 8)}
    grads = eagle.diff.reverse(gr.record, seeds, wrt=("x",))
    fd = fd_grads(whole, {"x": x, "flag": cell(1), "y": y}, seeds, ["x"], h=1e-6)
    close(grads["x"], fd["x"], 1e-7, "whole vs fd")
    (jx,) = jax_vjp(_jwhole, [x], (seeds["result"], seeds["y"]), forward=True)
    close(grads["x"], jx, 1e-12, "whole vs jax")


# ---------------------------------------------------------------------------------------------
# forks with waits, and a result tree

@eagle.Graph.builder
def forks(x, record=False):
    g = eagle.Graph(record=record)
    a = dbl(x)
    with g.parallel() as p:
        with p.branch() as b:
            l = wave(a)
            l2 = dbl(l)
            with b.parallel() as q:
                with q.branch() as b1:
                    u = square(l2)
                with q.branch() as b2:
                    v = bell(l2)
        with p.branch() as w:
            w.wait(l)
            r = mix(l, a)
    g.result = {"uv": (u, [v]), "r": r}
    return g


def _jforks(x):
    a = 2.0 * x
    l = jwave(a)
    l2 = 2.0 * l
    return {"uv": (l2 * l2, [jbell(l2)]), "r": jmix(l, a)}


def test_forks_with_waits_and_a_result_tree():
    x = np.linspace(-0.6, 0.7, 5)
    gr = forks(x, record=True)
    out = gr()
    np.testing.assert_allclose(out["r"], _jforks(x)["r"], rtol=1e-13)
    rng = np.random.default_rng(0)
    seed = {"uv": (rng.normal(size=5), [rng.normal(size=5)]), "r": rng.normal(size=5)}
    r = reverse(gr, {"result": seed}, ("x",))
    close(r["x"], fd_grads(forks, {"x": x}, {"result": seed}, ["x"])["x"], 1e-7, "forks vs fd")
    (jx,) = jax_vjp(_jforks, [x], seed)
    close(r["x"], jx, 1e-12, "forks vs jax")
    # one leaf seeded, the others zero: only that path contributes
    zero = np.zeros(5)
    only_r = reverse(gr, {"result": {"uv": (zero, [zero]), "r": seed["r"]}}, ("x",))
    (jr,) = jax_vjp(lambda x: _jforks(x)["r"], [x], seed["r"])
    close(only_r["x"], jr, 1e-12, "r leaf only")


def test_result_tree_seed_of_another_structure_is_refused():
    x = np.linspace(-0.6, 0.7, 5)
    gr = forks(x, record=True)
    gr()
    with pytest.raises(ValueError, match="structure"):
        reverse(gr, {"result": {"uv": (np.ones(5), np.ones(5)), "r": np.ones(5)}}, ("x",))
    with pytest.raises(ValueError, match="structure"):
        reverse(gr, {"result": np.ones(5)}, ("x",))


# ---------------------------------------------------------------------------------------------
# if / elif / else and match: the arm that ran, then the other arms on the same recorded graph

@eagle.Graph.builder
def choose(x, flag, which, record=False):
    g = eagle.Graph(record=record)
    if flag:
        x = wave(x)
    elif which:
        x = bell(x)
    else:
        x = mix(x, x)
    x = square(x)
    g.result = x
    return g


def _jchoose(x, flag, which):
    def inner(x):
        return lax.cond(which != 0, jbell, lambda v: jmix(v, v), x)
    return lax.cond(flag != 0, jwave, inner, x) ** 2


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_cond_elif_else_each_arm(dtype):
    x = np.linspace(-1.2, 1.3, 6).astype(dtype)
    seed = np.linspace(0.5, 2.0, 6).astype(dtype)
    flag, which = cell(1), cell(1)
    gr = choose(x, flag, which, record=True)
    seen = []
    for f, w in ((1, 1), (0, 1), (0, 0), (1, 0)):
        flag[0], which[0] = f, w                   # the cells are read per replay: flip and rerun
        gr()
        r = reverse(gr, {"result": seed}, ("x",))["x"]
        assert r.dtype == dtype
        fd = fd_grads(choose, {"x": x, "flag": cell(f), "which": cell(w)}, {"result": seed}, ["x"])["x"]
        close(r, fd, RTOL[dtype], f"arm {f}{w} vs fd")
        (jx,) = jax_vjp(lambda x: _jchoose(x, f, w), [x], seed)
        close(r, jx, JTOL[dtype], f"arm {f}{w} vs jax")
        seen.append(r)
    assert not np.allclose(seen[0], seen[1]) and not np.allclose(seen[1], seen[2])
    np.testing.assert_array_equal(seen[0], seen[3])            # `which` does not matter when flag is set


def test_record_describes_the_arm_of_its_own_launch():
    """A record copied before a flip still reverses the arm it recorded."""
    x = np.linspace(-1.2, 1.3, 6)
    flag, which = cell(1), cell(0)
    gr = choose(x, flag, which, record=True)
    gr()
    kept = gr.record.copy()
    flag[0] = 0
    gr()
    seed = np.ones(6)
    (j1,) = jax_vjp(lambda x: _jchoose(x, 1, 0), [x], seed)
    (j0,) = jax_vjp(lambda x: _jchoose(x, 0, 0), [x], seed)
    close(eagle.diff.reverse(kept, {"result": seed}, wrt="x")["x"], j1, 1e-12, "kept record: the wave arm")
    close(eagle.diff.reverse(gr.record, {"result": seed}, wrt="x")["x"], j0, 1e-12, "new record: the else arm")


@eagle.Graph.builder
def chooser(x, sel, record=False):
    g = eagle.Graph(record=record)
    match sel:
        case 0:
            x = wave(x)
        case 2:
            x = bell(x)
        case _:
            x = mix(x, x)
    g.result = dbl(x)
    return g


def _jchooser(x, sel):
    idx = {0: 0, 2: 1}.get(sel, 2)
    return 2.0 * lax.switch(idx, [jwave, jbell, lambda v: jmix(v, v)], x)


def test_match_each_case_on_one_recorded_graph():
    x = np.linspace(-1.0, 1.5, 5)
    sel = cell(0)
    gr = chooser(x, sel, record=True)
    seed = np.array([1.0, -2.0, 0.5, 1.5, 1.0])
    grads = {}
    for s in (0, 2, 5, 1, 0):
        sel[0] = s
        gr()
        r = reverse(gr, {"result": seed}, ("x",))["x"]
        close(r, fd_grads(chooser, {"x": x, "sel": cell(s)}, {"result": seed}, ["x"])["x"], 1e-7, f"case {s} fd")
        (jx,) = jax_vjp(lambda x: _jchooser(x, s), [x], seed)
        close(r, jx, 1e-12, f"case {s} jax")
        grads.setdefault(s, r)
    np.testing.assert_array_equal(grads[5], grads[1])           # both take the default
    assert not np.allclose(grads[0], grads[2]) and not np.allclose(grads[2], grads[5])


# ---------------------------------------------------------------------------------------------
# loops

@eagle.Graph.builder
def capped(x, c, flag, record=False):
    g = eagle.Graph(record=record)
    k = wave(c)                                  # read by every turn: its cotangent sums over turns
    for _ in range(50):
        if not flag: break
        x = mix(grow(x), k)
        below(x, 20.0, flag)
    g.result = x
    return g


def _jcapped(x, c, lim=20.0, cap=50):
    k = jwave(c)

    def body(st):
        i, x, _ = st
        x = jmix(jgrow(x), k)
        return i + 1, x, jnp.sum(x < lim) > 0
    i, x, _ = lax.while_loop(lambda st: (st[0] < cap) & st[2], body, (0, x, jnp.bool_(True)))
    return x, i


def _turns(x, c):
    return int(jax.jit(lambda x, c: _jcapped(x, c)[1])(x, c))


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_capped_loop_with_a_data_dependent_trip_count(dtype):
    c = np.array([1.1, 1.2, 1.3, 1.4]).astype(dtype)
    seed = np.array([1.0, 0.5, -1.0, 2.0], dtype)
    x0 = np.array([0.5, 0.6, 0.7, 0.8], dtype)
    gr = capped(x0.copy(), c, cell(1), record=True)
    trips = []
    for x in (x0, x0 * 3.0, x0 + 5.0):          # rebind: another start, another trip count
        x = x.astype(dtype)
        gr.bind(x=x, flag=cell(1))
        gr()
        r = reverse(gr, {"result": seed}, ("x", "c"))
        assert r["x"].dtype == dtype
        fd = fd_grads(capped, {"x": x, "c": c, "flag": cell(1)}, {"result": seed}, ["x", "c"])
        close(r["x"], fd["x"], RTOL[dtype], "capped d/dx vs fd")
        close(r["c"], fd["c"], RTOL[dtype], "capped d/dc vs fd")
        jx, jc = jax_vjp(lambda x, c: _jcapped(x, c)[0], [x, c], seed, forward=True)
        close(r["x"], jx, JTOL[dtype] * 10, "capped d/dx vs jax")
        close(r["c"], jc, JTOL[dtype] * 10, "capped d/dc vs jax")
        trips.append(_turns(x.astype(np.float64), c.astype(np.float64)))
    assert len(set(trips)) == 3 and min(trips) >= 1, trips


@eagle.Graph.builder
def counted(x, n, record=False):
    g = eagle.Graph(record=record)
    for i in range(n):
        x = wave(grow(x))
    g.result = x
    return g


def _jcounted(x, n):
    return lax.fori_loop(0, n, lambda i, x: jwave(jgrow(x)), x)


def test_counted_loop_reads_its_trip_count_per_replay():
    x = np.linspace(0.3, 1.1, 5)
    n = cell(4)
    gr = counted(x, n, record=True)
    seed = np.linspace(1.0, 2.0, 5)
    for turns in (4, 2, 0, 3):
        n[0] = turns
        out = gr()
        close(out, _jcounted(x, turns), 1e-13)
        r = reverse(gr, {"result": seed}, ("x",))["x"]
        close(r, fd_grads(counted, {"x": x, "n": cell(turns)}, {"result": seed}, ["x"])["x"], 1e-7, f"{turns} fd")
        (jx,) = jax_vjp(lambda x: _jcounted(x, turns), [x], seed, forward=True)
        close(r, jx, 1e-12, f"{turns} turns vs jax")
        if turns == 0:
            np.testing.assert_array_equal(r, seed)


@eagle.Graph.builder
def early_exit(x, flag, done, record=False):
    g = eagle.Graph(record=record)
    for _ in range(20):
        if not flag: break
        x = grow(inc(x))
        over(x, 2.5, done)
        if done: break                     # mid-body: skips the rest of this turn and leaves
        x = wave(x)
        below(x, 50.0, flag)
    g.result = x
    return g


def _jearly(x):
    def body(st):
        i, x, flag, done = st
        x = jgrow(x + 1.0)
        done = jnp.sum(x > 2.5) > 0
        x, flag = lax.cond(done, lambda x: (x, flag), lambda x: (jwave(x), jnp.sum(jwave(x) < 50.0) > 0), x)
        return i + 1, x, flag, done
    _, x, _, _ = lax.while_loop(lambda st: (st[0] < 20) & st[2] & ~st[3], body,
                                (0, x, jnp.bool_(True), jnp.bool_(False)))
    return x


@eagle.Graph.builder
def skipping(x, flag, skip, record=False):
    g = eagle.Graph(record=record)
    for _ in range(20):
        if not flag: break
        x = grow(x)
        below(x, 6.0, flag)
        over(x, 2.5, skip)
        if skip: continue                  # mid-body: skips the rest of this turn only
        x = wave(x)
    g.result = x
    return g


def _jskipping(x):
    def body(st):
        i, x, _ = st
        x = jgrow(x)
        flag = jnp.sum(x < 6.0) > 0
        x = lax.cond(jnp.sum(x > 2.5) > 0, lambda x: x, jwave, x)
        return i + 1, x, flag
    _, x, _ = lax.while_loop(lambda st: (st[0] < 20) & st[2], body, (0, x, jnp.bool_(True)))
    return x


@pytest.mark.parametrize("x0", [[0.8, 0.9, 1.0], [0.1, 0.2, 0.3], [-0.9, -0.8, -0.7]])   # break in turn 0, 1, 2
def test_mid_body_break(x0):
    x = np.array(x0)
    gr = early_exit(x, cell(1), cell(0), record=True)
    out = gr()
    close(out, _jearly(x), 1e-13, "forward")
    seed = np.array([1.0, -0.5, 2.0])
    r = reverse(gr, {"result": seed}, ("x",))["x"]
    close(r, fd_grads(early_exit, {"x": x, "flag": cell(1), "done": cell(0)}, {"result": seed}, ["x"])["x"],
          1e-6, "break vs fd")
    (jx,) = jax_vjp(_jearly, [x], seed, forward=True)
    close(r, jx, 1e-11, "break vs jax")


@pytest.mark.parametrize("x0", [[0.1, 0.2, 0.3], [0.5, 0.8, 1.2]])
def test_mid_body_continue(x0):
    x = np.array(x0)
    gr = skipping(x, cell(1), cell(0), record=True)
    out = gr()
    close(out, _jskipping(x), 1e-13, "forward")
    seed = np.array([1.0, -0.5, 2.0])
    r = reverse(gr, {"result": seed}, ("x",))["x"]
    close(r, fd_grads(skipping, {"x": x, "flag": cell(1), "skip": cell(0)}, {"result": seed}, ["x"])["x"],
          1e-6, "continue vs fd")
    (jx,) = jax_vjp(_jskipping, [x], seed, forward=True)
    close(r, jx, 1e-11, "continue vs jax")


# ---------------------------------------------------------------------------------------------
# buffers

@eagle.Graph.builder
def keep(x, record=False):
    g = eagle.Graph(record=record)
    mine = np.zeros(4)
    a = wave(x, buffer=True)
    b = mix(a, x, buffer=mine)
    g.result = {"a": a, "pair": (b, [square(b)])}
    return g


def test_buffers_as_wrt_and_as_seeds():
    x = np.array([0.3, -0.7, 1.1, 0.9])
    gr = keep(x, record=True)
    gr()
    rng = np.random.default_rng(1)
    sa, sb, sq = rng.normal(size=4), rng.normal(size=4), rng.normal(size=4)
    seed = {"a": sa, "pair": (sb, [sq])}
    r = reverse(gr, {"result": seed}, ("x", "a", "b"))

    def jf(x):
        a = jwave(x)
        b = jmix(a, x)
        return {"a": a, "pair": (b, [b * b])}
    (jx,) = jax_vjp(jf, [x], seed)
    close(r["x"], jx, 1e-12, "x")
    close(r["x"], fd_grads(keep, {"x": x}, {"result": seed}, ["x"])["x"], 1e-7, "x vs fd")
    b = jmix(jwave(x), x)
    # the cotangent that reaches b: its own seed plus square's; a: its seed plus what flows back from b
    close(r["b"], sb + 2.0 * np.asarray(b) * sq, 1e-12, "buffer b")
    (ja,) = jax_vjp(lambda a: {"a": a, "pair": (jmix(a, x), [jmix(a, x) ** 2])}, [jwave(x)], seed)
    close(r["a"], ja, 1e-12, "buffer a")
    # seeding a buffer by its name is seeding that value
    by_name = reverse(gr, {"b": sb}, ("x", "a"))
    (jb,) = jax_vjp(lambda x: jmix(jwave(x), x), [x], sb)
    close(by_name["x"], jb, 1e-12, "seed b")
    close(by_name["a"], np.asarray(x) * sb + np.cos(np.asarray(jwave(x))) * sb, 1e-12, "seed b, wrt a")
    both = reverse(gr, {"a": sa, "result": {"a": sa, "pair": (np.zeros(4), [np.zeros(4)])}}, ("x",))
    (j2,) = jax_vjp(jwave, [x], 2.0 * sa)
    close(both["x"], j2, 1e-12, "a seeded twice adds")


# ---------------------------------------------------------------------------------------------
# Mutable arguments: seed 'y' = its final value; wrt 'y' = its value on entry

@eagle.Graph.builder
def mutating(x, y, record=False):
    g = eagle.Graph(record=record)
    s = wave(x)
    blend(s, y)                  # y <- y * s + sin(s)
    blend(x, y)                  # y <- y * x + sin(x)
    g.result = square(y)         # reads the final y
    return g


def _jmutating(x, y):
    s = jwave(x)
    y = y * s + jnp.sin(s)
    y = y * x + jnp.sin(x)
    return y * y, y


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_mutable_argument_seed_and_wrt(dtype):
    x = np.array([0.3, -0.7, 1.1, 0.9, 0.2], dtype)
    y0 = np.array([1.0, 2.0, -1.0, 0.5, 0.25], dtype)
    y = y0.copy()
    gr = mutating(x, y, record=True)
    gr()
    np.testing.assert_allclose(y, np.asarray(_jmutating(x.astype(np.float64), y0.astype(np.float64))[1]),
                               rtol=1e-5 if dtype == np.float32 else 1e-14)
    sr, sy = np.linspace(1, 2, 5).astype(dtype), np.linspace(-1, 1, 5).astype(dtype)
    for seeds, oracle_seed in (({"result": sr}, (sr, np.zeros(5))), ({"y": sy}, (np.zeros(5), sy)),
                               ({"result": sr, "y": sy}, (sr, sy))):
        r = reverse(gr, {k: v for k, v in seeds.items()}, ("x", "y"))
        assert r["y"].dtype == dtype and r["y"].shape == (5,)
        jx, jy = jax_vjp(_jmutating, [x, y0], oracle_seed)
        close(r["x"], jx, JTOL[dtype], f"{list(seeds)} d/dx vs jax")
        close(r["y"], jy, JTOL[dtype], f"{list(seeds)} d/dy(entry) vs jax")
        fd = fd_grads(mutating, {"x": x, "y": y0}, seeds, ["x", "y"])
        close(r["x"], fd["x"], RTOL[dtype], f"{list(seeds)} d/dx vs fd")
        close(r["y"], fd["y"], RTOL[dtype], f"{list(seeds)} d/dy vs fd")


@eagle.Graph.builder
def mutating_loop(x, y, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(30):
        if not flag: break
        blend(x, y)                  # a loop carry in the caller's buffer
        over(y, -3.0, flag)          # runs while some y is above -3
    g.result = wave(y)
    return g


def _jmutating_loop(x, y):
    def body(st):
        i, y, _ = st
        y = y * x + jnp.sin(x)
        return i + 1, y, jnp.sum(y > -3.0) > 0
    _, y, _ = lax.while_loop(lambda st: (st[0] < 30) & st[2], body, (0, y, jnp.bool_(True)))
    return jwave(y), y


def test_mutable_argument_written_in_place_by_a_loop():
    x = np.array([-1.2, -1.4, -1.3, -1.25])
    y0 = np.array([0.5, 0.1, -0.2, 0.3])
    y = y0.copy()
    gr = mutating_loop(x, y, cell(1), record=True)
    gr()
    np.testing.assert_allclose(y, np.asarray(_jmutating_loop(x, y0)[1]), rtol=1e-13)
    sr, sy = np.array([1.0, 0.5, -0.5, 2.0]), np.array([0.25, -1.0, 1.0, 0.5])
    r = reverse(gr, {"result": sr, "y": sy}, ("x", "y"))
    jx, jy = jax_vjp(_jmutating_loop, [x, y0], (sr, sy), forward=True)
    close(r["x"], jx, 1e-11, "d/dx vs jax")
    close(r["y"], jy, 1e-11, "d/dy vs jax")
    fd = fd_grads(mutating_loop, {"x": x, "y": y0, "flag": cell(1)}, {"result": sr, "y": sy}, ["x", "y"])
    close(r["x"], fd["x"], 1e-6, "d/dx vs fd")
    close(r["y"], fd["y"], 1e-6, "d/dy vs fd")


# ---------------------------------------------------------------------------------------------
# the gradient is linear in the seeds, and reverse does not disturb the run

def test_reverse_is_linear_in_the_seed_and_leaves_the_graph_alone():
    x = np.linspace(-0.6, 0.7, 5)
    gr = forks(x, record=True)
    gr()
    before = {k: np.array(v) for k, v in [("r", gr.result["r"]), ("u", gr.result["uv"][0])]}
    rng = np.random.default_rng(2)
    s1 = {"uv": (rng.normal(size=5), [rng.normal(size=5)]), "r": rng.normal(size=5)}
    s2 = {"uv": (rng.normal(size=5), [rng.normal(size=5)]), "r": rng.normal(size=5)}
    s12 = jax.tree_util.tree_map(lambda a, b: 2.0 * a - 3.0 * b, s1, s2)
    g1, g2, g12 = (reverse(gr, {"result": s}, ("x",))["x"] for s in (s1, s2, s12))
    close(g12, 2.0 * g1 - 3.0 * g2, 1e-12)
    again = reverse(gr, {"result": s1}, ("x",))["x"]
    np.testing.assert_array_equal(again, g1)
    np.testing.assert_array_equal(gr.result["r"], before["r"])
    np.testing.assert_array_equal(gr.result["uv"][0], before["u"])


# ---------------------------------------------------------------------------------------------
# nesting: a counted loop and a match inside a capped loop; a Mutable written in one arm only

@hawk.kernel
def scaled(x: Scalar, k: Param) -> Scalar:        # k: the turn counter cell of a counted loop
    return x * (1.0 + 0.1 * k) + 0.1 * hm.sin(x)


@eagle.Graph.builder
def nested(x, a, flag, n, record=False):
    g = eagle.Graph(record=record)
    for _ in range(6):
        if not flag: break
        for i in range(n):                 # its trip count: a builder argument, read inside the outer body
            x = scaled(x, i)
        match flag:
            case 1:
                x = mix(x, a)
            case _:
                x = dbl(x)
        below(x, 3.0, flag)
    g.result = x
    return g


def _jnested(x, a, n):
    def outer(st):
        t, x, flag = st                   # flag: how many samples are below 3 (the guard cell's value)
        x = lax.fori_loop(0, n, lambda i, x: x * (1.0 + 0.1 * i) + 0.1 * jnp.sin(x), x)
        x = lax.switch(jnp.where(flag == 1, 0, 1), [lambda x: jmix(x, a), lambda x: 2.0 * x], x)
        return t + 1, x, jnp.sum(x < 3.0)
    _, x, _ = lax.while_loop(lambda st: (st[0] < 6) & (st[2] > 0), outer, (0, x, 1))
    return x


def test_counted_loop_nested_in_a_capped_loop():
    """The inner trip count is a builder argument seen through the outer body's inputs; recording
    used to refuse it as 'computed in the graph'."""
    x, a = np.array([0.1, 0.2, 0.3]), np.array([0.9])
    n = cell(2)
    gr = nested(x, a, cell(1), n, record=True)
    seed = np.array([1.0, -1.0, 0.5])
    for turns in (2, 1, 3):                   # 3: more than at build; the saved turns grow
        n[0] = turns
        gr.bind(flag=cell(1))
        out = gr()
        close(out, _jnested(x, a, turns), 1e-13, "forward")
        r = reverse(gr, {"result": seed}, ("x", "a"))
        fd = fd_grads(nested, {"x": x, "a": a, "flag": cell(1), "n": cell(turns)}, {"result": seed}, ["x", "a"])
        jx, ja = jax_vjp(lambda x, a: _jnested(x, a, turns), [x, a], seed, forward=True)
        for k, w in (("x", jx), ("a", ja)):
            close(r[k], fd[k], 1e-6, f"{turns}: d/d{k} vs fd")
            close(r[k], w, 1e-11, f"{turns}: d/d{k} vs jax")


@eagle.Graph.builder
def arm_writes(x, y, flag, record=False):
    g = eagle.Graph(record=record)
    if flag:
        blend(x, y)                      # y written in this arm only
    else:
        s = wave(x)
    g.result = mix(y, x)
    return g


def test_mutable_written_in_one_arm_only():
    x, y = np.array([0.1, 0.7, -0.3]), np.array([1.0, 2.0, 0.5])
    seeds = {"result": np.array([1.0, 0.5, 2.0]), "y": np.array([-1.0, 1.0, 0.5])}
    flag = cell(1)
    gr = arm_writes(x, y.copy(), flag, record=True)
    for f in (1, 0):
        flag[0] = f
        gr.bind(y=y.copy())
        gr()
        r = reverse(gr, seeds, ("x", "y"))

        def jf(x, y):
            y = lax.cond(f != 0, lambda y: y * x + jnp.sin(x), lambda y: y, y)
            return jmix(y, x), y
        jx, jy = jax_vjp(jf, [x, y], (seeds["result"], seeds["y"]))
        fd = fd_grads(arm_writes, {"x": x, "y": y, "flag": cell(f)}, seeds, ["x", "y"])
        for k, w in (("x", jx), ("y", jy)):
            close(r[k], w, 1e-12, f"arm {f}: d/d{k} vs jax")
            close(r[k], fd[k], 1e-7, f"arm {f}: d/d{k} vs fd")


@eagle.Graph.builder
def passthrough(x, record=False):
    g = eagle.Graph(record=record)
    d = dbl(x)
    g.result = (x, d, [d])                   # an argument itself, and one plane twice
    return g


def test_result_leaves_that_are_an_argument_or_repeated():
    x = np.array([0.1, 0.7, -0.3])
    gr = passthrough(x, record=True)
    gr()
    r = reverse(gr, {"result": (np.full(3, 1.0), np.full(3, 2.0), [np.full(3, 3.0)]), "x": np.full(3, 0.5)}, ("x",))
    np.testing.assert_array_equal(r["x"], np.full(3, 1.0 + 2.0 * 2.0 + 2.0 * 3.0 + 0.5))


@eagle.Graph.builder
def hits_cap(x, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(3):
        if not flag: break
        x = wave(inc(x))
        below(x, 100.0, flag)                # never clears: the cap ends the loop
    g.result = x
    return g


def test_loop_that_ends_at_its_cap():
    x = np.array([0.1, 0.2, 0.3])
    gr = hits_cap(x, cell(1), record=True)
    gr()

    def jf(x):
        return lax.fori_loop(0, 3, lambda i, x: jwave(x + 1.0), x)
    seed = np.array([1.0, 2.0, 3.0])
    r = reverse(gr, {"result": seed}, ("x",))["x"]
    close(r, jax_vjp(jf, [x], seed)[0], 1e-12, "vs jax")
    close(r, fd_grads(hits_cap, {"x": x, "flag": cell(1)}, {"result": seed}, ["x"])["x"], 1e-7, "vs fd")


@eagle.Graph.builder
def replayed(x, y, record=False):
    g = eagle.Graph(record=record)
    blend(x, y)
    g.result = wave(y)
    return g


def test_record_describes_the_last_of_several_replays():
    """g(3) runs three replays; the record is the last one's: y's entry value is y after two."""
    x, y0 = np.array([0.1, 0.7, -0.3]), np.array([1.0, 2.0, 0.5])
    gr = replayed(x, y0.copy(), record=True)
    gr(3)
    y2 = y0
    for _ in range(2):
        y2 = y2 * x + np.sin(x)
    seed = np.array([1.0, -1.0, 2.0])
    r = reverse(gr, {"result": seed}, ("x", "y"))
    jx, jy = jax_vjp(lambda x, y: jwave(y * x + jnp.sin(x)), [x, y2], seed)
    close(r["x"], jx, 1e-12, "x")
    close(r["y"], jy, 1e-12, "y on entry to the last replay")


@hawk.kernel
def rot(v: hawk.Vector[3], s: Scalar) -> hawk.Vector[3]:
    return hm.cross(v, hm.vec(s, 1.0, s * s)) + v * hm.norm(v)


@hawk.kernel
def vdot(v: hawk.Vector[3], w: hawk.Vector[3]) -> Scalar:
    return hm.dot(v, w)


@eagle.Graph.builder
def vectors(v, s, flag, record=False):
    g = eagle.Graph(record=record)
    w = rot(v, s)
    for _ in range(5):
        if not flag: break
        w = rot(w, s)
        below(vdot(w, w), 30.0, flag)
    g.result = vdot(w, v)
    return g


def _jvectors(v, s):
    def jrot(v, s):
        return jnp.cross(v, jnp.stack([s, jnp.ones_like(s), s * s]), axis=0) + v * jnp.linalg.norm(v, axis=0)

    def body(st):
        i, w, _ = st
        w = jrot(w, s)
        return i + 1, w, jnp.sum(jnp.sum(w * w, axis=0) < 30.0) > 0
    _, w, _ = lax.while_loop(lambda st: (st[0] < 5) & st[2], body, (0, jrot(v, s), jnp.bool_(True)))
    return jnp.sum(w * v, axis=0)


def test_vector_planes_through_a_loop():
    v = np.random.default_rng(0).normal(size=(3, 4)) * 0.5
    s = np.array([0.1, 0.2, 0.3, 0.4])
    gr = vectors(v, s, cell(1), record=True)
    out = gr()
    close(out, _jvectors(v, s), 1e-13, "forward")
    seed = np.array([1.0, 0.5, -1.0, 2.0])
    r = reverse(gr, {"result": seed}, ("v", "s"))
    assert r["v"].shape == (3, 4)
    jv, js = jax_vjp(_jvectors, [v, s], seed, forward=True)
    fd = fd_grads(vectors, {"v": v, "s": s, "flag": cell(1)}, {"result": seed}, ["v", "s"])
    for k, w in (("v", jv), ("s", js)):
        close(r[k], w, 1e-11, f"d/d{k} vs jax")
        close(r[k], fd[k], 1e-6, f"d/d{k} vs fd")


@eagle.Graph.builder
def mixed_dtypes(x, y, record=False):
    g = eagle.Graph(record=record)
    g.result = mix(wave(x), y)               # float32 x meets float64 y: the result is float64
    return g


def test_mixed_dtypes_give_each_argument_its_own_dtype():
    x, y = np.array([0.1, 0.2, 0.3], np.float32), np.array([1.0, 2.0, 3.0])
    gr = mixed_dtypes(x, y, record=True)
    assert gr().dtype == np.float64
    seed = np.array([1.0, -1.0, 0.5])
    r = reverse(gr, {"result": seed}, ("x", "y"))
    assert r["x"].dtype == np.float32 and r["y"].dtype == np.float64
    jx, jy = jax_vjp(lambda x, y: jmix(jwave(x), y), [x, y], seed)
    close(r["x"], jx, 1e-6, "x")
    close(r["y"], jy, 1e-7, "y")


@eagle.Graph.builder
def shifts(x, record=False):
    g = eagle.Graph(record=record)
    g.result = inc(inc(x))
    return g


def test_reverse_hands_back_fresh_arrays():
    """The backward of inc passes its cotangent through; the gradient must not be the seed itself."""
    x = np.linspace(0.0, 1.0, 4)
    gr = shifts(x, record=True)
    gr()
    seed = np.array([1.0, 2.0, 3.0, 4.0])
    r = reverse(gr, {"result": seed}, ("x",))["x"]
    np.testing.assert_array_equal(r, seed)
    assert not np.shares_memory(r, seed)
    seed[:] = -1.0
    np.testing.assert_array_equal(r, [1.0, 2.0, 3.0, 4.0])
    r2 = reverse(gr, {"result": np.ones(4)}, ("x",))["x"]     # only the seed changed (no new launch)
    np.testing.assert_array_equal(r2, np.ones(4))
    r2 += 1.0


def test_result_seed_dict_matches_by_key_in_any_order():
    """{'r': .., 'uv': ..} seeds the same leaves as {'uv': .., 'r': ..}; it used to be refused as
    another structure (jax.tree_util and sorted dicts put keys in another order)."""
    x = np.linspace(-0.6, 0.7, 5)
    gr = forks(x, record=True)
    gr()
    u, v, r = np.full(5, 1.0), np.full(5, -2.0), np.full(5, 0.5)
    a = reverse(gr, {"result": {"uv": (u, [v]), "r": r}}, ("x",))["x"]
    b = reverse(gr, {"result": {"r": r, "uv": (u, [v])}}, ("x",))["x"]
    np.testing.assert_array_equal(a, b)
    (jx,) = jax_vjp(_jforks, [x], {"uv": (u, [v]), "r": r})
    close(a, jx, 1e-12)
