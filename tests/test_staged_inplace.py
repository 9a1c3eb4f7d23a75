"""In-place NumPy on staged planes (`y += 1.0`, `y[1:] *= x[:-1]`, `np.sin(x, out=y)`) means what
NumPy means: the array `y` names is updated in place, at every replay, seen through every other name
and view of it, and a builder argument is the caller's array. Where that cannot be staged (a name
that device flow rebound while the array it held is still seen elsewhere), the build is refused.

Oracles: the same function run by NumPy on plain arrays (kernels written as NumPy), and the eager
mode (`disable_staging`) on copies of the same arrays.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar

from conftest import line_of
from tour_kernels import cell


@hawk.kernel
def dbl(x: Scalar) -> Scalar:
    return 2.0 * x


@hawk.kernel
def inc(x: Scalar) -> Scalar:
    return x + 1.0


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@hawk.kernel
def put(x: Scalar, y: Mutable[Scalar]):
    y = x


NUMPY_KERNELS = {"dbl": lambda x: 2.0 * x, "inc": lambda x: x + 1.0, "total": lambda x: np.array([np.sum(x * x)])}


def _as_numpy(fn):
    """The builder's function run on plain arrays: kernels become NumPy, the graph a namespace,
    `range(cell)` the cell's count and `if cell:` its value (the meaning NumPy gives the code)."""
    class G:
        result = None

    def run(*args):
        glb = dict(fn.__globals__, **NUMPY_KERNELS, eagle=type("E", (), {"Graph": G}), range=_range)
        f = type(fn)(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
        return f(*args).result
    return run


def _range(*a):
    return range(int(a[0][0])) if isinstance(a[0], np.ndarray) else range(*a)


def _agree(fn, args, replays=3, rebind=None):
    """Staged, eager and plain NumPy on copies of `args`: results and arguments equal after each run."""
    builder = eagle.Graph.builder(fn)
    staged, eager, plain = ([a.copy() for a in args] for _ in range(3))
    g = builder(*staged)
    with eagle.disable_staging():
        e = builder(*eager)
    ref = _as_numpy(fn)
    for _ in range(replays):
        got, want, eag = g(), ref(*plain), e()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], err_msg=f"staged {k}")
            np.testing.assert_allclose(eag[k], want[k], err_msg=f"eager {k}")
        for a, b, c in zip(staged, plain, eager):
            np.testing.assert_allclose(a, b, err_msg="a caller's array")
            np.testing.assert_allclose(c, b, err_msg="a caller's array, eager")
    return g


def aliases_and_views(x, w, n):
    g = eagle.Graph()
    y = dbl(x)
    alias = y
    v = y[1:]
    y += 1.0
    y *= 2.0
    y[1:] += x[:-1]                 # overlapping operands, as NumPy: the right side is read first
    x += 0.5                        # the caller's argument, in place
    w[::2] -= v[::2]
    for _ in range(n):              # a counted device loop: y is updated, not rebound
        y += 1.0
        v /= 2.0
    g.result = {"y": y, "alias": alias, "v": v, "d": dbl(alias), "w": w * 1.0}
    return g


def test_in_place_operators_update_the_array_every_name_sees():
    _agree(aliases_and_views, (np.arange(4.0), np.ones(4), cell(3)))


def in_arms_and_loops(x, c, n, sel):
    g = eagle.Graph()
    y = inc(x)
    if c:
        y -= x
    else:
        y **= 2.0
    match sel:
        case 1:
            y //= 0.75
        case _:
            y %= 1.5
    for _ in range(n):
        x *= 0.5                    # an argument updated in a loop: the caller's array, every turn
    g.result = {"y": y, "t": total(y)}
    return g


@pytest.mark.parametrize("c,n,sel", [(1, 2, 1), (0, 0, 0), (1, 5, 3)])
def test_in_place_operators_in_device_arms_and_loops(c, n, sel):
    _agree(in_arms_and_loops, (np.array([0.5, -1.0, 2.0]), cell(c), cell(n), cell(sel)))


def ufunc_out(x, y, z):
    g = eagle.Graph()
    np.sin(x, out=y)                # writes the caller's y at every replay
    np.multiply(x[1:], 2.0, out=z[1:])  # into a view of an argument
    r = np.add(y, 1.0, out=y)       # returns y, as NumPy does
    g.result = {"r": r, "t": total(y) + z[:1]}
    return g


def test_out_writes_into_the_array_at_every_replay():
    _agree(ufunc_out, (np.array([0.5, -1.0, 2.0]), np.zeros(3), np.full(3, 7.0)))


def test_the_update_is_read_at_every_replay_after_bind():
    g = eagle.Graph.builder(aliases_and_views)(np.arange(4.0), np.ones(4), cell(2))
    x, w = np.array([3.0, -1.0, 0.5, 2.0]), np.zeros(4)
    g.bind(x=x, w=w)
    xr, wr = x.copy(), w.copy()
    want = _as_numpy(aliases_and_views)(xr, wr, cell(2))
    got = g()
    np.testing.assert_allclose(got["y"], want["y"])
    np.testing.assert_allclose(x, xr)
    np.testing.assert_allclose(w, wr)


def test_float32_in_place_keeps_float32_and_float_into_int_is_refused_as_numpy_does():
    @eagle.Graph.builder
    def f32(x, d):
        g = eagle.Graph()
        y = dbl(x)
        y += d                          # float64 into float32: NumPy casts ('same_kind')
        g.result = y
        return g

    x, d = np.arange(3, dtype=np.float32), np.array([0.1, 0.2, 0.3])
    out = f32(x, d)()
    want = 2.0 * x
    want += d
    assert out.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(out, want)

    @eagle.Graph.builder
    def ints(k, d):
        g = eagle.Graph()
        k += d
        return g

    k = np.arange(3, dtype=np.int32)
    with pytest.raises(TypeError):              # NumPy refuses the same
        k.copy().__iadd__(d)
    with pytest.raises(TypeError, match=r"ints:4: .*float64 and y is int32.*same_kind"):
        ints(k, d)
    np.testing.assert_array_equal(k, [0, 1, 2])


def test_a_gradient_flows_through_an_in_place_update():
    @eagle.Graph.builder
    def f(x):
        g = eagle.Graph()
        y = dbl(x)
        y *= x                      # y = 2 x^2
        y[1:] += x[:-1]
        g.result = total(y)
        return g

    x = np.array([0.5, -1.0, 2.0])

    def ref(x):
        y = 2.0 * x * x
        y[1:] += x[:-1]
        return np.sum(y * y)
    eps = 1e-6
    fd = np.array([(ref(x + eps * e) - ref(x - eps * e)) / (2 * eps) for e in np.eye(3)])
    np.testing.assert_allclose(eagle.grad(f)(x), fd, rtol=1e-6)


# -- what cannot be staged is refused --------------------------------------------------------------

def _refused(builder, args, fragment, *words):
    before = [np.array(a, copy=True) for a in args]
    with pytest.raises(TypeError) as info:
        builder(*args)
    where = f"{builder.__name__}:{line_of(builder, fragment) - line_of(builder, '@eagle') + 1}"
    for w in (where,) + words:
        assert w in str(info.value), f"{w!r} not in {str(info.value)!r}"
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)           # a refused build writes nothing


@eagle.Graph.builder
def kept_by_an_arm(x, c):
    g = eagle.Graph()
    y = x
    if c:
        y = dbl(y)
    y += 1.0                         # NumPy: x itself when c is 0
    g.result = y
    return g


@eagle.Graph.builder
def zero_turns(x, n):
    g = eagle.Graph()
    y = inc(x)
    seen = y
    for _ in range(n):
        y = dbl(y)
    put(x, y)                         # a Mutable write: NumPy writes `seen` too after 0 turns
    g.result = (y, seen)
    return g


@eagle.Graph.builder
def written_then_rebound(x, n):
    g = eagle.Graph()
    y = x
    for _ in range(n):
        y += 1.0
        y = dbl(y)                    # NumPy: the first turn wrote the entry array, later turns new ones
    g.result = y
    return g


def test_in_place_updates_that_cannot_mean_what_numpy_means_are_refused():
    _refused(kept_by_an_arm, (np.arange(3.0), cell(0)), "y += 1.0", "device if/match/loop at kept_by_an_arm:5",
             "y = y + 1.0")
    _refused(zero_turns, (np.arange(3.0), cell(0)), "put(x, y)", "Mutable write to 'y'", "zero_turns:6")
    _refused(written_then_rebound, (np.arange(3.0), cell(2)), "y += 1.0", "device if/match/loop at "
             "written_then_rebound:5", "the first turn of a loop")


def test_a_name_device_flow_rebound_may_be_updated_when_nothing_else_sees_its_old_array():
    def unseen(x, c, n):
        g = eagle.Graph()
        y = inc(x)
        if c:
            y = dbl(y)
        y += 1.0
        for _ in range(n):
            y = dbl(y)
        y *= 3.0
        g.result = {"y": y}
        return g
    for c, n in ((0, 0), (1, 2)):
        _agree(unseen, (np.arange(3.0), cell(c), cell(n)), replays=2)


def test_a_buffer_label_means_its_value_after_later_in_place_updates_in_gradients():
    """Found by the fuzzer: a label seeded `reverse` at the buffer's first version."""
    @eagle.Graph.builder
    def f(x, record=False):
        g = eagle.Graph(record=record)
        a = inc(x, buffer=True)
        a[1:] += a[:-1] * 0.5
        b = inc(x, buffer=True)
        put(dbl(x), b)                  # a Mutable write into a buffer: b is 2x after it
        g.result = total(a)
        return g

    x = np.array([0.5, -1.0, 2.0])

    def a_final(x):
        a = x + 1.0
        a[1:] += a[:-1] * 0.5
        return a
    eps = 1e-6
    jac = np.stack([(a_final(x + eps * e) - a_final(x - eps * e)) / (2 * eps) for e in np.eye(3)])  # [i, j] = da_j/dx_i
    g = f(x, record=True)
    g()
    r = eagle.diff.reverse(g.record, {"a": np.ones(3)}, wrt=("x",))
    np.testing.assert_allclose(r["x"], jac.sum(axis=1), rtol=1e-6)
    r = eagle.diff.reverse(g.record, {"b": np.ones(3)}, wrt=("x",))
    np.testing.assert_allclose(r["x"], 2.0 * np.ones(3))
    r = eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("a",))
    np.testing.assert_allclose(r["a"], 2.0 * a_final(x))          # d sum(a^2) / d a, at a's final value


# -- random sequences of in-place updates through names and views, against NumPy ---------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SLICES = {4: ("[:]", "[...]"), 3: ("[1:]", "[:-1]"), 2: ("[::2]", "[1::2]", "[2:]")}


@st.composite
def inplace_programs(draw):
    """Builder source: fresh planes y0, y1, the arguments x, w, views of them held by names, and a few
    in-place updates (some inside a counted device loop over cell n), each through a name or a view."""
    names = ["y0", "y1", "x", "w"]
    lines = ["y0 = dbl(x)", "y1 = inc(w)"]
    for k in range(draw(st.integers(0, 2))):                        # views held by names: aliases
        size = draw(st.sampled_from(sorted(SLICES)))
        lines.append(f"v{k} = {draw(st.sampled_from(names))}{draw(st.sampled_from(SLICES[size]))}")
    views = [ln.split(" = ")[0] for ln in lines[2:]]

    def update():
        size = draw(st.sampled_from(sorted(SLICES)))
        target = draw(st.sampled_from(names)) + draw(st.sampled_from(SLICES[size]))
        op = draw(st.sampled_from(["+=", "-=", "*="]))
        src = draw(st.sampled_from(names)) + draw(st.sampled_from(SLICES[size]))
        rhs = draw(st.sampled_from([src, f"np.sin({src})", "0.5", f"np.tanh({src}) * 0.5"] if op != "*=" else
                                   ["0.5", f"np.tanh({src})"]))
        return f"{target} {op} {rhs}"
    for _ in range(draw(st.integers(1, 4))):
        lines.append(update())
    if draw(st.booleans()):
        lines.append("for _ in range(n):")
        lines += ["    " + update() for _ in range(draw(st.integers(1, 2)))]
    lines.append("g.result = {" + ", ".join(f"'{v}': {v} * 1.0" for v in names + views) + "}")
    body = "\n".join("    " + ln for ln in ["g = eagle.Graph()"] + lines + ["return g"])
    return f"def prog(x, w, n):\n{body}\n"


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(inplace_programs(), st.integers(0, 3))
def test_random_in_place_updates_agree_with_numpy_and_eager(src, turns):
    ns = {"np": np, "eagle": eagle, "dbl": dbl, "inc": inc}
    exec(compile(src, "<in-place program>", "exec"), ns)
    import linecache
    linecache.cache["<in-place program>"] = (len(src), None, src.splitlines(True), "<in-place program>")
    try:
        _agree(ns["prog"], (np.array([0.5, -1.0, 2.0, 0.25]), np.array([1.0, 0.5, -0.5, 3.0]), cell(turns)),
               replays=2)
    except Exception as e:
        e.add_note(src)
        raise
