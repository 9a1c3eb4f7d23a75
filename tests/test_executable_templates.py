"""A cached builder or vmap call makes its executable from a template of the first call's lowering:
it allocates buffers of its own and binds them, and plans and generates nothing. Graphs from cached
calls, alive at once and replayed in interleaved order with different inputs, must each equal a
fresh build and NumPy written here, and write their Mutable arguments in their own caller's arrays."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import eagle_fx as ef
from eagle_fx.api import sig
from eagle_fx.backends.templates import _COPY, template_of
from eagle_fx.frontend import builder_cache
from tour_kernels import accumulate, below, dbl, inc, total

KERNELS = {"dbl": (dbl, lambda x: 2.0 * x), "inc": (inc, lambda x: x + 1.0)}
CAP, LIM = 6, 40.0


def _builder(names, looped):
    """names[0] inside a capped device loop (while some sample is below LIM) when `looped`, the
    rest after it; acc = x + 1 written in place; result sum(x * x)."""
    @ef.Graph.builder
    def chain(x, flag, acc):
        g = ef.Graph()
        rest = names
        if looped:
            step = KERNELS[names[0]][0]
            for _ in range(CAP):
                if not flag:
                    break
                x = step(x)
                below(x, LIM, flag)
            rest = names[1:]
        for name in rest:
            x = KERNELS[name][0](x)
        accumulate(x, acc)
        g.result = total(x)
        return g
    return chain


def _oracle(names, looped, x, flag):
    """(sum(x * x), x + 1, the flag after the loop), in plain NumPy."""
    x, flag = x.copy(), flag.copy()
    rest = names
    if looped:
        for _ in range(CAP):
            if not flag[0]:
                break
            x = KERNELS[names[0]][1](x)
            flag[0] = np.sum(x < LIM)
        rest = names[1:]
    for name in rest:
        x = KERNELS[name][1](x)
    return np.sum(x * x), x + 1.0, flag


def _fresh(chain, *args):
    builder_cache.ENABLED = False
    try:
        return chain(*args)
    finally:
        builder_cache.ENABLED = True


def _own(g):
    callers = {id(e.array) for e in g.trace.input_planes}
    return [s for s in g._exe.slots if isinstance(s, np.ndarray) and s.size and id(s) not in callers]


def _shares(a, b):
    return any(np.shares_memory(u, v) for u in _own(a) for v in _own(b))


def _args(rng, n):
    return rng.normal(size=n) * 3.0, np.array([1], np.uint32), rng.normal(size=n)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(st.sampled_from(sorted(KERNELS)), min_size=1, max_size=5), looped=st.booleans(),
       n=st.integers(1, 12), order=st.permutations(range(3)), seed=st.integers(0, 2 ** 16))
def test_property_graphs_of_cached_calls_alive_at_once_replay_interleaved(names, looped, n, order, seed):
    rng = np.random.default_rng(seed)
    chain = _builder(names, looped)
    args = [_args(rng, n) for _ in range(3)]
    graphs = [chain(*a) for a in args]               # the first stages; the others copy its template
    assert chain.cache_info()[:2] == (2, 1)
    assert all(e.template is not None for e in ef.frontend.cache.cache_for(chain).entries.values())
    assert all(g._exe.plan is graphs[0]._exe.plan and g._exe._code is graphs[0]._exe._code for g in graphs)
    assert not any(_shares(g, h) for i, g in enumerate(graphs) for h in graphs[i + 1:])
    for turn in range(2):
        for k in order:                              # interleaved: each replay on its own arrays
            x, flag, acc = args[k]
            want, want_acc, want_flag = _oracle(names, looped, x, flag)
            fresh = _fresh(chain, x.copy(), flag.copy(), acc.copy())
            got = graphs[k]()
            np.testing.assert_allclose(got, want, rtol=1e-12)
            np.testing.assert_array_equal(got, fresh())
            np.testing.assert_allclose(acc, want_acc, rtol=1e-12)      # the Mutable lands in this caller's array
            np.testing.assert_array_equal(flag, want_flag)
            if turn == 0:                            # new inputs for the next round, bound in place
                x[:] = rng.normal(size=n) * 3.0
                flag[0] = 1


def test_a_graph_of_a_template_binds_new_arrays_without_touching_the_others():
    chain = _builder(["dbl", "inc"], True)
    rng = np.random.default_rng(3)
    a1, a2 = _args(rng, 5), _args(rng, 5)
    chain(*a1)
    g1, g2 = chain(*a1), chain(*a2)
    x3, f3, acc3 = _args(rng, 5)
    g1.bind(x=x3, flag=f3, acc=acc3)
    before = [a.copy() for a in a1]
    np.testing.assert_allclose(g1(), _oracle(["dbl", "inc"], True, x3, np.array([1], np.uint32))[0], rtol=1e-12)
    np.testing.assert_allclose(g2(), _oracle(["dbl", "inc"], True, a2[0], np.array([1], np.uint32))[0], rtol=1e-12)
    for a, b in zip(a1, before):                      # the arrays g1 was made on: no longer written
        np.testing.assert_array_equal(a, b)


def _vmap_oracle(names, xb):
    want = []
    for x in xb:
        y = x
        for name in names:
            y = KERNELS[name][1](y)
        want.append(np.sum(y * y))
    return np.array(want)


@pytest.mark.parametrize("names", [["dbl"], ["inc", "dbl", "inc"]])
def test_vmap_graphs_from_one_template_alive_at_once(names):
    @ef.Graph.builder
    def chain(x):
        g = ef.Graph()
        for name in names:
            x = KERNELS[name][0](x)
        g.result = total(x)
        return g
    vm = ef.vmap(chain)
    rng = np.random.default_rng(11)
    xbs = [rng.normal(size=(3, 6)) for _ in range(3)]
    graphs = [vm(xb) for xb in xbs]
    assert vm.cache_info().hits == 2
    assert not any(_shares(g, h) for i, g in enumerate(graphs) for h in graphs[i + 1:])
    for k in (2, 0, 1, 0):
        np.testing.assert_allclose(np.asarray(graphs[k]()).ravel(), _vmap_oracle(names, xbs[k]), rtol=1e-12)
    xbs[1][:] = rng.normal(size=(3, 6))               # graphs read their caller's arrays at each replay
    np.testing.assert_allclose(np.asarray(graphs[1]()).ravel(), _vmap_oracle(names, xbs[1]), rtol=1e-12)


def test_a_vmapped_device_loop_keeps_its_per_instance_state_per_graph():
    """A masked loop's initial buffers (the live mask: ones) are copied from the template, not zeroed."""
    @ef.Graph.builder
    def looped(x, flag):
        g = ef.Graph()
        for _ in range(CAP):
            if not flag:
                break
            x = dbl(x)
            below(x, LIM, flag)
        g.result = total(x)
        return g
    vm = ef.vmap(looped)
    rng = np.random.default_rng(5)
    calls = [(rng.normal(size=(4, 3)) * 10.0 ** rng.integers(-1, 2, size=(4, 1)), np.ones((4, 1), np.uint32))
             for _ in range(3)]
    graphs = [vm(*c) for c in calls]
    assert vm.cache_info().hits == 2
    (entry,) = ef.frontend.cache.cache_for(vm._sig).entries.values()
    assert any(kind == _COPY for kind, _ in entry.template.recipe)     # a buffer copied: the live mask (ones)
    for k in (1, 2, 0):
        xb, fb = calls[k]
        want = [_oracle(["dbl"], True, x, f)[0] for x, f in zip(xb, np.ones((4, 1), np.uint32))]
        np.testing.assert_allclose(np.asarray(graphs[k]()).ravel(), want, rtol=1e-12)


def test_what_gives_no_template():
    """Only a NumPy executable is copied; one of another kind gives no template (its calls lower)."""
    chain = _builder(["inc"], False)
    g = _fresh(chain, *_args(np.random.default_rng(0), 4))
    assert template_of(g._exe) is not None
    assert template_of(object()) is None


# -- the transforms' hit path (cache.replay_hit): a replay on copies, Mutables written back -----------

@ef.Graph.builder
def _acc_chain(x, acc):
    g = ef.Graph()
    y = dbl(inc(x))
    accumulate(y, acc)                            # acc = 2 (x + 1) + 1, in place
    g.result = total(y)
    return g


@ef.Graph.builder
def _sq_chain(x):
    g = ef.Graph()
    g.result = total(dbl(inc(x)))
    return g


def test_seeded_sweep_of_hits_writes_mutables_back_and_matches_numpy():
    rng = np.random.default_rng(21)
    f = ef.vmap(lambda x, acc: _acc_chain(x, acc))
    dj = ef.grad(_acc_chain)
    for _ in range(6):
        B, n = int(rng.integers(1, 4)), int(rng.integers(1, 9))
        for _ in range(3):                        # the first call of a layout stages, the others hit
            x, acc = rng.normal(size=(B, n)), rng.normal(size=(B, n))
            y = 2.0 * (x + 1.0)
            np.testing.assert_allclose(np.ravel(f(x, acc)), np.sum(y * y, axis=-1), rtol=1e-12)
            np.testing.assert_allclose(acc, y + 1.0, rtol=1e-12)
            x1, a1 = x[0].copy(), acc[0].copy()
            np.testing.assert_allclose(dj(x1, a1), 2.0 * 2.0 * 2.0 * (x1 + 1.0), rtol=1e-12)
            np.testing.assert_array_equal(a1, acc[0])     # a derivative's graph writes no argument
            t = rng.normal(size=n)
            val, tan = ef.jvp(_sq_chain, (x1,), (t,))
            np.testing.assert_allclose(np.ravel(val), np.sum((2.0 * (x1 + 1.0)) ** 2), rtol=1e-12)
            np.testing.assert_allclose(np.ravel(tan), np.sum(8.0 * (x1 + 1.0) * t), rtol=1e-12)
    assert f.cache_info().hits >= 12 and dj.cache_info().hits >= 12
    assert ef.frontend.cache.cache_for(sig("jvp", _sq_chain)).hits >= 12


def test_a_hit_refuses_a_read_only_array_it_would_write_and_writes_nothing():
    f = ef.vmap(lambda x, acc: _acc_chain(x, acc))
    x, acc = np.ones((2, 3)), np.zeros((2, 3))
    f(x, acc)
    f(x, acc)
    frozen = np.full((2, 3), 7.0)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        f(x, frozen)
    np.testing.assert_array_equal(frozen, 7.0)
