"""Staging means what the user wrote: loop carries found to a true fixpoint, bind of every array
argument, block results on hand-made graphs as arrays, leaked tracers refused, buffer labels that
follow their name through device flow. Each check's expected value is worked out in plain NumPy."""
import numpy as np
import pytest

import eagle_fx as eagle
from fuzz_kernels import half
from tour_kernels import below, cell, dbl, inc

pytestmark = pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)


def _chain_reference(x, turns):
    """Python's meaning of the chain builder below: a0 becomes the cell after nine turns."""
    names = [0] * 9 + [1]
    for _ in range(turns):
        names = names[1:] + names[-1:]
    return x + 1.0 if names[0] else x.copy()


@eagle.Graph.builder
def chain(x, n, last):
    g = eagle.Graph()
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = 0
    a9 = last
    for _ in range(n):                  # a counted device loop: each name takes the next one's value
        a0, a1, a2, a3, a4, a5, a6, a7, a8 = a1, a2, a3, a4, a5, a6, a7, a8, a9
    if a0:
        x = inc(x)
    g.result = x
    return g


def test_loop_carries_reach_a_fixpoint_past_any_round_limit():
    x = np.array([1.0, 2.0])
    n = cell(10)
    g = chain(x, n, cell(1))
    for turns in (10, 9, 8, 3, 0, 12):
        n[0] = turns
        np.testing.assert_array_equal(g(), _chain_reference(x, turns))


@eagle.Graph.builder
def float_chain(x, n):
    g = eagle.Graph()
    z = np.zeros_like(x)
    a0, a1, a2, a3, a4, a5, a6, a7, a8 = z, z, z, z, z, z, z, z, z
    a9 = dbl(x)
    for _ in range(n):
        a0, a1, a2, a3, a4, a5, a6, a7, a8 = inc(a1), a2, a3, a4, a5, a6, a7, a8, a9
    g.result = a0
    return g


def _float_chain_reference(x, turns):
    names = [np.zeros_like(x)] * 9 + [2.0 * x]
    for _ in range(turns):
        names = [names[1] + 1.0] + names[2:] + names[-1:]
    return names[0]


def test_jvp_and_vmap_carry_fixpoints_reach_the_far_end_of_a_chain():
    x = np.array([0.5, -1.0, 2.0])
    out, tangent = eagle.jvp(lambda x: float_chain(x, cell(12)), (x,), (np.ones(3),))
    np.testing.assert_allclose(np.asarray(out), _float_chain_reference(x, 12))
    np.testing.assert_allclose(np.asarray(tangent), 2.0 * np.ones(3))       # d(2x)/dx reaches a0 after 9 turns
    X = np.stack([x, x + 1.0, x * 3.0])
    got = np.asarray(eagle.vmap(lambda x: float_chain(x, cell(12)))(X))
    np.testing.assert_allclose(got, np.stack([_float_chain_reference(r, 12) for r in X]))


@eagle.Graph.builder
def ignores_w(x, w, flag):
    g = eagle.Graph()
    g.result = dbl(x)
    return g


def test_bind_accepts_an_argument_no_kernel_reads():
    x, w = np.arange(3.0), np.ones(3)
    g = ignores_w(x, w, cell(1))
    g.bind(w=np.full(3, 7.0), flag=cell(0))
    np.testing.assert_array_equal(g(), 2.0 * x)
    g.bind(x=np.array([5.0, 6.0, 7.0]), w=np.zeros(3))
    np.testing.assert_array_equal(g(), [10.0, 12.0, 14.0])
    with pytest.raises(ValueError, match="'w' changed shape/dtype"):
        g.bind(w=np.ones(4))
    with pytest.raises(KeyError, match="it has: x, w, flag"):
        g.bind(v=np.ones(3))


@eagle.Graph.builder
def twice(g: eagle.Graph, v):
    return dbl(dbl(v))


def test_a_block_on_a_hand_made_graph_returns_arrays_filled_at_each_launch():
    from eagle_fx.graph import opaque
    src, dst = np.arange(4.0), np.zeros(4)
    h = eagle.Graph()
    h.add_node(opaque(lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}), name="shift")
    z = twice(h, dst)
    w = twice(h, z)                       # the array stands for the block's plane in the same graph
    h.result = {"w": w, "z": z}
    assert type(z) is np.ndarray and type(w) is np.ndarray
    for values in ([0.0, 1.0, 2.0, 3.0], [5.0, -1.0, 0.5, 2.0]):
        src[:] = values
        out = h()
        np.testing.assert_array_equal(z, 4.0 * (np.array(values) + 1.0))
        np.testing.assert_array_equal(w, 16.0 * (np.array(values) + 1.0))
        np.testing.assert_array_equal(out["w"], w)
    src[:] = 2.0
    h.enqueue().synchronize()
    np.testing.assert_array_equal(z, np.full(4, 12.0))


@eagle.Graph.builder
def numpy_block(g: eagle.Graph, v, w):
    tail = v[1:]                          # staged: a view of v, read at every replay
    wave = np.sin(v) + w * 2.0            # staged math, not computed once when the block is called
    return {"tail": dbl(tail), "wave": wave, "view": w[::2], "same": w}


def test_a_block_on_a_hand_made_graph_stages_numpy_on_its_arguments():
    from eagle_fx.graph import opaque
    src, dst, w = np.arange(4.0), np.zeros(4), np.array([0.5, -1.0, 2.0, 3.0])
    h = eagle.Graph()
    h.add_node(opaque(lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}), name="shift")
    out = numpy_block(h, dst, w)
    assert out["same"] is w                           # an argument returned as it came: the caller's array
    assert all(type(v) is np.ndarray for v in out.values())
    for values, ws in (([0.0, 1.0, 2.0, 3.0], [0.5, -1.0, 2.0, 3.0]), ([5.0, -1.0, 0.5, 2.0], [1.0, 1.0, -4.0, 0.0])):
        src[:], w[:] = values, ws                     # the host node and the block read them at every replay
        h.launch()
        shifted = np.array(values) + 1.0              # plain NumPy: what the block means now
        np.testing.assert_allclose(out["tail"], 2.0 * shifted[1:])
        np.testing.assert_allclose(out["wave"], np.sin(shifted) + np.array(ws) * 2.0)
        np.testing.assert_array_equal(out["view"], np.array(ws)[::2])


def test_a_value_leaked_from_a_kernel_trace_is_refused_with_where_it_was_made():
    import hawk_fx as hawk
    from hawk_fx import Scalar
    from hawk_fx import math as hm
    kept = []

    @hawk.kernel
    def leaky(x: Scalar) -> Scalar:
        y = x * 3.0
        kept.extend([y, x])
        return y

    np.testing.assert_array_equal(leaky(np.arange(3.0)), 3.0 * np.arange(3.0))
    y, x = kept
    for use in (lambda: hm.sin(y), lambda: y + 1.0, lambda: np.sin(y), lambda: float(y), lambda: leaky(y)):
        with pytest.raises(hawk.LeakedTracerError, match=r"leaked value: it was traced by hawk.kernel leaky:3 .*"
                                                         r"y = x \* 3.0"):
            use()
    with pytest.raises(hawk.LeakedTracerError, match="its parameter 'x'"):
        hm.exp(x)

    @hawk.kernel
    def uses_it(v: Scalar) -> Scalar:
        return v + kept[0]                # the leak reaches another kernel's trace

    with pytest.raises(hawk.LeakedTracerError, match="leaky:3"):
        uses_it(np.ones(2))


kept_planes = []


@eagle.Graph.builder
def leaks_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    kept_planes.append(y)
    g.result = inc(y)
    return g


@eagle.Graph.builder
def reads_the_leak(x):
    g = eagle.Graph()
    g.result = dbl(kept_planes[-1])
    return g


def test_a_plane_leaked_from_a_finished_builder_is_refused_with_where_it_was_made():
    import hawk_fx as hawk
    from hawk_fx import math as hm
    x = np.arange(3.0)
    np.testing.assert_array_equal(leaks_a_plane(x)(), 2.0 * x + 1.0)
    for use in (lambda: reads_the_leak(x), lambda: hm.sin(kept_planes[-1]), lambda: np.asarray(kept_planes[-1]),
                lambda: dbl(kept_planes[-1])):
        with pytest.raises(hawk.LeakedTracerError, match="staged value 'y' made by eagle.Graph.builder leaks_a_plane "
                                                         "at leaks_a_plane:4, which has finished"):
            use()


from tour_kernels import add, square  # noqa: E402


def test_a_buffer_name_rebound_in_a_counted_loop_keeps_its_buffer():
    M = np.zeros(4)

    @eagle.Graph.builder
    def f(x, n):
        g = eagle.Graph()
        own = inc(x, buffer=M)
        for _ in range(n):          # a counted device loop
            own = dbl(own)
        g.result = square(own)
        return g

    x, n = np.arange(4.0), cell(3)
    g = f(x, n)
    for turns in (3, 0, 5):
        n[0] = turns
        want = (x + 1.0) * 2.0 ** turns
        np.testing.assert_array_equal(g(), want * want)
        np.testing.assert_array_equal(M, want)


def test_a_buffer_name_rebound_in_device_arms_keeps_its_buffer():
    B = np.zeros(4)

    @eagle.Graph.builder
    def f(x, c, sel, n):
        g = eagle.Graph()
        own = inc(x, buffer=B)
        if c:
            own = dbl(own)
        else:
            for _ in range(n):      # a loop nested in an arm moves the buffer along with the name
                own = square(own)
        match sel:
            case 1:
                own = inc(own)
            case _:
                pass
        g.result = inc(own)
        return g

    x, c, sel, n = np.arange(4.0), cell(1), cell(1), cell(2)
    g = f(x, c, sel, n)
    for cv, sv, nv in ((1, 1, 2), (0, 1, 2), (0, 0, 1), (1, 0, 0)):
        c[0], sel[0], n[0] = cv, sv, nv
        own = x + 1.0
        own = 2.0 * own if cv else own ** (2 ** nv)
        own = own + 1.0 if sv == 1 else own
        np.testing.assert_array_equal(g(), own + 1.0)
        np.testing.assert_array_equal(B, own)


def test_rebinding_a_buffer_name_at_the_top_level_keeps_python_meaning():
    M = np.zeros(3)

    @eagle.Graph.builder
    def f(x):
        g = eagle.Graph()
        own = inc(x, buffer=M)
        own = dbl(own)              # not device flow: the name moves on, the array keeps the first value
        g.result = own
        return g

    x = np.arange(3.0)
    np.testing.assert_array_equal(f(x)(), 2.0 * (x + 1.0))
    np.testing.assert_array_equal(M, x + 1.0)


def test_a_buffer_label_means_its_final_value_in_reverse():
    from eagle_fx.diff import reverse

    @eagle.Graph.builder
    def f(x, flag):
        g = eagle.Graph(record=True)
        keep = square(x, buffer=True)
        for _ in range(7):                  # capped: 7 turns while the flag stays 1
            if not flag:
                break
            keep = dbl(keep)
        g.result = inc(keep)
        return g

    x = np.array([0.5, -1.0, 2.0, 3.0])
    g = f(x, cell(1))
    g()
    grads = reverse(g.record, {"result": np.ones(4)}, wrt=("keep", "x"))
    np.testing.assert_allclose(grads["keep"], np.ones(4))          # result = keep_final + 1
    np.testing.assert_allclose(grads["x"], 2.0 * x * 128.0)        # result = 128 x^2 + 1
    eps = 1e-6                                                      # and by finite differences of plain NumPy
    np.testing.assert_allclose(grads["x"], ((128 * (x + eps) ** 2 + 1) - (128 * (x - eps) ** 2 + 1)) / (2 * eps),
                               rtol=1e-6)


def test_a_buffer_rebound_in_a_loop_and_read_there_through_another_name_is_refused():
    M = np.zeros(3)

    @eagle.Graph.builder
    def f(x, n):
        g = eagle.Graph()
        own = inc(x, buffer=M)
        alias = own
        for _ in range(n):
            own = add(own, alias)
        g.result = own
        return g

    before = M.copy()
    with pytest.raises(TypeError, match=r"f:6: the buffer 'own' is rebound in this device loop and also read"):
        f(np.arange(3.0), cell(2))
    np.testing.assert_array_equal(M, before)


def test_a_buffer_name_rebound_by_a_nested_arm_and_again_in_its_arm_holds_the_last_value():
    # found by the differential fuzzer: the inner if moved the buffer, then the arm rebound the name
    B = np.zeros(3)

    @eagle.Graph.builder
    def f(x, c, d):
        g = eagle.Graph()
        own = inc(x, buffer=B)
        if c:
            if d:
                own = dbl(own)
            own = add(own, x)
        g.result = inc(own)
        return g

    x, c, d = np.arange(3.0), cell(1), cell(1)
    g = f(x, c, d)
    for cv, dv in ((1, 1), (1, 0), (0, 1)):
        c[0], d[0] = cv, dv
        own = x + 1.0
        if cv:
            own = (2.0 * own if dv else own) + x
        np.testing.assert_array_equal(g(), own + 1.0)
        np.testing.assert_array_equal(B, own)


@eagle.Graph.builder
def idle_loop(x, c):
    g = eagle.Graph()
    for _ in range(c):          # carries nothing: its turns have no effect
        if c:
            continue
    g.result = inc(x)
    return g


def test_vmap_over_the_trip_count_of_a_loop_that_carries_nothing():
    # found by the differential fuzzer: the batched loop took its batch size from its first carry
    X = np.stack([np.arange(3.0), np.ones(3), np.zeros(3)])
    C = np.array([[0], [1], [3]], np.uint32)
    got = np.asarray(eagle.vmap(lambda x, c: idle_loop(x, c))(X, C))
    np.testing.assert_array_equal(got, X + 1.0)


@eagle.Graph.builder
def arm_writes_its_selector(x, c, f):
    g = eagle.Graph()
    p = dbl(x)
    match c:
        case 1:
            p = inc(p)
        case _:
            below(p, 100.0, c)      # this arm rewrites the cell that chose it
            p = half(p)
    if f:
        p = inc(p)
    else:
        below(p, 100.0, f)
        p = dbl(p)
    g.result = p
    return g


def test_vmap_picks_arms_by_the_cells_as_they_were_before_an_arm_writes_them():
    # found by the differential fuzzer: batched arms were chosen after one arm had written the cell
    X = np.array([[0.5, 1.0, -1.0], [2.0, 0.0, 1.0], [-0.5, 3.0, 0.25]])
    C = np.array([[1], [0], [2]], np.uint32)
    F = np.array([[0], [1], [0]], np.uint32)
    want_p, want_c, want_f = [], [], []
    for x, c, f in zip(X, C[:, 0], F[:, 0]):
        p = 2.0 * x
        if c == 1:
            p = p + 1.0
        else:
            c = np.sum(p < 100.0)
            p = 0.5 * p + 1.0
        if f:
            p = p + 1.0
        else:
            f = np.sum(p < 100.0)
            p = 2.0 * p
        want_p.append(p), want_c.append(c), want_f.append(f)
    got = eagle.vmap(arm_writes_its_selector)(X, C, F)()
    np.testing.assert_allclose(got, want_p, rtol=1e-15)
    np.testing.assert_array_equal(C[:, 0], want_c)
    np.testing.assert_array_equal(F[:, 0], want_f)


def test_a_label_rebound_in_an_elif_means_its_final_value_in_reverse():
    # found by the differential fuzzer: the elif (an if nested in the else arm) left the label
    # meaning the arm's value, which reverse refused as not a value of the run
    from eagle_fx.diff import reverse

    @eagle.Graph.builder
    def f(x, c, d):
        g = eagle.Graph(record=True)
        keep = square(x, buffer=True)
        if c:
            keep = dbl(keep)
        elif d:
            keep = inc(keep)
        g.result = inc(keep)
        return g

    x = np.array([0.5, -1.0, 2.0])
    for cv, dv in ((1, 0), (0, 1), (0, 0)):
        g = f(x, cell(cv), cell(dv))
        g()
        r = reverse(g.record, {"keep": np.ones(3)}, wrt=("x",))
        np.testing.assert_allclose(r["x"], (4.0 if cv else 2.0) * x)         # d sum(keep after the if) / dx
        r = reverse(g.record, {"result": np.ones(3)}, wrt=("keep",))
        np.testing.assert_allclose(r["keep"], np.ones(3))
