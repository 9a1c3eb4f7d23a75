"""Tables on the CUDA backend, without a GPU: the emitted C compiles with NVRTC, and runs on the host
emulation of tests/test_cuda_emit.py (g++, a thread per CUDA thread) to give the NumPy backend's
values; scatter_add's rewrite into per-row sums gives scatter_add's values; graphs on the fake device
give the NumPy backend's."""
from __future__ import annotations

import re

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from eagle_fx.backends.select import use_backend
from hawk_fx import Int32, Mutable, Scalar, Table, UInt32, Vector
from hawk_fx.emit import cuda
from hawk_fx.emit.cuda_tables import expand_scatter
from hawk_fx.emit.numpy import NumpyKernel
from test_cuda_emit import EMU_N, emu_build, emu_check, emu_dir  # noqa: F401  (emu_dir: a fixture)


@hawk.kernel
def gathers(t: Table, i: Int32, x: Scalar, v: Vector[3]):
    a = hm.take(t, i) + hm.take(t, i, mode="clip") + hm.take(t, i, mode="wrap") + t[i]
    b = v[i] + hm.take(hm.vec(x, 2.0 * x, x * x), i + 1, mode="wrap")       # a computed Vector
    return a * x + b, hm.take(t, i, fill_value=-3.0)


@hawk.kernel
def rows(t: Table, j: UInt32):
    return hm.take(t, j, mode="clip")           # a table of rows (K, 2): each row two components


@hawk.kernel
def hist(h: Mutable[Table], i: Int32, w: Scalar):
    h = hm.scatter_add(h, i, w)


@hawk.kernel
def hist_clip_vec(h: Mutable[Table], i: Int32, w: Scalar):
    h = hm.scatter_add(h, i, hm.vec(w, 1.0), mode="clip")


@hawk.kernel
def count(h: Mutable[Table], i: UInt32):
    h = hm.scatter_add(h, i, 1.0, mode="wrap")        # a number: added once per sample


@hawk.kernel
def per_sample(v: Vector[3], i: Int32, w: Scalar):
    return hm.scatter_add(v, i, w, mode="wrap")


def _spec(kernel, *args):
    return kernel.specialize(kernel.layout_of(list(args))[0])


def _cases(rng, n=EMU_N):
    i = rng.integers(-12, 13, n).astype(np.int32)
    return [
        ("gathers", _spec(gathers, np.ones((5, 1)), i, np.ones(n), np.ones((3, n))),
         [rng.normal(size=(5, 1)), i, rng.normal(size=n), rng.normal(size=(3, n))]),
        ("gathers32", _spec(gathers, np.ones((4, 1), np.float32), i, np.ones(n, np.float32),
                            np.ones((3, n), np.float32)),
         [rng.normal(size=(4, 1)).astype(np.float32), i, rng.normal(size=n).astype(np.float32),
          rng.normal(size=(3, n)).astype(np.float32)]),
        ("rows", _spec(rows, np.ones((6, 2, 1)), np.ones(n, np.uint32)),
         [rng.normal(size=(6, 2, 1)), rng.integers(0, 9, n).astype(np.uint32)]),
        ("hist", _spec(hist, np.ones((4, 1)), i, np.ones(n)),
         [rng.normal(size=(4, 1)), i, rng.normal(size=n)]),
        ("hist_clip_vec", _spec(hist_clip_vec, np.ones((3, 2, 1)), i, np.ones(n)),
         [rng.normal(size=(3, 2, 1)), i, rng.normal(size=n)]),
        ("count32", _spec(count, np.ones((5, 1), np.float32), np.ones(n, np.uint32)),
         [np.zeros((5, 1), np.float32), rng.integers(0, 12, n).astype(np.uint32)]),
        ("per_sample", _spec(per_sample, np.ones((3, n)), i, np.ones(n)),
         [rng.normal(size=(3, n)), i, rng.normal(size=n)]),
    ]


def test_the_emitted_c_compiles_with_nvrtc():
    bodies = [cuda.emit_specialization(spec, name, prelude=False) for name, spec, _ in _cases(np.random.default_rng(0))]
    try:
        cubin = cuda.compile_cubin(cuda.PRELUDE + "\n".join(b.source for b in bodies), arch="sm_90")
    except ImportError:
        pytest.skip("no NVRTC")
    for b in bodies:
        for name in b.entry_names():
            assert b"\0" + name.encode() + b"\0" in cubin


def test_the_emulated_c_gives_the_numpy_values(emu_dir):     # noqa: F811
    cases = _cases(np.random.default_rng(1))
    bodies = [cuda.emit_specialization(spec, name, prelude=False) for name, spec, _ in cases]
    lib = emu_build(bodies, emu_dir)
    for (name, spec, ins), ek in zip(cases, bodies):
        inplace = {spec.n_results + m: k for m, k in enumerate(spec.commits)}
        rtol = 1e-5 if any(getattr(x, "dtype", None) == np.float32 for x in ins) else 1e-12
        emu_check(lib, ek, spec.prog, ins, rtol, inplace=inplace)


def test_a_table_is_read_where_it_is_indexed_not_copied_into_registers():
    spec = _spec(rows, np.ones((1000, 2, 1)), np.ones(8, np.uint32))
    src = cuda.emit_specialization(spec).source
    body = src[src.index("// hawk kernel body"):]
    assert "in0[" in body and not re.search(r"const double in0_\d+ = in0\[", body)
    assert len(body) < 4000
    assert "999LL" in body                        # the row is clamped to the last one


@pytest.mark.parametrize("seed", range(3))
def test_the_rewrite_of_scatter_add_gives_its_values(seed):
    rng = np.random.default_rng(seed)
    for name, spec, ins in _cases(rng, n=57):
        if not any(e.prim.name == "scatter_add" for e in spec.prog.eqns):
            continue
        out_sample = [a.aval.kind == "sample" for a in spec.prog.outputs]
        prog = expand_scatter(spec.prog)
        assert not any(e.prim.name == "scatter_add" for e in prog.eqns)
        outs = []
        for kern in (NumpyKernel(spec.prog, out_sample), NumpyKernel(prog, out_sample)):
            o = [np.empty(a.aval.shape + ((57,) if s else (1,)), a.aval.dtype)
                 for a, s in zip(spec.prog.outputs, out_sample)]
            kern([x.copy() for x in ins], o, 57)
            outs.append(o)
        for a, b in zip(*outs):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13, err_msg=name)


# ---------------------------------------------------------------------------------------------
# graphs on the fake device

@hawk.kernel
def lerp_loss(c: Table, x: Scalar, y: Scalar):
    k = hm.int32(hm.floor(x))
    u = x - hm.floor(x)
    p = (1.0 - u) * hm.take(c, k, mode="clip") + u * hm.take(c, k + 1, mode="clip")
    return hawk.sum((p - y) ** 2)


@eagle.Graph.builder
def lerp_graph(c, x, y):
    g = eagle.Graph()
    g.result = lerp_loss(c, x, y)
    return g


@eagle.Graph.builder
def histogram(h, i, w):
    g = eagle.Graph()
    hist(h, i, w)
    g.result = h
    return g


def test_value_and_grad_and_a_histogram_on_the_fake_device_equal_numpy():
    rng = np.random.default_rng(3)
    c, x, y = rng.normal(size=(7, 1)), rng.uniform(-1, 8, 40), rng.normal(size=40)
    want = eagle.value_and_grad(lerp_graph)(c, x, y)
    with use_backend("fake-cuda"):
        got = eagle.value_and_grad(lerp_graph)(c, x, y)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-14)
    i, w = rng.integers(-5, 5, 40).astype(np.int32), rng.normal(size=40)
    h_np, h_cu = np.zeros((4, 1)), np.zeros((4, 1))
    histogram(h_np, i, w)()
    with use_backend("fake-cuda"):
        g = histogram(h_cu, i, w)
    g()
    np.testing.assert_allclose(h_cu, h_np, rtol=1e-14)
    assert np.abs(h_np).sum() > 0


def test_a_scatter_into_too_large_a_table_is_refused_on_cuda_naming_its_line():
    spec = _spec(hist, np.ones((5000, 1)), np.ones(4, np.int32), np.ones(4))
    with pytest.raises(NotImplementedError, match=r"scatter_add at hist:.*5000 rows.*NumPy or JAX"):
        cuda.emit_specialization(spec)
