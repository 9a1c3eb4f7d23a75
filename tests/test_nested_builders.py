"""A builder called inside another builder on the staged values of the graph being built stages its
body into that graph (inlines), and returns a stand-in whose .result the caller composes with.

Checked against plain NumPy (values, vmap), JAX on the same math in float64 (grad, jvp), and the
same program written with a block:
  * one builder in another, called twice, stages the Program the block form stages; a dict
    result (named outputs);
  * device control flow in the inner builder: an if and a loop on one-cell arrays;
  * grad, jvp and vmap of the outer builder, and jax.jvp of its to_jax;
  * a Mutable write of the inner builder to the outer builder's argument lands in it;
  * a NumPy array passed with the staged values is read at every replay, as a builder's argument;
  * a builder called with no staged value builds a graph of its own, as from plain code;
  * a fork inside the inner builder, on a branch of the outer one; a hazard it makes is refused
    naming the inner builder's line;
  * a cached outer builder called again on new arrays;
  * refusals: running the stand-in, an argument of a third graph, a value of a finished graph, an
    outer value reached by name in a builder that builds its own graph;
  * the inner builder called in a device loop and a device if of the outer one;
  * a seeded sweep of random nestings, with device loops and ifs around the nested calls (values
    against NumPy, gradients against JAX).
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hk
from hawk_fx import Scalar
from eagle_fx.transforms.program import TransformError
from hawk_fx.core import LeakedTracerError
from tour_kernels import accumulate, cell, dbl, grow, inc, total, wobble

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

RTOL, ATOL = 1e-10, 1e-12
N = 5
rng = np.random.default_rng(20260105)


# ---------------------------------------------------------------------------------------------
# builders: each inlined form, and its twin written with a block

@ef.Graph.builder
def square_of(x):
    g = ef.Graph()
    g.result = dbl(x) * 0.5 * x           # staged NumPy on the argument: x * x
    return g


@ef.Graph.builder
def fourth(x):
    g = ef.Graph()
    y = square_of(x)
    g.result = square_of(y.result).result
    return g


@ef.Graph.builder
def body(x, flag, n):
    """An optional wobble, n turns of grow (device if and loop), two named outputs."""
    g = ef.Graph()
    if flag:
        x = wobble(x)
    for i in range(n):
        x = grow(x, 1.1)
    g.result = {"y": x, "twice": dbl(x)}
    return g


@ef.Graph.builder
def outer(x, flag, n):
    g = ef.Graph()
    r = body(inc(x), flag, n)
    g.result = total(r.result["y"])
    return g


@ef.Graph.builder
def body_block(g: ef.Graph, x, flag, n):
    if flag:
        x = wobble(x)
    for i in range(n):
        x = grow(x, 1.1)
    return x


@ef.Graph.builder
def outer_block(x, flag, n):
    g = ef.Graph()
    g.result = total(body_block(g, inc(x), flag, n))
    return g


def body_np(x, flag, n, xp=np):
    if flag:
        x = xp.sin(x) * x
    for _ in range(n):
        x = 1.1 * x + 0.1 * xp.tanh(x)
    return x


def outer_np(x, flag, n, xp=np):
    y = body_np(x + 1.0, flag, n, xp)
    return xp.sum(y * y)


# ---------------------------------------------------------------------------------------------
# values

@ef.Graph.builder
def square_block(g: ef.Graph, x):
    return dbl(x) * 0.5 * x


@ef.Graph.builder
def fourth_block(x):
    g = ef.Graph()
    g.result = square_block(g, square_block(g, x))
    return g


def test_builder_in_builder_matches_numpy_and_stages_the_block_program():
    x = rng.normal(size=N)
    np.testing.assert_allclose(fourth(x)(), x ** 4, rtol=RTOL)
    assert str(fourth(x).program) == str(fourth_block(x).program)


@pytest.mark.parametrize("flag,n", [(0, 0), (1, 0), (0, 3), (1, 2)])
def test_device_flow_inside_inner_matches_numpy_and_block(flag, n):
    x = rng.normal(size=N)
    want = outer_np(x, flag, n)
    got = outer(x, cell(flag), cell(n))()
    np.testing.assert_allclose(got, [want], rtol=RTOL)
    np.testing.assert_allclose(got, outer_block(x, cell(flag), cell(n))(), rtol=RTOL)


def test_named_outputs_are_staged_values_of_the_outer_graph():
    @ef.Graph.builder
    def both(x, flag, n):
        g = ef.Graph()
        r = body(x, flag, n).result
        g.result = (r["y"], r["twice"])
        return g
    x = rng.normal(size=N)
    y, twice = both(x, cell(1), cell(2))()
    np.testing.assert_allclose(y, body_np(x, 1, 2), rtol=RTOL)
    np.testing.assert_allclose(twice, 2 * body_np(x, 1, 2), rtol=RTOL)


def test_the_graph_replays_with_new_loop_counts():
    x, n = rng.normal(size=N), cell(1)
    g = outer(x, cell(0), n)
    for k in (1, 4, 2):
        n[0] = k
        np.testing.assert_allclose(g(), [outer_np(x, 0, k)], rtol=RTOL)


# ---------------------------------------------------------------------------------------------
# transforms of the outer builder

def test_grad_of_outer_matches_jax_and_block():
    x = rng.normal(size=N)
    for flag, n in ((1, 3), (0, 1)):
        want = jax.grad(lambda v: outer_np(v, flag, n, jnp))(x)
        got = ef.grad(outer)(x, cell(flag), cell(n))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got, ef.grad(outer_block)(x, cell(flag), cell(n)), rtol=RTOL, atol=ATOL)


def test_jvp_of_outer_matches_jax():
    x, t = rng.normal(size=N), rng.normal(size=N)
    want_y, want_t = jax.jvp(lambda v: outer_np(v, 1, 2, jnp), (x,), (t,))
    y, dy = ef.jvp(outer, (x, cell(1), cell(2)), (t, None, None))
    np.testing.assert_allclose(y, [want_y], rtol=RTOL)
    np.testing.assert_allclose(dy, [want_t], rtol=RTOL)


def test_vmap_of_outer_matches_numpy():
    xs = rng.normal(size=(3, N))
    got = ef.vmap(outer, in_axes=(0, None, None))(xs, cell(1), cell(2))()
    want = [[outer_np(x, 1, 2)] for x in xs]
    np.testing.assert_allclose(got, want, rtol=RTOL)


# ---------------------------------------------------------------------------------------------
# arrays: in-place writes land, NumPy arguments are read at each replay

@ef.Graph.builder
def write_into(s, y):
    g = ef.Graph()
    accumulate(dbl(s), y)                 # y = 2 s + 1, in place
    g.result = y
    return g


@ef.Graph.builder
def outer_writes(x, y):
    g = ef.Graph()
    r = write_into(x, y)
    g.result = inc(r.result)
    return g


def test_mutable_write_of_inner_lands_in_outer_argument():
    x, y = rng.normal(size=N), np.zeros(N)
    g = outer_writes(x, y)
    out = g()
    np.testing.assert_allclose(y, 2 * x + 1, rtol=RTOL)
    np.testing.assert_allclose(out, 2 * x + 2, rtol=RTOL)
    x[:] = rng.normal(size=N)              # the graph reads its argument at every replay
    g()
    np.testing.assert_allclose(y, 2 * x + 1, rtol=RTOL)


@ef.Graph.builder
def shifted(x, c):
    g = ef.Graph()
    g.result = x + c
    return g


def test_numpy_argument_beside_staged_values_is_read_at_each_replay():
    c = np.ones(N)

    @ef.Graph.builder
    def use(x):
        g = ef.Graph()
        g.result = shifted(dbl(x), c).result
        return g
    x = rng.normal(size=N)
    g = use(x)
    np.testing.assert_allclose(g(), 2 * x + 1, rtol=RTOL)
    c[:] = 5.0
    np.testing.assert_allclose(g(), 2 * x + 5, rtol=RTOL)


def test_builder_on_numpy_arrays_only_builds_its_own_graph():
    seen = {}

    @ef.Graph.builder
    def outer_own(x):
        g = ef.Graph()
        seen["inner"] = square_of(np.full(N, 3.0))      # no staged value: a graph of its own
        g.result = dbl(x)
        return g
    x = rng.normal(size=N)
    np.testing.assert_allclose(outer_own(x)(), 2 * x, rtol=RTOL)
    assert isinstance(seen["inner"], ef.Graph)
    np.testing.assert_allclose(seen["inner"](), np.full(N, 9.0), rtol=RTOL)


# ---------------------------------------------------------------------------------------------
# refusals

def test_running_the_inlined_graph_is_refused():
    @ef.Graph.builder
    def runs(x, verb):
        g = ef.Graph()
        r = square_of(x)
        r() if verb == "call" else r.launch()
        g.result = x
        return g
    for verb, what in (("call", r"calling it \(g\(\)\)"), ("launch", r"\.launch")):
        with pytest.raises(RuntimeError, match=rf"builder square_of: {what} on the graph it returned inside the "
                                               r"graph of builder runs.*inlined.*Use its \.result"):
            runs(np.ones(N), verb)


HELD = {}


@ef.Graph.builder
def middle(c):
    h = ef.Graph()
    h.result = square_of(HELD["x"]).result         # a value of the outer graph, in middle's own graph
    return h


@ef.Graph.builder
def holds(x):
    g = ef.Graph()
    HELD["x"] = x
    middle(np.ones(N))
    g.result = x
    return g


def test_argument_of_a_third_graph_is_refused():
    with pytest.raises(ValueError, match=r"eagle_fx.Graph.builder square_of, called at middle:\d+: an argument is "
                                         r"the staged value 'x' of the graph of builder holds, but the graph of "
                                         r"builder middle is the one being built.*pass the value through"):
        holds(np.ones(N))


def test_value_of_a_finished_graph_is_refused():
    kept = []

    @ef.Graph.builder
    def leaks(x):
        g = ef.Graph()
        kept.append(x)
        g.result = x
        return g

    @ef.Graph.builder
    def late(x):
        g = ef.Graph()
        g.result = square_of(kept[0]).result
        return g
    leaks(np.ones(N))
    with pytest.raises(LeakedTracerError, match=r"builder square_of: an argument is the staged value 'x' made by "
                                                r"eagle.Graph.builder leaks.*which has finished"):
        late(np.ones(N))


def test_kernels_in_a_plain_function_under_jvp_say_make_it_a_builder():
    def plain(x):
        g = ef.Graph()
        g.result = dbl(x)
        return g
    with pytest.raises(TransformError, match=r"computed in Python from x.*make the function a "
                                                r"@eagle_fx.Graph.builder"):
        ef.jvp(plain, (np.ones(N),), (np.ones(N),))
    _, f_jvp = ef.linearize(plain, np.ones(N))
    with pytest.raises(TransformError, match=r"eagle_fx.linearize: plain .*make the function a "
                                                r"@eagle_fx.Graph.builder"):
        f_jvp(np.ones(N))


# ---------------------------------------------------------------------------------------------
# a seeded sweep of random nestings

OPS = (inc, dbl, wobble)
OPS_NP = (lambda x, xp: x + 1.0, lambda x, xp: 2.0 * x, lambda x, xp: xp.sin(x) * x)


@ef.Graph.builder(static_argnames=("plan",))
def nest(x, n, plan):
    """Apply plan: an int applies OPS[int]; a tuple is a nested call of this builder (inlined), run
    once, n times in a device loop ("loop", ...) or when n is not 0 in a device if ("if", ...)."""
    g = ef.Graph()
    for item in plan:
        if isinstance(item, int):
            x = OPS[item](x)
        elif item[0] == "loop":
            for i in range(n):
                x = nest(x, n, item[1]).result
        elif item[0] == "if":
            if n:
                x = nest(x, n, item[1]).result
        else:
            x = nest(x, n, item).result
    g.result = x
    return g


@ef.Graph.builder(static_argnames=("plan",))
def nest_loss(x, n, plan):
    g = ef.Graph()
    g.result = total(nest(x, n, plan).result)
    return g


def nest_np(x, n, plan, xp=np):
    for item in plan:
        if isinstance(item, int):
            x = OPS_NP[item](x, xp)
        elif item[0] in ("loop", "if"):
            for _ in range(n if item[0] == "loop" else min(n, 1)):
                x = nest_np(x, n, item[1], xp)
        else:
            x = nest_np(x, n, item, xp)
    return x


def random_plan(r, depth):
    items = []
    for _ in range(r.integers(1, 4)):
        u = r.random() if depth > 0 else 1.0
        if u < 0.3:
            items.append(random_plan(r, depth - 1))
        elif u < 0.45:
            items.append(("loop", random_plan(r, depth - 1)))
        elif u < 0.6:
            items.append(("if", random_plan(r, depth - 1)))
        else:
            items.append(int(r.integers(len(OPS))))
    return tuple(items)


@pytest.mark.parametrize("seed", range(8))
def test_random_nestings_match_numpy_and_jax(seed):
    r = np.random.default_rng(seed)
    plan, x, n = random_plan(r, 3), r.uniform(-0.5, 0.5, size=N), cell(1)
    g = nest(x, n, plan)
    for k in (1, 2, 0):                   # one graph: the loops' counts and the ifs' condition replay
        n[0] = k
        np.testing.assert_allclose(g(), nest_np(x, k, plan), rtol=RTOL, atol=ATOL)
    k = int(r.integers(1, 3))
    want = jax.grad(lambda v: jnp.sum(nest_np(v, k, plan, jnp) ** 2))(x)
    np.testing.assert_allclose(ef.grad(nest_loss)(x, cell(k), plan), want, rtol=1e-9, atol=ATOL)


@pytest.mark.parametrize("flag,n,m", [(1, 2, 2), (0, 1, 3), (1, 0, 0), (0, 2, 1)])
def test_inner_called_in_device_flow_of_outer(flag, n, m):
    @ef.Graph.builder
    def around(x, flag, n, m):
        g = ef.Graph()
        for i in range(m):
            x = body(x, flag, n).result["y"]
        if flag:
            x = square_of(x).result
        else:
            x = body(x, flag, n).result["twice"]
        g.result = total(x)
        return g

    def around_np(x, xp=np):
        for _ in range(m):
            x = body_np(x, flag, n, xp)
        x = x * x if flag else 2 * body_np(x, flag, n, xp)
        return xp.sum(x * x)
    x = rng.uniform(-1.0, 1.0, size=N)
    args = (x, cell(flag), cell(n), cell(m))
    np.testing.assert_allclose(around(*args)(), [around_np(x)], rtol=RTOL)
    np.testing.assert_allclose(ef.grad(around)(*args), jax.grad(lambda v: around_np(v, jnp))(x), rtol=1e-9, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# forks and arrays passed beside the staged values

@ef.Graph.builder
def forked(x, out):
    """A fork of its own, and a write to a NumPy array passed beside the staged value."""
    g = ef.Graph()
    with g.parallel() as p:
        with p.branch():
            a = dbl(x)
        with p.branch():
            b = inc(x)
    accumulate(a, out)                    # out = 2 x + 1, in place
    g.result = (a, b)
    return g


def test_fork_inside_inner_called_on_a_branch_of_outer():
    out = np.zeros(N)

    @ef.Graph.builder
    def branches(x):
        g = ef.Graph()
        with g.parallel() as p:
            with p.branch():
                a, b = forked(x, out).result
            with p.branch():
                c = dbl(dbl(x))
        g.result = (a, b, c)
        return g
    x = rng.normal(size=N)
    a, b, c = branches(x)()
    np.testing.assert_allclose(a, 2 * x, rtol=RTOL)
    np.testing.assert_allclose(b, x + 1, rtol=RTOL)
    np.testing.assert_allclose(c, 4 * x, rtol=RTOL)
    np.testing.assert_allclose(out, 2 * x + 1, rtol=RTOL)


def test_hazard_between_inner_and_a_sibling_branch_is_refused():
    out = np.zeros(N)

    @ef.Graph.builder
    def racing(x):
        g = ef.Graph()
        with g.parallel() as p:
            with p.branch():
                forked(x, out)            # writes out ...
            with p.branch():
                accumulate(x, out)        # ... and so does this sibling branch
        g.result = x
        return g
    with pytest.raises(ValueError, match=r"two branches of one parallel region.*at forked:\d+.*at racing:\d+"):
        racing(np.ones(N))
    assert not out.any()


def test_cached_outer_graph_rebinds_new_arrays():
    for _ in range(3):                    # the second and third calls replay the staging of the first
        x, y = rng.normal(size=N), np.zeros(N)
        out = outer_writes(x, y)()
        np.testing.assert_allclose(y, 2 * x + 1, rtol=RTOL)
        np.testing.assert_allclose(out, 2 * x + 2, rtol=RTOL)


@ef.Graph.builder
def reaches(c):
    h = ef.Graph()
    h.result = dbl(HELD["x"])             # the outer graph's value, by name, in a graph of its own
    return h


def test_outer_value_reached_by_name_says_pass_it_as_an_argument():
    @ef.Graph.builder
    def holds_too(x):
        g = ef.Graph()
        HELD["x"] = x
        reaches(np.ones(N))
        g.result = x
        return g
    with pytest.raises(ValueError, match=r"staged value 'x' of eagle.Graph.builder holds_too.*another graph being "
                                         r"built.*pass the value to the inner builder as an argument"):
        holds_too(np.ones(N))


def test_to_jax_of_outer_matches_jax():
    x, t = rng.normal(size=N), rng.normal(size=N)
    f = ef.to_jax(outer)
    flag, n = jnp.asarray(cell(1)), jnp.asarray(cell(2))
    y, dy = jax.jvp(lambda v: f(v, flag, n), (jnp.asarray(x),), (jnp.asarray(t),))
    want_y, want_t = jax.jvp(lambda v: outer_np(v, 1, 2, jnp), (x,), (t,))
    np.testing.assert_allclose(y, [want_y], rtol=RTOL)
    np.testing.assert_allclose(dy, [want_t], rtol=RTOL)


def test_inlined_builder_that_does_not_return_its_graph_is_refused():
    @ef.Graph.builder
    def forgets(x):
        g = ef.Graph()
        g.result = dbl(x)

    @ef.Graph.builder
    def calls(x):
        g = ef.Graph()
        forgets(x)
        g.result = x
        return g
    with pytest.raises(TypeError, match=r"forgets: a builder returns its graph: `return g`"):
        calls(np.ones(N))


def test_builders_and_kernels_defined_inside_a_builder_body():
    """A builder, a block and a kernel defined in a builder's own body: each is rewritten inside
    a rewritten function (both close over the rewrite's runtime name), against NumPy."""
    @ef.Graph.builder
    def outer(x):
        @hk.kernel
        def cube(v: Scalar) -> Scalar:
            return v * v * v

        @ef.Graph.builder
        def inner(v):
            h = ef.Graph()
            h.result = cube(v)
            return h

        @ef.Graph.builder
        def block(g: ef.Graph, v):
            return cube(v) + 1.0

        g = ef.Graph()
        g.result = block(g, inner(cube(x)).result)
        return g

    x = np.linspace(-1.0, 2.0, 5)
    np.testing.assert_allclose(outer(x)(), ((x ** 3) ** 3) ** 3 + 1.0, rtol=1e-12)
