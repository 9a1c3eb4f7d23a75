"""Buffers, result trees, graphs without a result, the running verbs (g(), g(n), launch, enqueue,
synchronize, g.result), repr and the printed Program; and bind. References are plain NumPy."""
import re

import numpy as np
import pytest

import eagle_fx
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar
from tour_kernels import accumulate, add, affine, below, cell, dbl, inc, square


@hawk.kernel
def bump(s: Scalar, y: Mutable[Scalar]):        # y grows by s at every replay
    y = y + s


# ---------------------------------------------------------------------------------------------
# buffers and result trees

@eagle_fx.Graph.builder
def keep(x, mine):
    g = eagle_fx.Graph()
    a = inc(x, buffer=True)
    b = dbl(a, buffer=mine)
    c = square(b)
    d = affine(c, 0.5, -1.0)
    g.result = {"a": a, "pair": (b, [square(b), {"deep": (d,)}]), "x": x}
    return g


def ref_keep(x):
    a = x + 1.0
    b = 2.0 * a
    d = 0.5 * (b * b) - 1.0
    return {"a": a, "pair": (b, [b * b, {"deep": (d,)}]), "x": x}


def assert_tree_equal(got, want):
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_tree_equal(got[k], want[k])
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_tree_equal(a, b)
    else:
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_buffers_and_a_nested_result_tree():
    x0, mine = np.array([0.0, 1.5, -2.0, 3.0]), np.zeros(4)
    g = keep(x0, mine)
    res = g()
    assert_tree_equal(res, ref_keep(x0))
    np.testing.assert_array_equal(mine, 2.0 * (x0 + 1.0))     # buffer=my_array: b lands in my array
    assert res["pair"][0] is mine
    assert res["x"] is x0
    x1 = np.array([4.0, -1.0, 0.25, 10.0])
    g.bind(x=x1)
    assert_tree_equal(g(), ref_keep(x1))
    np.testing.assert_array_equal(mine, 2.0 * (x1 + 1.0))


def test_buffer_true_is_not_overwritten_by_later_nodes():
    n = 5000

    @eagle_fx.Graph.builder
    def long(x):
        g = eagle_fx.Graph()
        kept = inc(x, buffer=True)
        y = kept
        for _ in range(12):                      # later temporaries of the same shape reuse freed buffers
            y = affine(y, 0.5, 1.0)
        g.result = (kept, y)
        return g

    x0 = np.linspace(-1.0, 1.0, n)
    kept, y = long(x0)()
    np.testing.assert_array_equal(kept, x0 + 1.0)
    want = x0 + 1.0
    for _ in range(12):
        want = 0.5 * want + 1.0
    np.testing.assert_allclose(y, want, rtol=1e-12)
    assert not np.shares_memory(kept, y)


def test_buffer_argument_bound_to_a_new_array():
    @eagle_fx.Graph.builder
    def into(x, out):
        g = eagle_fx.Graph()
        dbl(inc(x), buffer=out)
        return g

    x0, out = np.arange(3.0), np.zeros(3)
    g = into(x0, out)
    assert g() is None
    np.testing.assert_array_equal(out, 2.0 * (x0 + 1.0))
    out2 = np.full(3, -7.0)
    g.bind(out=out2)
    g()
    np.testing.assert_array_equal(out2, 2.0 * (x0 + 1.0))


def test_result_a_tuple_and_a_list_at_the_top():
    @eagle_fx.Graph.builder
    def pair(x):
        g = eagle_fx.Graph()
        v = affine(x, 2.0, 1.0)
        g.result = (v, [square(v), v])
        return g

    x0 = np.array([1.0, -1.0])
    v, (sq, v2) = pair(x0)()
    np.testing.assert_array_equal(v, 2 * x0 + 1)
    np.testing.assert_array_equal(sq, (2 * x0 + 1) ** 2)
    np.testing.assert_array_equal(v2, 2 * x0 + 1)


# ---------------------------------------------------------------------------------------------
# no result; the running verbs

@eagle_fx.Graph.builder
def void(x, y):
    g = eagle_fx.Graph()
    accumulate(dbl(x), y)
    return g


def test_no_result_the_mutable_argument_holds_the_output():
    x0, y = np.array([1.0, 2.0, -3.0]), np.zeros(3)
    g = void(x0, y)
    assert g() is None
    np.testing.assert_array_equal(y, 2.0 * x0 + 1.0)
    assert g(3) is None


@eagle_fx.Graph.builder
def counter(x, y):
    g = eagle_fx.Graph()
    bump(inc(x), y)                              # y += x + 1 at every replay
    g.result = (y, square(x))
    return g


def test_replays_are_counted_by_g_n_launch_and_enqueue():
    x0, y = np.array([0.0, 1.0, 2.5]), np.zeros(3)
    g = counter(x0, y)
    step = x0 + 1.0
    np.testing.assert_array_equal(y, 0.0)        # building runs nothing
    total = 0
    for n in (1, 4, 1, 10):
        yy, sq = g(n)
        total += n
        np.testing.assert_allclose(yy, total * step)
        np.testing.assert_array_equal(sq, x0 * x0)
        assert yy is y
    assert g.launch(2) is g
    total += 2
    np.testing.assert_allclose(y, total * step)
    assert g.enqueue(3) is g
    assert g.synchronize() is g
    total += 3
    np.testing.assert_allclose(y, total * step)
    g.enqueue(5)
    g.enqueue(2)                                 # a second enqueue waits for the first
    g.synchronize()
    total += 7
    np.testing.assert_allclose(y, total * step)
    for _ in range(3):                           # g.result reads the arrays: it does not launch
        yy, _ = g.result
    np.testing.assert_allclose(yy, total * step)
    assert yy is y


def test_g_result_before_any_launch_and_between_replays():
    x0 = np.array([1.0, 2.0])
    calls = np.zeros(2)

    @eagle_fx.Graph.builder
    def counted(x, calls):
        g = eagle_fx.Graph()
        bump(x, calls)
        g.result = dbl(x)
        return g

    g = counted(x0, calls)
    before = g.result                            # built, not launched: no replay happens
    np.testing.assert_array_equal(calls, 0.0)
    r = g()
    np.testing.assert_array_equal(r, 2 * x0)
    np.testing.assert_array_equal(calls, x0)
    np.testing.assert_array_equal(g.result, 2 * x0)
    np.testing.assert_array_equal(calls, x0)
    assert before is r or np.shares_memory(before, r)


def test_enqueue_error_surfaces_at_synchronize():
    def boom():
        raise ZeroDivisionError("host node failed")

    src = np.zeros(2)
    h = eagle_fx.Graph()
    h.add_node(eagle_fx.opaque(boom, reads={"x": src}), name="boom")
    h.build()
    h.enqueue()
    with pytest.raises(ZeroDivisionError, match="host node failed"):
        h.synchronize()
    h.synchronize()                              # reported once


# ---------------------------------------------------------------------------------------------
# repr and the printed Program

def test_repr_counts_nodes_and_stages():
    @eagle_fx.Graph.builder
    def chain3(x):
        g = eagle_fx.Graph()
        g.result = dbl(dbl(inc(x)))
        return g

    @eagle_fx.Graph.builder
    def diamond(x):
        g = eagle_fx.Graph()
        a = dbl(x)
        with g.parallel() as p:
            with p.branch() as b:
                u = inc(a)
            with p.branch() as c:
                v = square(a)
        g.result = add(u, v)
        return g

    @eagle_fx.Graph.builder
    def with_cond(x, flag):
        g = eagle_fx.Graph()
        if flag:
            x = inc(x)
        else:
            x = square(dbl(x))
        g.result = x
        return g

    x0 = np.zeros(3)
    assert repr(chain3(x0)) == "<eagle_fx.Graph 3 nodes, 3 stages, cpu>"
    assert repr(diamond(x0)) == "<eagle_fx.Graph 4 nodes, 3 stages, cpu>"
    assert repr(with_cond(x0, cell(1))) == "<eagle_fx.Graph 4 nodes, 1 stages, cpu>"
    assert re.fullmatch(r"<eagle_fx\.Graph \d+ nodes, \d+ stages, cpu>", repr(diamond(x0)))


def test_printed_program_is_jaxpr_like_with_cond_while_switch():
    @eagle_fx.Graph.builder
    def every(x, flag, sel, n):
        g = eagle_fx.Graph()
        if flag:
            x = inc(x)
        match sel:
            case 1:
                x = dbl(x)
            case _:
                x = square(x)
        for _ in range(n):
            x = affine(x, 0.5, 0.0)
        g.result = x
        return g

    g = every(np.zeros(4), cell(1), cell(1), cell(2))
    text = str(g.program)
    lines = text.splitlines()
    assert re.fullmatch(r"\{ lambda( \w+:(f64|u32)\[\d+\])+ \. let", lines[0]), lines[0]
    assert re.fullmatch(r"  in \(\w+(, \w+)*\) \}", lines[-1]), lines[-1]
    for prim in ("= cond", "= switch[cases=(1,)]", "= while[counted=True]",
                 "call[kernel=inc]", "call[kernel=dbl]", "call[kernel=square]", "call[kernel=affine]"):
        assert prim in text, prim
    assert "branches[0]=" in text and "branches[1]=" in text and "body=" in text
    assert text.count("{ lambda") == 1 + 2 + 2 + 1      # top, cond arms, switch arms, loop body
    assert text.count("call[kernel=") == 4
    x1 = np.array([1.0, 2.0, 3.0, 4.0])
    g.bind(x=x1)
    np.testing.assert_allclose(g(), 0.25 * 2 * (x1 + 1))


# ---------------------------------------------------------------------------------------------
# bind

BUILDS = []


@eagle_fx.Graph.builder
def bindable(x, y, flag, n):
    g = eagle_fx.Graph()
    BUILDS.append(1)                             # a Python side effect: runs at build only
    if flag:
        x = dbl(x)
    else:
        x = inc(x)
    for _ in range(n):
        x = affine(x, 0.5, 1.0)
    accumulate(x, y)
    g.result = square(x)
    return g


def ref_bindable(x, flag, n):
    x = 2 * x if flag else x + 1
    for _ in range(n):
        x = 0.5 * x + 1.0
    return x * x, x + 1.0


def test_bind_replaces_arguments_without_retracing():
    x0, y0, flag, n = np.array([1.0, 2.0, 3.0]), np.zeros(3), cell(1), cell(2)
    BUILDS.clear()
    g = bindable(x0, y0, flag, n)
    exe, prog = g._exe, g.program
    assert BUILDS == [1]
    rng = np.random.default_rng(7)
    for k in range(4):
        x1, y1 = rng.normal(size=3), np.full(3, np.nan)
        f1, n1 = cell(k % 2), cell(k)
        assert g.bind(x=x1, y=y1, flag=f1, n=n1) is g
        want, want_y = ref_bindable(x1, k % 2, k)
        np.testing.assert_allclose(g(), want, rtol=1e-12)
        np.testing.assert_allclose(y1, want_y, rtol=1e-12)
        np.testing.assert_allclose(g.result, want, rtol=1e-12)
        f1[0] = 1 - f1[0]                       # the bound cell is read per replay, too
        want, want_y = ref_bindable(x1, 1 - k % 2, k)
        np.testing.assert_allclose(g(), want, rtol=1e-12)
        np.testing.assert_allclose(y1, want_y, rtol=1e-12)
    assert BUILDS == [1] and g._exe is exe and g.program is prog
    np.testing.assert_array_equal(x0, [1.0, 2.0, 3.0])   # the first arrays are untouched after the swap
    np.testing.assert_array_equal(y0, 0.0)       # never launched while bound


def test_bind_cells_between_replays_changes_the_arm_and_the_trip_count():
    x0, y0 = np.array([0.5, -1.0]), np.zeros(2)
    g = bindable(x0, y0, cell(0), cell(0))
    for fv, nv in [(0, 0), (1, 0), (1, 3), (0, 5), (1, 1)]:
        g.bind(flag=cell(fv), n=cell(nv))
        np.testing.assert_allclose(g(), ref_bindable(x0, fv, nv)[0], rtol=1e-12)


def test_bind_refuses_another_shape_or_dtype_and_unknown_names():
    x0, y0 = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    g = bindable(x0, y0, cell(1), cell(1))
    good = np.array([5.0, 6.0, 7.0])
    with pytest.raises(ValueError, match=r"'x' takes an array of shape \(3,\) and dtype float64, got list"):
        g.bind(x=[1.0, 2.0, 3.0])
    for bad in (np.zeros(4), np.zeros(3, np.float32), np.zeros((3, 1))):
        with pytest.raises(ValueError) as e:
            g.bind(x=bad)
        msg = str(e.value)
        assert "eagle.Graph.bind" in msg and "'x'" in msg and "call the builder again" in msg
    with pytest.raises(ValueError, match="call the builder again"):
        g.bind(flag=np.array([1], np.int64))
    with pytest.raises(KeyError) as e:
        g.bind(z=good)
    msg = str(e.value)
    assert "eagle.Graph.bind" in msg and "'z'" in msg
    assert sorted(re.search(r"it has: ([^)]*)\)", msg).group(1).split(", ")) == ["flag", "n", "x", "y"]
    with pytest.raises(ValueError):             # refused as a whole: x is not swapped either
        g.bind(x=good, y=np.zeros(2))
    np.testing.assert_allclose(g(), ref_bindable(x0, 1, 1)[0])
    g.bind(x=good)
    np.testing.assert_allclose(g(), ref_bindable(good, 1, 1)[0])


def test_bind_a_loop_guard_cell_the_body_writes():
    @eagle_fx.Graph.builder
    def grow(x, flag):
        g = eagle_fx.Graph()
        for _ in range(40):
            if not flag:
                break
            x = dbl(x)
            below(x, 64.0, flag)
        g.result = x
        return g

    def ref(x, flag):
        for _ in range(40):
            if not flag:
                break
            x = 2 * x
            flag = int(np.sum(x < 64.0))
        return x, flag

    x0 = np.array([1.0, 5.0])
    g = grow(x0, cell(1))
    for x1, fv in [(np.array([3.0, 70.0]), 1), (np.array([0.5, 2.0]), 0), (np.array([0.5, 2.0]), 1)]:
        f1 = cell(fv)
        g.bind(x=x1, flag=f1)
        want, want_f = ref(x1, fv)
        np.testing.assert_array_equal(g(), want)
        assert f1[0] == want_f


def test_bind_refuses_a_read_only_array_for_an_argument_the_graph_writes():
    x0, y0 = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    g = bindable(x0, y0, cell(0), cell(0))
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError) as e:
        g.bind(y=ro)
    msg = str(e.value)
    assert "eagle.Graph.bind" in msg and "'y'" in msg and "read-only" in msg and "writeable" in msg
    g()                                          # still bound to y0
    np.testing.assert_allclose(y0, ref_bindable(x0, 0, 0)[1])
    xr = np.array([4.0, 5.0, 6.0])
    xr.flags.writeable = False                   # x is only read: a read-only array is fine
    g.bind(x=xr)
    np.testing.assert_allclose(g(), ref_bindable(xr, 0, 0)[0])


def test_bind_strided_views():
    x0, y0 = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    g = bindable(x0, y0, cell(1), cell(1))
    xs, ys = np.arange(6.0), np.full(6, -1.0)
    g.bind(x=xs[::2], y=ys[1::2])
    want, want_y = ref_bindable(xs[::2], 1, 1)
    np.testing.assert_allclose(g(), want)
    np.testing.assert_allclose(ys[1::2], want_y)
    np.testing.assert_array_equal(ys[::2], -1.0)    # the other half of the base array is untouched


def test_a_block_extends_a_hand_made_graph_after_a_host_node():
    @eagle_fx.Graph.builder
    def twice(g: eagle_fx.Graph, v):
        return dbl(dbl(v))

    src, dst = np.arange(4.0), np.zeros(4)
    h = eagle_fx.Graph()
    h.add_node(eagle_fx.opaque(lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}),
               name="shift")
    z = twice(h, dst)
    assert h.build().launch() is h
    np.testing.assert_array_equal(np.asarray(z), 4.0 * (src + 1.0))
    src[:] = [10.0, 20.0, 30.0, 40.0]            # the host node reads src at every replay
    h.launch()
    np.testing.assert_array_equal(np.asarray(z), 4.0 * (src + 1.0))
    assert repr(h) == "<eagle_fx.Graph 3 nodes, 3 stages, cpu>"


def test_a_block_returns_a_tree_and_takes_the_graph_by_keyword():
    @eagle_fx.Graph.builder
    def both(g: eagle_fx.Graph, v):
        return {"inc": inc(v), "dbl": dbl(v)}

    @eagle_fx.Graph.builder
    def user(x):
        g = eagle_fx.Graph()
        r = both(v=x, g=g)
        g.result = add(r["inc"], r["dbl"])
        return g

    x0 = np.array([1.0, -2.0])
    np.testing.assert_array_equal(user(x0)(), 3.0 * x0 + 1.0)

    with pytest.raises(TypeError, match="both: its parameter 'g' takes the graph"):
        both(x0, x0)
