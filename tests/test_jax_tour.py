"""Every builder form of the tour on jax.Array arguments, against the NumPy backend's values for
the same form on NumPy arrays: results, the Mutable arguments a graph writes (on jax.Arrays: the
graph's rebound argument; the caller's array unchanged), and replays after a bind.

The forms are the tour's own functions: each section of eagle_fx/tour.py is run (its printing
swallowed) in a namespace of its own, so that a later section's kernel of the same name does not
replace the one an earlier section's builder calls."""
import ast
import contextlib
import io
import pathlib
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402

TOUR = pathlib.Path(eagle_fx.__file__).with_name("tour.py")


def _sections():
    """{section number: its namespace}. Each section runs in a copy of the namespace before it, so it
    sees what earlier sections made, and its own definitions do not reach earlier sections' builders."""
    src = TOUR.read_text()
    lines = src.splitlines(keepends=True)
    marks = []
    for node in ast.parse(src).body:
        call = getattr(node, "value", None)
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "section":
            marks.append((node.lineno - 1, ast.literal_eval(call.args[0])))
    # a chunk keeps its line numbers in tracebacks: blank lines stand for the lines above it
    chunks = [(title, "\n" * a + "".join(lines[a:b])) for (a, title), (b, _) in zip(marks, marks[1:] + [(len(lines), "")])]
    ns: dict = {"__name__": "tour_forms"}
    out = {}
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile("".join(lines[:marks[0][0]]), str(TOUR), "exec"), ns)
        for title, text in chunks:
            ns = dict(ns)
            exec(compile(text, str(TOUR), "exec"), ns)
            out[title.split(" ")[0].rstrip(".")] = ns
    return out


S = _sections()
J = jnp.asarray


def cell(v):
    return np.array([v], dtype=np.uint32)


def both(builder, *args, **kw):
    """The graph on NumPy copies (NumPy backend) and on jax.Array copies (jax backend) of `args`."""
    np_args = [np.array(a) if isinstance(a, np.ndarray) else a for a in args]
    jx_args = [J(a) if isinstance(a, np.ndarray) else a for a in args]
    return builder(*np_args, **kw), builder(*jx_args, **kw), np_args, jx_args


def same(got, want, rtol=1e-13):
    """Two result trees equal leaf by leaf; every leaf of `got` a jax.Array."""
    g_leaves, g_tree = jax.tree_util.tree_flatten(got)
    w_leaves, w_tree = jax.tree_util.tree_flatten(want)
    assert g_tree == w_tree
    for g, w in zip(g_leaves, w_leaves):
        assert isinstance(g, jax.Array), type(g)
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol)


def test_1_builder_block_and_a_block_on_a_hand_made_graph():
    ns = S["1"]
    gn, gj, _, _ = both(ns["first"], np.arange(4.0))
    same(gj(), gn())
    # a hand-made graph on jax.Arrays: the block's result stays a plane handle (a jax.Array cannot be
    # filled in place), which reads as the last launch's value
    h = eagle_fx.Graph()
    z = ns["twice"](h, J(np.arange(4.0)))
    h.build().launch()
    np.testing.assert_allclose(np.asarray(z), 4.0 * np.arange(4.0))
    # its host node reads and writes NumPy arrays: with a jax.Array in the same graph it is refused
    src, dst = np.arange(4.0), np.zeros(4)
    h = eagle_fx.Graph()
    h.add_node(ns["opaque"](lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}), name="shift")
    ns["twice"](h, J(np.ones(4)))
    with pytest.raises(TypeError, match="not both"):
        h.build()
    np.testing.assert_array_equal(dst, np.zeros(4))


def test_2_forks_branches_wait():
    gn, gj, _, _ = both(S["2"]["forks"], np.arange(4.0))
    same(gj(), gn())


def test_3_device_if_elif_else_python_if_and_for():
    choose = S["3"]["choose"]
    for flag, which, debug in [(1, 1, True), (0, 1, True), (0, 0, False)]:
        gn, gj, _, _ = both(choose, np.arange(4.0), cell(flag), cell(which), debug)
        same(gj(), gn())
        gn.bind(flag=cell(1 - flag))                 # the cell read per replay: another arm
        gj.bind(flag=J(cell(1 - flag)))
        same(gj(), gn())


def test_4_device_loops():
    ns = S["4"]
    for n in (0, 3, 7):
        gn, gj, _, _ = both(ns["counted"], np.zeros(4), cell(n))
        same(gj(), gn())
    for x0 in (np.ones(4), np.array([0.5, 3.0, 200.0, 7.0])):
        gn, gj, np_args, _ = both(ns["capped"], x0, cell(1))
        same(gj(), gn())
        np.testing.assert_array_equal(gj.argument("flag"), np_args[1])      # the written guard, carried
        same(gj(), gn())                                                    # guard 0 now: no turn on either
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                                     # uncapped: warns at build
        for done in (0, 1):
            gn, gj, np_args, jx_args = both(ns["early_exit"], np.zeros(4), cell(1), cell(done))
            same(gj(), gn())
            for name, arr in zip(("flag", "done"), np_args[1:]):
                np.testing.assert_array_equal(gj.argument(name), arr)
            np.testing.assert_array_equal(jx_args[1], cell(1))               # the caller's jax.Array: unchanged
        gn, gj, _, _ = both(ns["skipping"], np.zeros(4), cell(1), cell(0))
        same(gj(), gn())


def test_5_match():
    for s in (0, 2, 5):
        gn, gj, _, _ = both(S["5"]["chooser"], np.full(4, 3.0), cell(s))
        same(gj(), gn())


def test_6_buffers_and_results():
    ns = S["6"]
    # `keep` gives buffer= a NumPy array it makes: with jax.Array arguments that is refused, naming it
    with pytest.raises(TypeError, match=r"argument 'x' is a jax.Array and array 1 of the graph \(one the builder "
                                        r"reads by closure or a buffer=\) is a ndarray"):
        ns["keep"](J(np.arange(4.0)))

    @eagle_fx.Graph.builder
    def keep(x, mine):                                # the same form with the buffer= array an argument
        g = eagle_fx.Graph()
        a = ns["inc"](x, buffer=True)
        b = ns["dbl"](a, buffer=mine)
        g.result = {"a": a, "pair": (b, [ns["square"](b)])}
        return g
    gn, gj, np_args, jx_args = both(keep, np.arange(4.0), np.zeros(4))
    same(gj(), gn())
    np.testing.assert_array_equal(gj.argument("mine"), np_args[1])   # buffer=: the graph's array holds b
    np.testing.assert_array_equal(jx_args[1], np.zeros(4))          # the caller's jax.Array: unchanged
    gn, gj, np_args, jx_args = both(ns["void"], np.arange(4.0), np.zeros(4))
    assert gj() is None and gn() is None
    np.testing.assert_array_equal(gj.argument("y"), np_args[1])
    np.testing.assert_array_equal(jx_args[1], np.zeros(4))


def test_7_running_verbs():
    gn, gj, _, _ = both(S["1"]["first"], np.arange(4.0))
    same(gj(), gn())
    same(gj(10), gn(10))
    gn.bind(x=np.arange(4.0) + 10.0)
    gj.bind(x=J(np.arange(4.0) + 10.0))
    same(gj(), gn())
    r = gj.result
    gj.launch(2)
    gj.enqueue(3)
    gj.synchronize()
    same(gj.result, gn())
    np.testing.assert_allclose(r, gj.result)                 # an old result stays valid: nothing is overwritten


def test_8_gradients_on_jax_arrays_go_through_to_jax():
    ns = S["8"]
    x = np.arange(4.0)
    with pytest.raises(NotImplementedError, match="record=True graphs .* eagle_fx.to_jax and jax.grad"):
        ns["model"](J(x), J(np.zeros(4)), record=True)
    gr = ns["model"](x, np.zeros(4), record=True)
    gr()
    want = eagle_fx.diff.reverse(gr.record, {"result": np.ones(4)}, wrt=("x",))["x"]
    f = eagle_fx.to_jax(ns["model"])
    got = jax.grad(lambda u: jnp.sum(f(u, J(np.zeros(4)))))(J(x))
    np.testing.assert_allclose(got, want, rtol=1e-13)
    np.testing.assert_allclose(got, 4.0 * (2.0 * x + 1.0), rtol=1e-13)   # d/dx sum((2x+1)^2)


def test_9_refusals_are_the_same_on_jax_arrays():
    ns = S["8"]
    x = J(np.arange(4.0))

    @eagle_fx.Graph.builder
    def returns_array(x):
        eagle_fx.Graph()
        return ns["inc"](x)

    @eagle_fx.Graph.builder
    def top_level_wait(x):
        g = eagle_fx.Graph()
        g.wait(x)
        return g

    @eagle_fx.Graph.builder
    def overlap(x):
        g = eagle_fx.Graph()
        a = ns["dbl"](x)
        with g.parallel() as p:
            with p.branch():
                u = ns["inc"](a)
            with p.branch():
                ns["add"](u, a)
        return g

    for f, exc in ((returns_array, TypeError), (top_level_wait, RuntimeError), (overlap, Exception)):
        with pytest.raises(exc) as on_jax:
            f(x)
        with pytest.raises(exc) as on_numpy:
            f(np.arange(4.0))
        assert type(on_jax.value) is type(on_numpy.value)
    g = S["1"]["first"](x)
    with pytest.raises(ValueError, match="changed shape/dtype"):
        g.bind(x=J(np.arange(5.0)))
    with pytest.raises(ValueError, match="'x' was built with a jax.Array and got a numpy.ndarray; the array type "
                                         "chose the graph's backend"):
        g.bind(x=np.arange(4.0))                      # a NumPy array for a jax.Array argument


def test_10_one_graph_with_everything():
    ns = S["10.6"]
    x8 = np.arange(8.0)
    gn, gj, np_args, jx_args = both(ns["whole"], x8, np.array([1], np.uint32), np.zeros(8))
    gn.bind(x=x8 + 1.0)
    gj.bind(x=J(x8 + 1.0))
    same(gj(), gn())
    same(gj(10), gn(10))
    gn.launch(10)
    gn.enqueue(5)
    gn.synchronize()
    gj.launch(10)
    gj.enqueue(5)
    gj.synchronize()
    same(gj.result, gn.result)
    for name, arr in zip(("flag", "y"), np_args[1:]):
        np.testing.assert_allclose(gj.argument(name), arr, rtol=1e-13)
    np.testing.assert_array_equal(jx_args[2], np.zeros(8))


def test_11_the_result_forms():
    ns = S["11"]
    x8 = np.arange(8.0)
    for name in ("chain", "pair"):
        gn, gj, _, _ = both(ns[name], x8)
        same(gj(), gn())
    gn, gj, np_args, _ = both(ns["void"], x8, np.zeros(8))
    assert gj() is None and gn() is None
    np.testing.assert_allclose(gj.argument("y"), np_args[1], rtol=1e-13)
