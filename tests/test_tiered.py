"""backend="auto": a graph starts on NumPy and is swapped to XLA between two replays once hot.
The swap keeps the NumPy backend's meaning of Mutables, cells, bind and buffers (checked against
plain NumPy, and by running the backend-agreement tests with the swap forced at their second
replay); replays from several threads never see half a swap; a compile that fails leaves the graph
on NumPy with one warning and nothing lost."""
import importlib
import inspect
import threading
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import eagle_fx  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends import tiered  # noqa: E402
from eagle_fx.backends.jax import JaxExecutable  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from eagle_fx.backends.tiered import tier_policy, wait_for_compiles  # noqa: E402
from hawk_fx import Mutable, Scalar  # noqa: E402
from hawk_fx import math as hm  # noqa: E402
from tour_kernels import affine, below, cell, square  # noqa: E402

SWAP_AT_SECOND = dict(seconds=0, replays=1, background=False, trial=0)   # first replay NumPy, then XLA


@hawk.kernel
def bump(s: Scalar, y: Mutable[Scalar]):
    y = y + s


@hawk.kernel
def wave(x: Scalar) -> Scalar:
    return hm.sin(x) * hm.exp(-0.1 * x * x)


@eagle_fx.Graph.builder
def climb(x, flag, y, keep):
    g = eagle_fx.Graph()
    for _ in range(30):
        if not flag:
            break
        x = affine(x, 1.5, 0.25)
        below(x, 30.0, flag)
    bump(x, y)                              # a Mutable argument: y += x at every replay
    w = wave(x, buffer=keep)                # a buffer= array of the caller's
    g.result = {"x": x, "sq": square(x), "w": w}
    return g


def ref_climb(x, flag):
    for _ in range(30):
        if not flag:
            break
        x = 1.5 * x + 0.25
        flag = int(np.sum(x < 30.0))
    return x, flag


def auto_graph(builder, *args, **policy):
    with use_backend("auto"), tier_policy(**(policy or SWAP_AT_SECOND)):
        return builder(*args)


def test_the_swap_keeps_mutables_cells_bind_buffers_and_result_arrays():
    x0, flag, y, keep = np.array([0.5, 1.0, 2.0, 40.0]), cell(1), np.zeros(4), np.zeros(4)
    g = auto_graph(climb, x0, flag, y, keep)
    exe = g._exe
    assert exe.state == "numpy" and repr(g).endswith("auto/cpu>")
    want, wflag = ref_climb(x0, 1)
    res = g()                                          # replay 1: NumPy
    stable = {k: res[k] for k in res}
    np.testing.assert_allclose(res["x"], want, rtol=1e-13)
    assert int(flag[0]) == wflag == 0                  # the caller's cell, written in place
    np.testing.assert_allclose(y, want, rtol=1e-13)
    flag[0] = 1
    res = g()                                          # replay 2: swapped to XLA at its start
    assert exe.state == "jax" and repr(g).endswith("auto/jax>")
    for k in res:
        assert res[k] is stable[k]                     # the same result arrays as before the swap
    np.testing.assert_allclose(res["x"], want, rtol=1e-13)
    np.testing.assert_allclose(res["sq"], want * want, rtol=1e-13)
    np.testing.assert_allclose(keep, np.sin(want) * np.exp(-0.1 * want * want), rtol=1e-12)
    np.testing.assert_allclose(y, 2 * want, rtol=1e-13)
    assert int(flag[0]) == 0
    g()                                                # flag 0: no turn; y grows by x0
    np.testing.assert_allclose(res["x"], x0, rtol=1e-13)
    np.testing.assert_allclose(y, 2 * want + x0, rtol=1e-13)
    x1 = np.array([3.0, 2.0, 1.0, 0.0])
    g.bind(x=x1)                                       # rebinds both executables
    flag[0] = 1
    g()
    np.testing.assert_allclose(g.result["x"], ref_climb(x1, 1)[0], rtol=1e-13)
    assert g.argument("x") is x1


class _Clock:
    """A clock that moves a quarter second at every reading: each replay measures 0.25 s."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        self.t += 0.25
        return self.t


@settings(max_examples=8, deadline=None)
@given(replays=st.integers(1, 5), quarters=st.integers(0, 7))
def test_it_tiers_up_when_replays_and_their_cost_both_cross_the_threshold(replays, quarters):
    real = tiered.time
    tiered.time = _Clock()
    try:
        x0, flag, y, keep = np.array([0.5, 1.0, 2.0]), cell(1), np.zeros(3), np.zeros(3)
        g = auto_graph(climb, x0, flag, y, keep, seconds=0.25 * quarters, replays=replays, background=False,
                       trial=0)
        hot = max(replays, quarters)     # after this replay: replays >= R and 0.25 s x replays >= seconds
        want = ref_climb(x0, 1)[0]
        for k in range(1, hot + 3):
            flag[0] = 1
            g()
            state = g._exe.state
            assert state == ("numpy" if k < hot else "compiling" if k == hot else "jax"), (k, hot, state)
            np.testing.assert_allclose(y, k * want, rtol=1e-13)
    finally:
        tiered.time = real


def test_a_compile_failure_keeps_the_graph_on_numpy_with_one_warning(monkeypatch):
    def broken(self):
        raise RuntimeError("injected XLA failure")
    monkeypatch.setattr(JaxExecutable, "compile", broken)
    x0, flag, y, keep = np.array([0.5, 1.0, 2.0]), cell(1), np.zeros(3), np.zeros(3)
    g = auto_graph(climb, x0, flag, y, keep, seconds=0, replays=1, background=True, trial=0)
    want, _ = ref_climb(x0, 1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(1, 6):
            flag[0] = 1
            g()
            wait_for_compiles()
            np.testing.assert_allclose(g.result["x"], want, rtol=1e-13)
            np.testing.assert_allclose(y, k * want, rtol=1e-13)       # no replay lost, none doubled
    mine = [w for w in seen if "backend='auto'" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in seen]
    msg = str(mine[0].message)
    for part in ("(x, flag, y, keep)", "staged at climb", "stays on the NumPy backend", "injected XLA failure",
                 "backend='numpy'"):
        assert part in msg, msg
    assert g._exe.state == "numpy" and g._exe.settled and repr(g).endswith("auto/cpu>")


def test_the_faster_backend_is_kept_after_the_trial(monkeypatch):
    slow = JaxExecutable.replay

    def slow_replay(self, times=1):
        time.sleep(0.01)
        return slow(self, times)
    monkeypatch.setattr(JaxExecutable, "replay", slow_replay)
    x0, flag, y, keep = np.array([0.5, 1.0, 2.0]), cell(1), np.zeros(3), np.zeros(3)
    g = auto_graph(climb, x0, flag, y, keep, seconds=0, replays=2, background=False, trial=3)
    want, _ = ref_climb(x0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # settling on the faster one warns nothing
        for k in range(1, 10):
            flag[0] = 1
            g()
            np.testing.assert_allclose(g.result["x"], want, rtol=1e-13)
            np.testing.assert_allclose(y, k * want, rtol=1e-13)
    exe = g._exe
    assert exe.settled and exe.state == "numpy" and exe.reason == "NumPy replays were faster"
    assert len(exe._jax_costs) == 4                    # it did run on XLA for the trial


@eagle_fx.Graph.builder
def counter(x, y, flag):
    g = eagle_fx.Graph()
    for _ in range(5):
        if not flag:
            break
        bump(x, y)                          # y += x, 5 turns: flag stays set (the guard never clears)
    return g


def test_replays_from_many_threads_never_see_half_a_swap():
    x, y, flag = np.array([1.0, 2.0, 3.0]), np.zeros(3), cell(1)
    g = auto_graph(counter, x, y, flag, seconds=0, replays=3, background=True, trial=0)
    exe = g._exe
    counts, errors = [0] * 4, []

    def hammer(k):
        try:
            extra, stop = 30, time.monotonic() + 60
            while extra and time.monotonic() < stop:    # until the swap happened under the others' replays, and on
                g.launch()
                counts[k] += 1
                if exe.state == "jax":
                    extra -= 1
        except BaseException as e:          # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert exe.state == "jax" and exe._replays >= 3
    total = sum(counts)
    np.testing.assert_array_equal(y, 5 * total * x)     # every replay whole, on one backend or the other


@eagle_fx.Graph.builder
def bump_twice(x, y):
    g = eagle_fx.Graph()
    bump(x, y)                          # y += x, twice: a write through y is seen through x on NumPy
    bump(x, y)
    g.result = y
    return g


def test_arguments_that_alias_keep_numpys_meaning_before_and_after_the_swap():
    A = np.arange(1.0, 6.0)
    ref = A.copy()
    for _ in range(2):                  # what the NumPy backend computes, in place
        ref[:-1] += ref[1:].copy()
    g = auto_graph(bump_twice, A[1:], A[:-1])        # aliased from the start: XLA would not see the write
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        g()
        g()                                          # the swap is refused: one warning, NumPy's values
    np.testing.assert_allclose(A[:-1], _twice(_twice(np.arange(1.0, 6.0)))[:-1])
    assert g._exe.state == "numpy" and len([w for w in seen if "backend='auto'" in str(w.message)]) == 1
    assert "shares memory" in g._exe.reason

    x, y = np.arange(1.0, 5.0), np.zeros(4)
    h = auto_graph(bump_twice, x, y)
    h()
    h()                                              # on XLA now
    assert h._exe.state == "jax"
    B = np.arange(1.0, 6.0)
    h.bind(x=B[1:], y=B[:-1])                        # aliased by a bind: back to NumPy, for good
    h()
    np.testing.assert_allclose(B, ref)
    assert h._exe.state == "numpy" and h._exe.reason.startswith("bind:")
    np.testing.assert_allclose(y, 4 * x)


def _twice(a):
    a = a.copy()
    for _ in range(2):
        a[:-1] += a[1:].copy()
    return a


def test_tier_policy_refuses_unknown_settings():
    with pytest.raises(TypeError, match="unknown setting.*secs.*seconds, replays, background, trial"):
        tier_policy(secs=1)


def test_graphs_with_host_nodes_and_records_stay_on_numpy():
    @eagle_fx.Graph.builder
    def hosted(x, y):
        g = eagle_fx.Graph()
        bump(x, y)
        g.add_node(eagle_fx.opaque(lambda: np.multiply(y, 2.0, out=y), reads={"y": y}, writes={"y": y}))
        return g
    x, y = np.ones(2), np.zeros(2)
    g = auto_graph(hosted, x, y)
    for _ in range(3):
        g()
    assert g._exe.state == "numpy" and g._exe.reason == "the graph has host nodes"
    np.testing.assert_array_equal(y, [14.0, 14.0])          # ((0 + 1) * 2 + 1) * 2 + 1) * 2

    @eagle_fx.Graph.builder
    def recorded(x):
        g = eagle_fx.Graph(record=True)
        g.result = square(affine(x, 2.0, 1.0))
        return g
    r = auto_graph(recorded, np.array([0.5, -1.0]))
    r()
    assert repr(r).endswith("cpu>")                     # a record's forward runs on NumPy
    grads = eagle_fx.diff.reverse(r.record, {"result": np.ones(2)}, wrt="x")["x"]
    np.testing.assert_allclose(grads, 2 * (2.0 * np.array([0.5, -1.0]) + 1.0) * 2.0, rtol=1e-13)


def test_without_jax_it_stays_on_numpy_silently(monkeypatch):
    monkeypatch.setattr(tiered, "_JAX", False)
    x0, flag, y, keep = np.array([0.5, 1.0]), cell(1), np.zeros(2), np.zeros(2)
    g = auto_graph(climb, x0, flag, y, keep)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            flag[0] = 1
            g()
    assert g._exe.state == "numpy" and g._exe.reason == "jax is not installed"
    np.testing.assert_allclose(y, 3 * ref_climb(x0, 1)[0], rtol=1e-13)


def test_seeded_sweep_auto_matches_numpy_across_the_swap_and_binds():
    rng = np.random.default_rng(7)
    for n in (1, 3, 8, 17):
        x0 = rng.uniform(-1.0, 2.0, n)
        flag, y, keep = cell(1), np.zeros(n), np.zeros(n)
        g = auto_graph(climb, x0, flag, y, keep)
        acc = np.zeros(n)
        for turn in range(4):
            if turn == 2:
                x0 = rng.uniform(-1.0, 2.0, n)
                g.bind(x=x0)
            flag[0] = rng.integers(0, 2)
            want, wflag = ref_climb(x0, int(flag[0]))
            res = g()
            acc += want
            np.testing.assert_allclose(res["x"], want, rtol=1e-13)
            np.testing.assert_allclose(y, acc, rtol=1e-12)
            np.testing.assert_allclose(keep, np.sin(want) * np.exp(-0.1 * want * want), rtol=1e-12, atol=1e-15)
            assert int(flag[0]) == wflag
        assert g._exe.state == "jax"


def test_gradients_under_auto_tier_and_match_jax():
    import jax.numpy as jnp
    from jax import lax
    from tour_kernels import loss

    def jloss(x, flag, n):
        x = lax.cond(flag != 0, lambda v: jnp.sin(v) * v, lambda v: v, x)
        x = lax.fori_loop(0, n, lambda i, v: 1.1 * v + 0.1 * jnp.tanh(v), x)
        return jnp.sum(x * x)
    x = np.linspace(-1.0, 1.0, 5)
    want = np.asarray(jax.grad(jloss)(jnp.asarray(x), 1, 3))
    f = eagle_fx.grad(loss)
    with use_backend("auto"), tier_policy(**SWAP_AT_SECOND):
        got = [np.array(f(x, cell(1), cell(3))) for _ in range(3)]
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-12)


# -- the backend-agreement tests, run with the swap forced at each graph's second replay --------------

AGREEMENT_MODULES = ["test_graph_running", "test_graph_control", "test_semantics", "test_aliasing", "test_functional_api",
                     "test_vmap", "test_compose", "test_staged_views", "test_pytrees"]
FAST = {"test_graph_running"}             # in the default run; the others with -m slow
BACKEND_SPECIFIC = {                      # what they check is one backend's own name or mechanics
    "test_repr_counts_nodes_and_stages": "checks repr's backend name",
    "test_a_block_extends_a_hand_made_graph_after_a_host_node": "checks repr's backend name",
    "test_grad_graph_replays_to_the_same_numbers": "two replays bit for bit: the swap between them moves ulps",
}


def _agreement_cases():
    cases = []
    for modname in AGREEMENT_MODULES:
        mod = importlib.import_module(modname)
        for name, fn in vars(mod).items():
            if not name.startswith("test_") or not callable(fn) or name in BACKEND_SPECIFIC:
                continue
            marks = getattr(fn, "pytestmark", [])
            if any(m.name == "numpy_only" for m in marks):
                continue
            params = [p for p in inspect.signature(fn).parameters if p != "backend"]
            grids = [m for m in marks if m.name == "parametrize"]
            if params and not (len(grids) == 1 and set(params) == set(_names(grids[0]))):
                continue                  # takes fixtures of its module: not run here
            values = [None] if not params else list(grids[0].args[1])
            for k, v in enumerate(values):
                slow = modname not in FAST
                cases.append(pytest.param(modname, name, params, v, id=f"{modname}.{name}[{k}]",
                                          marks=[pytest.mark.slow] if slow else []))
    return cases


def _names(mark):
    names = mark.args[0]
    return [s.strip() for s in names.split(",")] if isinstance(names, str) else list(names)


@pytest.mark.parametrize("modname,name,params,value", _agreement_cases())
def test_backend_agreement_holds_across_the_swap(modname, name, params, value, monkeypatch):
    made = []
    init = tiered.TieredExecutable.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(tiered.TieredExecutable, "__init__", record)
    fn = getattr(importlib.import_module(modname), name)
    kwargs = {}
    if params:
        kwargs = dict(zip(params, value if len(params) > 1 else (value,)))
    if "backend" in inspect.signature(fn).parameters:
        kwargs["backend"] = "auto"
    with use_backend("auto"), tier_policy(**SWAP_AT_SECOND), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*backend='auto'")    # every graph must go to XLA
        fn(**kwargs)
    for exe in made:                      # replayed twice: swapped, or kept on NumPy for a stated reason
        if exe._replays >= 2 and exe.state != "jax":
            assert exe.settled and (exe.reason == "the graph has host nodes" or exe.reason.startswith("bind:")), \
                (exe.state, exe.reason)
