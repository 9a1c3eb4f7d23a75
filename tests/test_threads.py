"""Kernels, graphs and staging from several threads at once. Every thread owns its kernel scratch
and its staging stacks, so concurrent calls, replays and builds each get NumPy's answer.
The references are plain NumPy, computed per call."""
import sys
import threading

import numpy as np

import eagle_fx
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar

N = 200_000


@hawk.kernel
def poly(x: Scalar, a: Param) -> Scalar:
    t = x * x + a            # intermediates live in scratch: shared scratch would mix the calls
    u = t * x - a
    return u * 0.5 + t


def ref_poly(x, a):
    t = x * x + a
    return (t * x - a) * 0.5 + t


@hawk.kernel
def smooth_into(s: Scalar, y: Mutable[Scalar]):
    y = 0.5 * s + 0.5 * y


def hammer(workers, rounds, job):
    """Run job(worker, round) from `workers` threads at once; the failures, as strings."""
    errors = []
    start = threading.Barrier(workers)

    def run(w):
        start.wait()
        for r in range(rounds):
            try:
                msg = job(w, r)
            except Exception as exc:          # noqa: BLE001 - reported to the test
                msg = f"{type(exc).__name__}: {exc}"
            if msg:
                errors.append(msg)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_calling_one_kernel_eagerly():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(N) for _ in range(4)]

    def job(w, r):
        x, a = xs[w], float(w + r)
        got = poly(x, a)
        if not np.allclose(got, ref_poly(x, a), rtol=1e-12, atol=0):
            return f"thread {w} round {r}: wrong values"
    assert hammer(4, 20, job) == []


def test_threads_with_different_param_arrays_and_small_n():
    """Small n runs inline (no chunk workers); one-cell Params are hoisted, per call."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(1000) for _ in range(4)]

    def job(w, r):
        x, a = xs[w], np.array([float(w * 100 + r)])
        got = poly(x, a)
        if not np.allclose(got, ref_poly(x, a[0]), rtol=1e-12, atol=0):
            return f"thread {w} round {r}: wrong values"
    assert hammer(4, 200, job) == []


@eagle_fx.Graph.builder
def twice_poly(x, a):
    g = eagle_fx.Graph()
    g.result = poly(poly(x, a), a)
    return g


@eagle_fx.Graph.builder
def once_poly(x, a):
    g = eagle_fx.Graph()
    g.result = poly(x, a)
    return g


def test_an_eager_call_while_an_enqueued_replay_runs_the_same_kernel():
    rng = np.random.default_rng(2)
    x, a = rng.standard_normal(N), np.array([0.25])
    g = once_poly(x, a)
    want_g = ref_poly(x, 0.25)
    y = rng.standard_normal(N)
    bad = []
    for r in range(10):
        g.enqueue(4)
        got = [poly(y, np.array([1.5 + r])) for _ in range(4)]     # the layout the graph calls
        g.synchronize()
        if not all(np.allclose(q, ref_poly(y, 1.5 + r), rtol=1e-12, atol=0) for q in got):
            bad.append(f"round {r}: the eager call")
        if not np.allclose(g.result, want_g, rtol=1e-12, atol=0):
            bad.append(f"round {r}: the replay")
    assert bad == []


def test_replays_of_two_graphs_and_eager_calls_at_once():
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(N) for _ in range(3)]
    graphs = [once_poly(xs[w], np.array([0.5 * w])) for w in range(2)]
    wants = [ref_poly(xs[w], 0.5 * w) for w in range(2)]

    def job(w, r):
        if w < 2:
            res = graphs[w]()
            return None if np.allclose(res, wants[w], rtol=1e-12, atol=0) else f"graph {w} round {r}"
        got = poly(xs[2], np.array([3.0]))
        return None if np.allclose(got, ref_poly(xs[2], 3.0), rtol=1e-12, atol=0) else f"eager round {r}"
    assert hammer(3, 8, job) == []


def test_an_eager_call_while_another_thread_builds_a_graph():
    """A thread staging a builder must not capture another thread's kernel calls."""
    x = np.linspace(-1.0, 1.0, 5000)
    inside = threading.Event()
    go_on = threading.Event()
    built = {}

    @eagle_fx.Graph.builder
    def slow(x):
        g = eagle_fx.Graph()
        y = poly(x, 1.0)
        inside.set()            # the builder is staging now; the other thread calls eagerly
        go_on.wait(10)
        g.result = poly(y, 1.0)
        return g

    def build():
        built["g"] = slow(x)

    t = threading.Thread(target=build)
    t.start()
    assert inside.wait(10)
    try:
        got = poly(x, 2.0)
    finally:
        go_on.set()
        t.join()
    assert type(got) is np.ndarray
    np.testing.assert_allclose(got, ref_poly(x, 2.0), rtol=1e-12)
    np.testing.assert_allclose(built["g"](), ref_poly(ref_poly(x, 1.0), 1.0), rtol=1e-12)


def test_threads_building_graphs_and_calling_kernels():
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(3000) for _ in range(4)]

    def job(w, r):
        x = xs[w]
        if w % 2:
            res = twice_poly(x, np.array([0.1 * r]))()
            want = ref_poly(ref_poly(x, 0.1 * r), 0.1 * r)
        else:
            res = poly(x, 0.1 * r)
            want = ref_poly(x, 0.1 * r)
        if type(res) is not np.ndarray or not np.allclose(res, want, rtol=1e-12, atol=0):
            return f"thread {w} round {r}: got {type(res).__name__}"
    assert hammer(4, 10, job) == []


def test_threads_calling_a_kernel_with_a_mutable():
    rng = np.random.default_rng(5)
    ss = [rng.standard_normal(N) for _ in range(3)]

    def job(w, r):
        y = np.full(N, float(r))
        want = 0.5 * ss[w] + 0.5 * y
        smooth_into(ss[w], y)
        return None if np.allclose(y, want, rtol=1e-12, atol=0) else f"thread {w} round {r}"
    assert hammer(3, 10, job) == []


def test_threads_using_transforms():
    """vmap stages a function per call: its staging state belongs to the calling thread."""
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((3, 400)) for _ in range(3)]

    @eagle_fx.Graph.builder
    def one(x):
        g = eagle_fx.Graph()
        g.result = poly(x, 0.5)
        return g
    batched = eagle_fx.vmap(one)

    def job(w, r):
        got = batched(xs[w])()          # vmap of a builder builds the batched graph
        return None if np.allclose(got, ref_poly(xs[w], 0.5), rtol=1e-12, atol=0) else f"thread {w} round {r}"
    assert hammer(3, 6, job) == []


def test_scratch_kept_for_a_few_chunk_lengths_per_thread():
    """Calls at 200 sizes around the chunk length keep scratch for a few lengths, not one per size."""
    import hawk_fx.emit.numpy as emit
    x = np.linspace(0.0, 1.0, emit.CHUNK + 200)
    for n in range(emit.CHUNK - 100, emit.CHUNK + 100):
        np.testing.assert_allclose(poly(x[:n], 0.5), ref_poly(x[:n], 0.5), rtol=1e-12)
    for spec in poly._specs.values():
        assert len(spec.compiled._local.sets) <= emit.SCRATCH_SIZES


def test_threads_calling_one_transformed_function_with_a_cached_graph():
    """grad(f) keeps one staged graph per layout; concurrent calls must not share it mid-call."""
    from tour_kernels import cell, loss

    def numpy_loss(x, n=3):
        x = np.sin(x) * x
        for _ in range(n):
            x = 1.1 * x + 0.1 * np.tanh(x)
        return np.sum(x * x)

    def fd_grad(x, eps=1e-6):
        return np.array([(numpy_loss(x + e) - numpy_loss(x - e)) / (2 * eps) for e in np.eye(x.size) * eps])

    xs = [np.linspace(-1.0, 1.0, 7) * (w + 1) * 0.5 for w in range(4)]
    wants = [fd_grad(x) for x in xs]
    f = eagle_fx.grad(loss)

    def job(w, r):
        got = f(xs[w], cell(1), cell(3))
        return None if np.allclose(got, wants[w], rtol=1e-6, atol=1e-8) else f"thread {w} round {r}"
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)          # switch threads often: tiny calls otherwise run whole
    try:
        assert hammer(4, 30, job) == []
    finally:
        sys.setswitchinterval(interval)
