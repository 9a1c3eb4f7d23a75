"""Result arrays of backend="jax" and backend="auto" (once on XLA) on NumPy arguments: a result
plane is copied into the graph's result array only once that array has been handed out, and a
transformed function's call gets XLA's output as its own array, with no copy. What must not
change: a held `g.result` shows every replay, result identity holds across replays and the swap,
a returned array is fresh, writable and shares memory with nothing else. Oracles: JAX (x64) on
the same math, plain NumPy."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.jax import TAKE_BYTES  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from eagle_fx.backends.tiered import tier_policy  # noqa: E402
from hawk_fx import Scalar  # noqa: E402

N = 2 * TAKE_BYTES // 8               # results large enough to be given away
SWAP_AT_FIRST = dict(seconds=0, replays=1, background=False, trial=0)


@hawk.kernel
def dbl_inc(x: Scalar) -> Scalar:
    return 2.0 * x + 1.0


@hawk.kernel
def same(x: Scalar) -> Scalar:
    return x * 1.0                    # XLA may hand back the argument's own buffer for this


@hawk.kernel
def ident(x: Scalar) -> Scalar:
    return x                          # the output is the argument: jax may return its buffer


@hawk.kernel
def sumsq(y: Scalar) -> Scalar:
    return hawk.sum(y * y)


@eagle_fx.Graph.builder
def chain(x):
    g = eagle_fx.Graph()
    for _ in range(3):
        x = dbl_inc(x)
    g.result = x
    return g


@eagle_fx.Graph.builder
def loss(x):
    g = eagle_fx.Graph()
    for _ in range(3):
        x = dbl_inc(x)
    g.result = sumsq(x)
    return g


@eagle_fx.Graph.builder
def twice(x):
    g = eagle_fx.Graph()
    y = dbl_inc(x)
    g.result = (y, same(x), y, ident(x))
    return g


def np_chain(x):
    for _ in range(3):
        x = 2.0 * x + 1.0
    return x


def jax_loss(x):
    return jnp.sum(np_chain(x) ** 2)


@pytest.fixture(params=["jax", "auto"])
def backend(request):
    eagle_fx.clear_caches()
    with use_backend(request.param), tier_policy(**SWAP_AT_FIRST):
        yield request.param


def _apart(arrays):
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)


def test_grad_returns_fresh_writable_arrays(backend):
    f = eagle_fx.grad(loss)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, N) for _ in range(4)]
    outs = [f(x) for x in xs]                         # auto swaps to XLA on the first replays
    for x, g in zip(xs, outs):
        np.testing.assert_allclose(g, jax.grad(jax_loss)(x), rtol=1e-12)
        assert g.flags.writeable and g.shape == x.shape
    _apart(outs + xs)
    outs[-1][:] = 7.0                                 # the caller's own: writing it changes nothing else
    again = f(xs[0])
    np.testing.assert_allclose(again, jax.grad(jax_loss)(xs[0]), rtol=1e-12)
    np.testing.assert_allclose(outs[-2], jax.grad(jax_loss)(xs[-2]), rtol=1e-12)
    assert not np.shares_memory(again, outs[-1])


def test_value_and_grad_small_value_large_gradient(backend):
    f = eagle_fx.value_and_grad(loss)
    x = np.random.default_rng(1).uniform(-1, 1, N)
    for _ in range(3):
        v, g = f(x)
        jv, jg = jax.value_and_grad(jax_loss)(x)
        np.testing.assert_allclose(np.asarray(v).reshape(()), jv, rtol=1e-12)
        np.testing.assert_allclose(g, jg, rtol=1e-12)
        _apart([np.asarray(v), g, x])


def test_same_plane_twice_and_a_forwarded_argument_are_copies(backend):
    """A result holding one plane twice gets two arrays; an output XLA may take from an argument
    is never given away (writing the result must not write the argument)."""
    rng = np.random.default_rng(2)
    x, t = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    held, held_t = x.copy(), t.copy()
    for _ in range(3):
        (a, s, b, i), (da, ds, db, di) = eagle_fx.jvp(twice, (x,), (t,))
        for y, dy in ((a, da), (b, db)):
            np.testing.assert_array_equal(y, 2.0 * x + 1.0)
            np.testing.assert_array_equal(dy, 2.0 * t)
        for y, dy in ((s, ds), (i, di)):
            np.testing.assert_array_equal(y, x)
            np.testing.assert_array_equal(dy, t)
        _apart([a, s, b, i, da, ds, db, di, x, t])
        for y in (a, s, b, i, da, ds, db, di):
            y[:] = -1.0
        np.testing.assert_array_equal(x, held)
        np.testing.assert_array_equal(t, held_t)


def test_held_result_sees_every_replay(backend):
    """Replays that nobody reads, then a read; a held result then follows each replay (seeded
    sweep of launches, reads and argument writes against NumPy)."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-1, 1, N)
        g = chain(x)
        first = expect = None
        for _ in range(12):
            op = rng.integers(3)
            if op == 0:
                x[:] = rng.uniform(-1, 1, N)
            elif op == 1:
                g.launch(int(rng.integers(1, 3)))
                expect = np_chain(x)
            else:
                r = g.result
                first = r if first is None else first
                assert r is first                      # one array across replays (and the swap)
                if expect is not None:
                    np.testing.assert_array_equal(r, expect)
                g.launch()
                np.testing.assert_array_equal(first, np_chain(x))
                expect = np_chain(x)
        g.launch()
        np.testing.assert_array_equal(g.result, np_chain(x))


def test_auto_back_on_numpy_reads_the_last_xla_replay():
    """A graph that settles on NumPy after XLA replays nobody read: its result arrays hold the
    last replay's values."""
    x = np.random.default_rng(5).uniform(-1, 1, N)
    with use_backend("auto"), tier_policy(**SWAP_AT_FIRST):
        g = chain(x)
        g.launch()
        g.launch(2)                 # the first replay compiled; this one swapped to XLA
    exe = g._exe
    assert exe.backend_name == "auto/jax"
    x *= 0.5
    g.launch()
    exe._settle_numpy("a test", warn=False)
    assert exe.backend_name == "auto/cpu"
    np.testing.assert_array_equal(g.result, np_chain(x))
