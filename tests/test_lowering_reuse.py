"""A builder called again lowers its kept Program once: the graphs of later calls share its fused
plan and replay code, and nothing else. Each graph is checked against NumPy written here, and no
buffer of one graph may be a buffer of another."""
import gc

import numpy as np

import eagle_fx as ef
from eagle_fx.backends import fusion
from tour_kernels import accumulate, dbl, inc

KERNELS = {"dbl": (dbl, lambda x: 2.0 * x), "inc": (inc, lambda x: x + 1.0)}


def _builder(names):
    @ef.Graph.builder
    def chain(x, acc):
        g = ef.Graph()
        for name in names:
            x = KERNELS[name][0](x)
        accumulate(x, acc)                      # acc = x + 1, written in the caller's array
        g.result = x
        return g
    return chain


def _oracle(names, x):
    for name in names:
        x = KERNELS[name][1](x)
    return x


def _own_buffers(g):
    """The graph's buffers that are not its caller's arrays."""
    callers = {id(e.array) for e in g.trace.input_planes}
    return [s for s in g._exe.slots if isinstance(s, np.ndarray) and s.size and id(s) not in callers]


def _shares(a, b):
    return any(np.shares_memory(u, v) for u in _own_buffers(a) for v in _own_buffers(b))


def test_a_cached_call_reuses_the_plan_and_code_and_owns_its_buffers():
    ef.clear_caches()
    names = ["dbl", "inc", "dbl", "inc"]
    chain = _builder(names)
    x1, a1 = np.linspace(-1.0, 1.0, 8), np.zeros(8)
    x2, a2 = np.linspace(2.0, 3.0, 8), np.ones(8)
    g1, g2 = chain(x1, a1), chain(x2, a2)
    assert chain.cache_info()[:2] == (1, 1)
    assert g2._exe.plan is g1._exe.plan and g2._exe._code is g1._exe._code
    assert not _shares(g1, g2)
    g2(), g1()
    np.testing.assert_array_equal(np.asarray(g1.result), _oracle(names, x1))
    np.testing.assert_array_equal(np.asarray(g2.result), _oracle(names, x2))
    np.testing.assert_array_equal(a1, _oracle(names, x1) + 1.0)
    np.testing.assert_array_equal(a2, _oracle(names, x2) + 1.0)


def test_seeded_sweep_of_chains_and_graphs_alive_at_once():
    rng = np.random.default_rng(7)
    for _ in range(12):
        names = list(rng.choice(list(KERNELS), size=int(rng.integers(1, 7))))
        chain = _builder(names)
        n = int(rng.integers(1, 40))
        xs = [rng.normal(size=n) for _ in range(3)]
        accs = [rng.normal(size=n) for _ in range(3)]
        want_acc = [_oracle(names, x) + 1.0 for x in xs]
        graphs = [chain(x, a) for x, a in zip(xs, accs)]
        assert chain.cache_info()[:2] == (2, 1)
        for i, g in enumerate(graphs):
            assert not any(_shares(g, h) for h in graphs[i + 1:])
        for k in rng.permutation(3):
            graphs[k]()
        for g, x, a, w in zip(graphs, xs, accs, want_acc):
            np.testing.assert_allclose(np.asarray(g.result), _oracle(names, x), rtol=1e-15)
            np.testing.assert_allclose(a, w, rtol=1e-15)
        x, a = rng.normal(size=n), np.zeros(n)     # bind: new arrays, the same graph
        graphs[0].bind(x=x, acc=a)
        graphs[0]()
        np.testing.assert_allclose(np.asarray(graphs[0].result), _oracle(names, x), rtol=1e-15)
        np.testing.assert_allclose(a, _oracle(names, x) + 1.0, rtol=1e-15)


def test_the_plan_memo_lives_as_long_as_its_program_and_clear_caches_forgets_it():
    ef.clear_caches()
    chain = _builder(["dbl", "inc"])
    chain(np.zeros(4), np.zeros(4))
    assert len(fusion._BY_PROGRAM) >= 1
    ef.clear_caches()
    assert len(fusion._BY_PROGRAM) == 0
    chain(np.zeros(4), np.zeros(4))
    before = len(fusion._BY_PROGRAM)
    chain.clear_cache()
    del chain
    gc.collect()
    assert len(fusion._BY_PROGRAM) < before


def test_a_fresh_build_fuses_anew_and_still_reuses_fused_bodies_by_wiring():
    """With the builder cache off each build stages a new Program: its plan is fused again (no
    per-Program hit), and the memo of fused bodies by wiring still gives the same body."""
    from eagle_fx.frontend import builder_cache
    from eagle_fx import ir
    chain = _builder(["dbl", "inc", "dbl"])
    x = np.linspace(-1.0, 1.0, 5)
    builder_cache.ENABLED = False
    try:
        g1, g2 = chain(x, np.zeros(5)), chain(x, np.zeros(5))
    finally:
        builder_cache.ENABLED = True
    assert g1._program is not g2._program and g1._exe.plan is not g2._exe.plan
    calls = [[e for e in g._exe.plan.eqns if e.prim is ir.call_p] for g in (g1, g2)]
    assert calls[0][0].params["spec"] is calls[1][0].params["spec"]
    g1(), g2()
    np.testing.assert_array_equal(np.asarray(g2.result), _oracle(["dbl", "inc", "dbl"], x))
