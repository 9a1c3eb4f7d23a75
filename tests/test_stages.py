"""The stages of a graph, as in JAX's jit(f).lower(x).compile(): a closed Program (Traced), lowered
for one backend of the registry (Lowered: its executable and its text), compiled to a Graph (the
handle). Every registered backend is reached through the one lowering; a capability a backend
lacks is refused by the registry, naming the API and what to change; a transform's result is a
Graph made by the public constructor."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.backends import registry, select
from eagle_fx.ir.closed import Closed
from eagle_fx.graph import Graph, Lowered
from hawk_fx import Scalar

import eagle_fx.testing  # noqa: F401  (registers 'fake-cuda')


@hawk.kernel
def affine(x: Scalar, a: hawk.Param, b: hawk.Param) -> Scalar:
    return a * x + b


@hawk.kernel
def square(v: Scalar) -> Scalar:
    return v * v


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def chain(x):
    g = eagle.Graph()
    g.result = square(affine(x, 2.0, 1.0))
    return g


@eagle.Graph.builder
def chain_recorded(x):
    g = eagle.Graph(record=True)
    g.result = square(affine(x, 2.0, 1.0))
    return g


def oracle(x):
    return (2.0 * x + 1.0) ** 2


X = np.linspace(-1.0, 1.0, 6)


def test_every_registered_backend_is_reached_through_the_one_lowering():
    seen = {}
    for name, entry in registry.BACKENDS.items():
        if name == "cuda":                   # needs a GPU: resolved, not lowered, here
            continue
        g = chain(X.copy())
        low = g.lower(name)
        assert isinstance(low, Lowered) and low.backend is entry
        seen[name] = np.array(low.compile()())
    assert {"numpy", "jax", "fake-cuda"} <= set(seen)
    for name, got in seen.items():
        np.testing.assert_allclose(got, oracle(X), err_msg=name)


def test_lowering_resolves_names_and_runtimes_to_entries():
    from eagle_fx.testing.fake_cuda import FakeRuntime
    rt = FakeRuntime(node_updates="top")
    entry, runtime = select.resolve([X], rt)
    assert entry is registry.BACKENDS["fake-cuda"] and runtime is rt
    with select.use_backend(rt):
        g = chain(X.copy())
    assert g.executable.runtime is rt and repr(g).endswith("fake-cuda>")
    np.testing.assert_allclose(g(), oracle(X))


@pytest.mark.parametrize("backend, kind", [("numpy", "python"), ("jax", "stablehlo")])
def test_graph_lower_as_text_and_compile(backend, kind):
    if backend == "jax":
        pytest.importorskip("jax")
    g = chain(X.copy())
    low = g.lower(backend)
    assert low.text_kind == kind
    text = low.as_text()
    assert text.strip()
    if kind == "python":
        assert "def replay" in text
    else:
        assert "func" in text and "main" in text
    h = low.compile()
    assert isinstance(h, Graph) and h is not g
    np.testing.assert_allclose(np.asarray(h()), np.asarray(g()))
    np.testing.assert_allclose(np.asarray(h()), oracle(X))
    np.testing.assert_allclose(np.asarray(h(3)), oracle(X))     # replays with no re-lowering


def test_lower_without_a_backend_keeps_the_graphs_own():
    g = chain(X.copy())
    low = g.lower()
    assert low.backend.name == "numpy" and low.text_kind == "python"
    np.testing.assert_allclose(low.compile()(), oracle(X))


def test_record_on_fake_cuda_runs_and_matches_the_analytic_gradient():
    with select.use_backend("fake-cuda"):
        g = chain_recorded(X.copy())
    g()
    assert "fake-cuda" in repr(g)
    got = eagle.diff.reverse(g.record, {"result": np.ones_like(X)}, wrt="x")["x"]
    np.testing.assert_allclose(got, 2.0 * (2.0 * X + 1.0) * 2.0)        # d/dx (2x + 1)^2
    assert registry.BACKENDS["fake-cuda"].supports_record and registry.BACKENDS["cuda"].supports_record


def test_the_registry_refuses_record_where_an_entry_lacks_it_naming_the_api_and_the_change():
    registry.register(registry.Backend("no-record", registry.get("numpy").make))
    try:
        with select.use_backend("no-record"), pytest.raises(NotImplementedError) as e:
            chain_recorded(X.copy())
    finally:
        del registry.BACKENDS["no-record"]
    msg = str(e.value)
    assert "eagle.Graph" in msg and "record=True" in msg and "'no-record'" not in msg and "no-record backend" in msg
    assert "NumPy arrays" in msg


def test_the_registry_refuses_what_an_entry_lacks_and_nothing_else():
    registry.refuse(registry.get("numpy"), "supports_record")
    registry.refuse(registry.get("numpy"), "supports_transforms")
    with pytest.raises(NotImplementedError, match="eagle_fx transforms: .* pass NumPy arrays"):
        registry.refuse(registry.get("cuda"), "supports_transforms", name="x", type_name="ndarray")
    with pytest.raises(KeyError, match="no backend 'nope' is registered"):
        registry.get("nope")


def test_a_transforms_result_is_a_graph_made_by_the_public_constructor(monkeypatch):
    made = []
    real = Graph.from_closed.__func__

    def counting(cls, closed, lazy=False, executable=None):
        g = real(cls, closed, lazy, executable)
        made.append((closed, g))
        return g
    monkeypatch.setattr(Graph, "from_closed", classmethod(counting))

    @eagle.Graph.builder
    def loss(x):
        g = eagle.Graph()
        g.result = total(affine(x, 2.0, 1.0))
        return g
    g = eagle.grad(loss).graph(X.copy())
    assert made and made[-1][1] is g and isinstance(made[-1][0], Closed)
    assert g.closed is made[-1][0]
    np.testing.assert_allclose(g(), 4.0 * (2.0 * X + 1.0))


def test_closed_to_lowered_to_graph():
    g = chain(X.copy())
    c = g.closed
    assert isinstance(c, Closed) and c.transformed
    low = Lowered(c)
    assert low.backend.name == "numpy"
    np.testing.assert_allclose(low.compile()(), oracle(X))
    lazy = Graph.from_closed(c, lazy=True)
    assert not lazy.is_built
    np.testing.assert_allclose(lazy(), oracle(X))
    assert lazy.is_built


def test_lowering_is_the_only_place_executables_are_made():
    """The backends' executables are constructed in registry.py alone, a record=True graph's in
    recording.recorded_executable, which lowering.lower alone calls."""
    import pathlib
    import re
    root = pathlib.Path(eagle.__file__).parent
    pat = re.compile(r"\b(NumpyExecutable|JaxExecutable|CudaExecutable|RecordedExecutable)\(")
    sites = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   for line in p.read_text().splitlines()
                   if pat.search(line) and not line.lstrip().startswith(("#", "class ")))
    assert sites == ["backends/recording.py"] + ["backends/registry.py"] * 3, sites
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     for line in p.read_text().splitlines() if "recorded_executable(" in line and "def " not in line)
    assert callers == ["backends/lowering.py"], callers
