"""The jax backend's own contract: NumPy arguments keep the NumPy backend's semantics (cells read
each replay, Mutable writes in place, stable results, bind without compiling again); jax.Array
arguments are carried by the graph (a Mutable write rebinds the argument, g.result holds new
jax.Arrays); the builder forms on jax.Arrays against plain-Python references; refusals at build."""
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
from conftest import refused  # noqa: E402
from test_graph_control import (elif_loop, fork_of_blocks, match_in_counted, ref_elif_loop,  # noqa: E402
                                ref_fork_of_blocks, ref_match_in_counted)
from test_graph_running import bump  # noqa: E402
from tour_kernels import accumulate, affine, below, cell, dbl, inc, loss, square  # noqa: E402


@eagle_fx.Graph.builder
def climb(x, flag, y):
    g = eagle_fx.Graph(backend="jax")
    for _ in range(40):
        if not flag:
            break
        x = affine(x, 1.5, 0.25)
        below(x, 30.0, flag)
    bump(x, y)                          # y += x: a Mutable argument
    g.result = {"x": x, "sq": square(x)}
    return g


def ref_climb(x, flag, y):
    for _ in range(40):
        if not flag:
            break
        x = 1.5 * x + 0.25
        flag = int(np.sum(x < 30.0))
    return x, flag, y + x


def test_numpy_arguments_keep_the_numpy_backends_semantics():
    x0, flag, y = np.array([0.5, 1.0, 2.0, 40.0]), cell(1), np.zeros(4)
    g = climb(x0, flag, y)
    assert repr(g).endswith("jax>")
    compiled = g._exe._compiled
    res = g()
    want, wflag, wy = ref_climb(x0, 1, np.zeros(4))
    np.testing.assert_allclose(res["x"], want, rtol=1e-13)
    np.testing.assert_allclose(res["sq"], want * want, rtol=1e-13)
    assert int(flag[0]) == wflag == 0                   # the caller's cell, written in place
    np.testing.assert_allclose(y, wy, rtol=1e-13)       # the caller's Mutable, written in place
    stable = g.result["x"]
    g()                                                 # flag is 0 now: no turn runs; y grows by x0
    np.testing.assert_allclose(g.result["x"], x0, rtol=1e-13)
    assert g.result["x"] is stable                      # results are the same arrays across replays
    np.testing.assert_allclose(y, wy + x0, rtol=1e-13)
    flag[0] = 1                                         # a cell is read at every replay
    g()
    np.testing.assert_allclose(g.result["x"], want, rtol=1e-13)
    x1 = np.array([3.0, 2.0, 1.0, 0.0])
    g.bind(x=x1)                                        # swaps the array, compiles nothing
    flag[0] = 1
    g()
    np.testing.assert_allclose(g.result["x"], ref_climb(x1, 1, 0)[0], rtol=1e-13)
    assert g._exe._compiled is compiled


def test_jax_array_arguments_are_carried_by_the_graph():
    x0, y0 = jnp.array([0.5, 1.0, 2.0, 40.0]), jnp.zeros(4)
    g = climb(x0, jnp.asarray(cell(1)), y0)
    res = g()
    want, _, wy = ref_climb(np.asarray(x0), 1, np.zeros(4))
    assert isinstance(res["x"], jax.Array)
    np.testing.assert_allclose(res["x"], want, rtol=1e-13)
    np.testing.assert_array_equal(y0, np.zeros(4))                       # the caller's jax.Array: unchanged
    np.testing.assert_allclose(g.argument("y"), wy, rtol=1e-13)          # the graph's y: the written value
    assert int(g.argument("flag")[0]) == 0                               # the written guard, carried
    g()                                                                  # reads the carried y and flag
    np.testing.assert_allclose(g.argument("y"), wy + np.asarray(x0), rtol=1e-13)
    np.testing.assert_allclose(g.result["x"], x0, rtol=1e-13)
    g.bind(flag=jnp.asarray(cell(1)), y=jnp.zeros(4))
    g()
    np.testing.assert_allclose(g.argument("y"), wy, rtol=1e-13)


def test_builder_forms_on_jax_arrays():
    # a capped loop in an elif arm
    x0 = np.array([1.0, 3.0, 7.0, 60.0])
    for a, b in [(1, 0), (0, 1), (0, 0)]:
        g = elif_loop(jnp.asarray(x0), jnp.asarray(cell(a)), jnp.asarray(cell(b)))
        np.testing.assert_allclose(g(), ref_elif_loop(x0, a, b)[0], rtol=1e-13)
    # match inside a counted loop
    x0 = np.array([-1.5, 0.0, 0.25, 2.0])
    for n, sel in [(0, 0), (3, 0), (2, 3), (4, 7)]:
        g = match_in_counted(jnp.asarray(x0), jnp.asarray(cell(n)), jnp.asarray(cell(sel)))
        np.testing.assert_allclose(g(), ref_match_in_counted(x0, n, sel), rtol=1e-13)
    # a fork whose branches call blocks with device loops
    x0 = np.array([0.5, 1.0, 4.0, 9.0])
    for v1, v2, nv in [(1, 1, 0), (0, 1, 2), (1, 0, 3)]:
        g = fork_of_blocks(jnp.asarray(x0), jnp.asarray(cell(v1)), jnp.asarray(cell(v2)), jnp.asarray(cell(nv)))
        want, w1, w2 = ref_fork_of_blocks(x0, v1, v2, nv)
        np.testing.assert_allclose(g(), want, rtol=1e-12)
        assert (int(g.argument("f1")[0]), int(g.argument("f2")[0])) == (w1, w2)


def test_transforms_of_a_jax_backend_graph_run_on_it():
    x0 = np.array([0.3, -0.2, 0.9])

    @eagle_fx.Graph.builder
    def on_jax(x, flag, n):
        g = eagle_fx.Graph(backend="jax")
        g.result = loss(x, flag, n).result if False else _loss_block(g, x, flag, n)
        return g

    grad = eagle_fx.make_graph(eagle_fx.grad(on_jax))(x0, cell(1), 3)
    assert repr(grad).endswith("jax>")
    want = eagle_fx.grad(loss)(x0, cell(1), 3)
    np.testing.assert_allclose(grad(), want, rtol=1e-12)


@eagle_fx.Graph.builder
def _loss_block(g: eagle_fx.Graph, x, flag, n):
    from tour_kernels import grow, total, wobble
    if flag:
        x = wobble(x)
    for i in range(n):
        x = grow(x, 1.1)
    return total(x)


# ---------------------------------------------------------------------------------------------
# refusals: at build, naming the argument, writing nothing

def test_mixed_numpy_and_jax_arrays_are_refused_naming_both():
    y = np.zeros(4)
    refused(TypeError, lambda: climb(jnp.ones(4), cell(1), y), "argument 'x' is a jax.Array",
            "argument 'flag' is a ndarray", untouched=[y])


def test_a_mesh_that_does_not_divide_n_is_refused():
    from jax.sharding import Mesh
    mesh = Mesh(np.array(jax.devices()[:1] * 1), ("s",))

    @eagle_fx.Graph.builder
    def one(x, y):
        g = eagle_fx.Graph(backend="jax", mesh=mesh)
        accumulate(x, y)
        g.result = inc(x)
        return g
    one(np.ones(5), np.zeros(5))()                     # one device divides every n
    fake = type("FakeMesh", (), {"axis_names": ("s",), "shape": {"s": 4}})()
    from eagle_fx.backends.jax import plane_sharding
    with pytest.raises(ValueError, match="argument 'x' has 6 samples, which 4 devices of the mesh do not divide"):
        plane_sharding(fake, (6,), 6, ["x"], 0)


def test_an_opaque_node_on_jax_arrays_is_refused_at_build():
    @eagle_fx.Graph.builder
    def hosted(x):
        g = eagle_fx.Graph()
        g.add_node(eagle_fx.opaque(lambda: None, reads={"s": x}), name="peek")
        g.result = inc(x)
        return g
    with pytest.raises(eagle_fx.backends.jax.LoweringError, match="opaque node '<lambda>'.*jax.Arrays"):
        hosted(jnp.ones(4))
    src = np.zeros(4)

    @eagle_fx.Graph.builder
    def closure(x):
        g = eagle_fx.Graph()
        g.add_node(eagle_fx.opaque(lambda: None, reads={"s": src}), name="peek")
        g.result = inc(x)
        return g
    refused(TypeError, lambda: closure(jnp.ones(4)), "argument 'x' is a jax.Array and array 0 of the graph (one "
            "the builder reads by closure", untouched=[src])


def test_an_opaque_node_on_a_plane_the_graph_makes_is_refused_writing_nothing():
    seen = []
    y = np.zeros(4)

    @eagle_fx.Graph.builder
    def hosted(x, y):
        g = eagle_fx.Graph(backend="jax")
        v = inc(x)                                # a plane the graph makes: no caller's array behind it
        g.add_node(eagle_fx.opaque(lambda: seen.append(1), reads={"v": v}), name="peek")
        accumulate(v, y)
        g.result = dbl(v)
        return g
    refused(eagle_fx.backends.jax.LoweringError, lambda: hosted(np.ones(4), y), "opaque node '<lambda>'",
            "touches a plane the graph makes", "declare builder arguments", untouched=[y])
    assert not seen


def test_a_host_node_runs_in_order_on_numpy_arguments():
    log = []
    x, y = np.arange(4.0), np.zeros(4)

    def scale():                                  # a host function: it works on the caller's array
        log.append(y.copy())
        np.multiply(y, 10.0, out=y)

    @eagle_fx.Graph.builder
    def hosted(x, v):
        g = eagle_fx.Graph(backend="jax")
        accumulate(x, v)                          # v = x + 1
        g.add_node(eagle_fx.opaque(scale, reads={"y": v}, writes={"y": v}), name="scale")
        g.result = dbl(v)
        return g
    g = hosted(x, y)
    np.testing.assert_allclose(g(), 20.0 * (x + 1.0))
    np.testing.assert_allclose(log[0], x + 1.0)       # the host saw the graph's value of y
    np.testing.assert_allclose(y, 10.0 * (x + 1.0))   # and its write is the caller's


JAX_MISSING = """
import sys
sys.modules["jax"] = None                 # as if the jax extra were not installed
import numpy as np
from eagle_fx.backends.select import use_backend
from tour_kernels import cell, loss
try:
    with use_backend("jax"):
        loss(np.ones(3), cell(1), 1)
except ImportError as e:
    print(e)
"""


def test_jax_missing_names_the_extra():
    run = subprocess.run([sys.executable, "-c", JAX_MISSING], capture_output=True, text=True, timeout=120,
                         cwd=__file__.rsplit("/", 1)[0])
    assert "the `jax` extra" in run.stdout and "eagle_fx[jax]" in run.stdout, run.stdout + run.stderr


@eagle_fx.Graph.builder
def bump_twice(x, y):
    g = eagle_fx.Graph()
    bump(x, y)
    mid = y                             # a version of y that a later write replaces
    bump(x, y)
    g.result = (mid, y)
    return g


def test_versions_of_a_written_argument_read_as_it(backend):
    y = np.zeros(3)
    mid, last = bump_twice(np.ones(3), y)()
    np.testing.assert_array_equal(y, [2.0, 2.0, 2.0])            # the final value, in the caller's array
    np.testing.assert_array_equal(mid, y)                       # every version lives in that one buffer
    np.testing.assert_array_equal(last, y)


def test_no_array_a_caller_holds_is_donated():
    # the caller's arguments, an earlier replay's written argument and results: all stay valid
    x0, y0, on = jnp.array([0.5, 1.0, 2.0, 40.0]), jnp.zeros(4), jnp.asarray(cell(1))
    g = climb(x0, on, y0)
    first = g()
    y1 = g.argument("y")
    for _ in range(3):
        g()
    for a in (x0, y0, on, y1, first["x"], first["sq"]):
        assert not a.is_deleted()
    want, _, wy = ref_climb(np.asarray(x0), 1, np.zeros(4))
    np.testing.assert_allclose(first["x"], want, rtol=1e-13)
    np.testing.assert_allclose(y1, wy, rtol=1e-13)
    np.testing.assert_array_equal(y0, np.zeros(4))
    np.testing.assert_array_equal(on, cell(1))


def test_numpy_arguments_written_in_place_are_donated_as_the_replays_own_copies():
    x0, flag, y = np.array([0.5, 1.0, 2.0, 40.0]), cell(1), np.zeros(4)
    keep_x = x0.copy()
    g = climb(x0, flag, y)
    assert sorted(g._exe.donated) == [1, 2]              # flag and y (written), not x (read only)
    for k in range(3):
        flag[0] = 1
        res = g()
        want, _, _ = ref_climb(x0, 1, 0)
        np.testing.assert_allclose(res["x"], want, rtol=1e-13)
        np.testing.assert_allclose(y, (k + 1) * want, rtol=1e-13)     # y += x at every replay, in place
    np.testing.assert_array_equal(x0, keep_x)
    assert y.flags.writeable and flag.flags.writeable


@eagle_fx.Graph.builder
def bump_twice_on_jax(x, y):
    g = eagle_fx.Graph(backend="jax")
    bump(x, y)                          # y += x, twice: a write through y is seen through x on NumPy
    bump(x, y)
    g.result = y
    return g


@eagle_fx.Graph.builder
def bump_once_on_jax(x, y):
    g = eagle_fx.Graph(backend="jax")
    bump(x, y)
    return g


def test_written_numpy_arguments_that_share_memory_are_refused_at_build_and_bind():
    # On NumPy y = A[:-1] and x = A[1:] alias: the second bump reads the first one's write through x.
    # JAX copies each argument on its own, so it would silently compute without that: refused.
    A = np.arange(1.0, 6.0)
    ref = A.copy()
    for _ in range(2):                  # the loop a NumPy user means, in place
        ref[:-1] += ref[1:].copy()
    numpy_run = A.copy()
    with eagle_fx.disable_staging():
        bump_twice_on_jax(numpy_run[1:], numpy_run[:-1])()
    np.testing.assert_allclose(numpy_run, ref)
    refused(ValueError, lambda: bump_twice_on_jax(A[1:], A[:-1]), "backend='jax'", "argument 'y' is written",
            "shares memory with argument 'x', which is read after the write", "copy", untouched=[A])
    g = bump_twice_on_jax(np.arange(1.0, 5.0), np.zeros(4))
    refused(ValueError, lambda: g.bind(y=g.argument("x")[::-1]), "eagle.Graph.bind", "shares memory")
    once = bump_once_on_jax(A[1:], A[:-1])      # one call reads both before it writes: as NumPy computes
    once()
    np.testing.assert_allclose(A, [3.0, 5.0, 7.0, 9.0, 5.0])
    x = np.arange(1.0, 5.0)             # apart: runs, as on NumPy
    y = np.zeros(4)
    g.bind(x=x, y=y)
    g()
    np.testing.assert_allclose(y, 2 * x)
