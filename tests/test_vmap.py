"""eagle_fx.vmap: a batched graph equals a Python loop over its instances (the oracle), for every
control-flow form, with shared (in_axes None) and per-instance (in_axes 0) conditions."""
import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, Vector
from hawk_fx import math as hm
from tour_kernels import below, dbl, inc, over

pytestmark = pytest.mark.usefixtures("backend")     # every test on numpy and on jax


@hawk.kernel
def centre(x: Scalar) -> Scalar:
    return x - hawk.mean(x)          # a sample reduction: per instance under vmap


@hawk.kernel
def acc(s: Scalar, y: Mutable[Scalar]):
    y = y + s


@hawk.kernel
def vnorm(v: Vector[3], w: Param) -> Scalar:
    return w * hm.norm(v)


def cell(v):
    return np.array([v], np.uint32)


@eagle.Graph.builder
def capped(x, flag, lim):
    g = eagle.Graph()
    for _ in range(50):
        if not flag:
            break
        x = dbl(x)
        below(x, lim, flag)
    g.result = x
    return g


@eagle.Graph.builder
def branchy(x, c, which):
    g = eagle.Graph()
    if c:
        x = dbl(x)
    elif which:
        x = centre(x)
    else:
        x = inc(x)
    g.result = x
    return g


@eagle.Graph.builder
def chooser(x, sel):
    g = eagle.Graph()
    match sel:
        case 0:
            x = dbl(x)
        case 2:
            x = inc(x)
        case _:
            x = centre(x)
    g.result = x
    return g


@eagle.Graph.builder
def counted(x, n):
    g = eagle.Graph()
    for i in range(n):
        x = inc(dbl(x))
    g.result = x
    return g


@eagle.Graph.builder
def breaking(x, flag, done, y):
    g = eagle.Graph()
    while flag:
        x = inc(x)
        over(x, 6.0, done)
        if done:
            break
        x = dbl(x)
        acc(x, y)
        below(x, 50.0, flag)
    g.result = {"x": x, "c": centre(x)}
    return g


@eagle.Graph.builder
def vec_graph(v, w):
    g = eagle.Graph()
    g.result = vnorm(v, w)
    return g


def loop_oracle(builder, per_instance, B):
    """Build and run the unbatched graph once per instance (fresh copies of every array)."""
    outs = []
    for b in range(B):
        args = [a(b) for a in per_instance]
        outs.append(builder(*args)())
    return outs


B, N = 6, 5
rng = np.random.default_rng(0)


def test_capped_loop_with_per_instance_guards_runs_until_all_are_done():
    xs = rng.random((B, N)) + 0.5
    lims = np.array([1.0, 10.0, 100.0, 3.0, 1000.0, 0.1])
    flags = np.ones((B, 1), np.uint32)
    got = eagle.vmap(capped)(xs, flags, lims)()
    want = loop_oracle(capped, [lambda b: xs[b].copy(), lambda b: cell(1), lambda b: lims[b:b + 1].copy()], B)
    np.testing.assert_allclose(got, np.stack(want))
    assert not flags.any()          # each instance's guard, written in place, ends at 0


def test_a_batched_param_read_in_a_loop_follows_its_array_between_replays():
    # the loop reads each instance's lim spread over its samples, made before the loop at every
    # replay: changing lims in place between replays changes the turns
    xs = rng.random((B, N)) + 0.5
    lims = np.array([1.0, 10.0, 100.0, 3.0, 1000.0, 0.1])
    flags = np.ones((B, 1), np.uint32)
    x0 = xs.copy()
    g = eagle.vmap(capped)(xs, flags, lims)
    g()
    lims *= 7.0
    xs[...] = x0
    flags[...] = 1
    got = g()
    want = loop_oracle(capped, [lambda b: x0[b].copy(), lambda b: cell(1), lambda b: lims[b:b + 1].copy()], B)
    np.testing.assert_allclose(got, np.stack(want))


@pytest.mark.parametrize("c_axis", [0, None])
def test_cond_elif_else_shared_and_per_instance(c_axis):
    xs = rng.random((B, N))
    cs = rng.integers(0, 2, (B, 1)).astype(np.uint32)
    ws = rng.integers(0, 2, (B, 1)).astype(np.uint32)
    c_arg = cs if c_axis == 0 else cell(1)
    got = eagle.vmap(branchy, in_axes=(0, c_axis, 0))(xs, c_arg, ws)()
    want = loop_oracle(branchy, [lambda b: xs[b].copy(),
                                 lambda b: cs[b].copy() if c_axis == 0 else cell(1),
                                 lambda b: ws[b].copy()], B)
    np.testing.assert_allclose(got, np.stack(want))


def test_match_on_per_instance_cells():
    xs = rng.random((B, N))
    sels = np.array([[0], [2], [5], [0], [2], [1]], np.uint32)
    got = eagle.vmap(chooser)(xs, sels)()
    want = loop_oracle(chooser, [lambda b: xs[b].copy(), lambda b: sels[b].copy()], B)
    np.testing.assert_allclose(got, np.stack(want))


def test_counted_loop_with_per_instance_trip_counts():
    xs = rng.random((B, N))
    trips = np.array([[0], [1], [3], [2], [5], [1]], np.uint32)
    got = eagle.vmap(counted)(xs, trips)()
    want = loop_oracle(counted, [lambda b: xs[b].copy(), lambda b: trips[b].copy()], B)
    np.testing.assert_allclose(got, np.stack(want))


def test_mid_body_break_and_mutable_written_per_instance():
    xs = rng.random((B, N)) * 3
    ys = np.zeros((B, N))
    g = eagle.vmap(breaking)(xs, np.ones((B, 1), np.uint32), np.zeros((B, 1), np.uint32), ys)
    got = g()
    want_y = []
    want = []
    for b in range(B):
        y = np.zeros(N)
        want.append(breaking(xs[b].copy(), cell(1), cell(0), y)())
        want_y.append(y)
    np.testing.assert_allclose(got["x"], np.stack([w["x"] for w in want]))
    np.testing.assert_allclose(got["c"], np.stack([w["c"] for w in want]))
    np.testing.assert_allclose(ys, np.stack(want_y))


def test_vector_planes_and_batched_params():
    vs = rng.random((B, 3, N))
    ws = rng.random(B)                          # Params batched as (B,)
    got = eagle.vmap(vec_graph)(vs, ws)()
    want = np.stack([ws[b] * np.linalg.norm(vs[b], axis=0) for b in range(B)])
    np.testing.assert_allclose(got, want)


def test_shared_argument_and_replays_follow_cells():
    xs = rng.random((B, N))
    c = cell(1)
    g = eagle.vmap(branchy, in_axes=(0, None, None))(xs, c, cell(0))
    np.testing.assert_allclose(g(), 2 * xs)
    c[0] = 0                                      # a shared cell is still read at every replay
    np.testing.assert_allclose(g(), xs + 1)
    assert "cond" in str(g.program) and "f64[6,5]" in str(g.program)


def test_refusals():
    xs = rng.random((B, N))
    with pytest.raises(ValueError, match="mismatched batch sizes"):
        eagle.vmap(branchy)(xs, np.ones((B + 1, 1), np.uint32), np.ones((B, 1), np.uint32))
    with pytest.raises(ValueError, match="in_axes has 2 entries for 3"):
        eagle.vmap(branchy, in_axes=(0, None))(xs, cell(1), cell(0))
    with pytest.raises(ValueError, match="only axis is the cell"):
        eagle.vmap(branchy, in_axes=(0, 0, None))(xs, cell(1), cell(0))
    with pytest.raises(ValueError, match="shared by all instances"):
        eagle.vmap(capped, in_axes=(0, None, None))(xs, cell(1), np.array([10.0]))

    @eagle.Graph.builder
    def hosted(x, y):
        g = eagle.Graph()
        g.add_node(eagle.opaque(lambda: None, reads={"x": x}, writes={"y": y}))
        g.result = inc(y)
        return g
    with pytest.raises(ValueError, match="host node"):
        eagle.vmap(hosted)(xs, np.zeros((B, N)))


def test_other_out_axes_and_keywords_are_refused():
    xs = rng.random((2, 3, N))
    with pytest.raises(ValueError, match="out_axes 1"):
        eagle.vmap(branchy, out_axes=1)
    with pytest.raises(TypeError, match="positionally"):
        eagle.vmap(branchy)(xs[0], c=np.ones((3, 1), np.uint32), which=np.ones((3, 1), np.uint32))


def test_masked_loops_print_as_masked():
    g = eagle.vmap(capped)(rng.random((B, N)), np.ones((B, 1), np.uint32), np.ones(B))
    assert "masked=True" in str(g.program)
