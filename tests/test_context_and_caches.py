"""The one staging context and the one cache registry.

Staging state lives in hawk_fx.context.CONTEXT only: every frame a staging pushes is popped again
when it returns or raises, and another thread never sees it. Every cache registers in
hawk_fx.caches, so eagle_fx.clear_caches() empties all of them; after that, results are NumPy's
again (oracles: NumPy written here)."""
import pathlib
import re
import threading

import numpy as np
import pytest

import eagle_fx
import hawk_fx as hawk
from hawk_fx import Scalar, caches
from hawk_fx.context import CONTEXT, STACKS

ROOT = pathlib.Path(__file__).resolve().parents[1]


@hawk.kernel
def affine(x: Scalar, a: hawk.Param) -> Scalar:
    return a * x + 1.0


@hawk.kernel
def positive_sum(y: Scalar, flag: hawk.Mutable[hawk.UInt32]):
    flag = hawk.math.uint32(hawk.sum(y) > 0)


@eagle_fx.Graph.builder
def model(x):
    g = eagle_fx.Graph()
    y = affine(np.sin(x), 2.0)
    flag = np.zeros(1, np.uint32)
    for _ in range(3):
        positive_sum(y, flag)
        if flag:                  # a staged cond on a cell
            y = affine(y, 0.5)
    g.result = y * 2.0
    return g


@eagle_fx.Graph.builder
def simple(x):
    g = eagle_fx.Graph()
    g.result = affine(np.sin(x), 2.0) * 2.0
    return g


def numpy_model(x):
    y = 2.0 * np.sin(x) + 1.0
    for _ in range(3):
        if y.sum() > 0:
            y = 0.5 * y + 1.0
    return y * 2.0


def empty_context():
    return {k: list(getattr(CONTEXT, k)) for k in STACKS if getattr(CONTEXT, k)}


def test_every_frame_is_popped_after_staging_transforms_and_failures():
    x = np.linspace(-1, 1, 7)
    np.testing.assert_allclose(model(x)(), numpy_model(x))
    eagle_fx.jvp                                            # made, not called: nothing pushed
    _, tangent = eagle_fx.jvp(model, (x,), (np.ones_like(x),))
    np.testing.assert_allclose(tangent, (numpy_model(x + 1e-6) - numpy_model(x - 1e-6)) / 2e-6, rtol=1e-6)
    np.testing.assert_allclose(eagle_fx.vmap(simple)(np.stack([x, -x]))(), (2.0 * np.sin([x, -x]) + 1.0) * 2.0)
    with eagle_fx.disable_staging():
        model(x)()
    assert empty_context() == {}

    @eagle_fx.Graph.builder
    def broken(x):
        g = eagle_fx.Graph()
        g.result = affine(x, 1.0) + np.ones(3)                 # shapes (7,) and (3,): refused while staging
        return g

    with pytest.raises(ValueError):
        broken(x)
    with pytest.raises(ValueError):
        eagle_fx.jacfwd(broken)(x)
    assert empty_context() == {}


def test_another_thread_sees_none_of_this_threads_frames():
    seen = []

    def other():
        seen.append(empty_context())

    with CONTEXT.enter(builder_sources="outer", backends="numpy"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert CONTEXT.innermost("backends") == "numpy"
    assert seen == [{}]
    assert CONTEXT.innermost("backends") is None


def test_enter_pops_what_it_pushed_even_when_the_body_leaves_frames():
    with pytest.raises(RuntimeError):
        with CONTEXT.enter(graph_stagers="a", eager_runs="b"):
            CONTEXT.graph_stagers.append("leaked by a failing body")
            raise RuntimeError
    assert empty_context() == {}


def test_no_module_keeps_per_thread_state_of_its_own():
    """threading.local appears in the context and, outside staging, in the CUDA runtime's
    per-thread device context and a compiled NumPy body's per-thread buffers (its generated code
    reads them on every call); module-level dicts used as caches are LRUs of the registry."""
    found = []
    for path in list((ROOT / "eagle_fx").rglob("*.py")) + list((ROOT / "hawk_fx").rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        if "threading.local" in text and rel not in ("hawk_fx/context.py", "hawk_fx/cuda_runtime.py",
                                                            "hawk_fx/emit/numpy.py"):
            found.append(rel)
        found += [f"{rel}: {m}" for m in re.findall(r"^_\w+\s*(?::[^=\n]*)?=\s*(?:\{\}|dict\(\)|OrderedDict\(\))",
                                                   text, flags=re.M)]
    # registries, not caches: forgetting an entry would lose what the user declared
    registries = {"hawk_fx/tree.py: _REGISTERED: dict = {}",       # user classes registered as tree nodes
                  "hawk_fx/loops.py: _warned: dict = {}"}          # warnings.warn_explicit's once-per-line registry
    assert [f for f in found if f not in registries] == []


def test_clear_caches_empties_every_registered_cache_and_answers_stay_numpys():
    x = np.linspace(-2, 2, 9)
    f = eagle_fx.vmap(simple)
    xs = np.stack([x, 0.5 * x])
    np.testing.assert_allclose(f(xs)(), (2.0 * np.sin(xs) + 1.0) * 2.0)
    jac = eagle_fx.jacfwd(model)(x)
    np.testing.assert_allclose(np.diag(jac), (numpy_model(x + 1e-6) - numpy_model(x - 1e-6)) / 2e-6, rtol=1e-6)
    assert any(len(c) for c in caches.registered())
    eagle_fx.clear_caches()
    assert [c for c in caches.registered() if len(c)] == []
    np.testing.assert_allclose(f(xs)(), (2.0 * np.sin(xs) + 1.0) * 2.0)
    np.testing.assert_allclose(model(x)(), numpy_model(x))


def test_lru_forgets_the_least_recently_used_and_is_registered():
    c = caches.LRU("test", 3)
    for k in "abc":
        c[k] = k.upper()
    assert c.get("a") == "A"          # a is now the most recent
    c["d"] = "D"
    assert "b" not in c and [c.get(k) for k in "acd"] == ["A", "C", "D"]
    assert c in caches.registered()
    caches.clear_all()
    assert len(c) == 0


def test_lru_from_many_threads_keeps_its_bound():
    c = caches.LRU("hammered", 16)
    errors = []

    def work(w):
        try:
            for i in range(2000):
                c[(w, i % 40)] = i
                c.get((w, (i * 7) % 40))
                c.pop_if((w, i % 40), i)
        except Exception as exc:      # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == [] and len(c) <= 16
