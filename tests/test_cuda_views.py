"""Views, staged math and stack/concatenate on the CUDA lowering, against the recording fake: the
strided copies (slice, update, concat) and memcpys (reshape) give what the NumPy backend gives."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar, Vector
from test_cuda_lowering import ORDERS, run_both
from tour_kernels import cell


@hawk.kernel
def mix(a: Scalar, b: Scalar):
    return a * b + a


@hawk.kernel
def step(x: Scalar, y: Mutable[Scalar]):
    y = y * 0.5 + x


@hawk.kernel
def vmix(v: Vector[2]):
    return v[0] * v[1]


@eagle.Graph.builder
def views(x, p):
    g = eagle.Graph()
    a = mix(p[1, ::-2], x[::2])                     # strided and reversed views of two arguments
    step(np.sin(a), p[0, 0:5:2])                    # a write through a view, in place in p
    flat = p.reshape(-1)[3:9]
    g.result = (a, flat * 2.0, np.concatenate([x[:2], a, x[-1:]]), vmix(np.stack([x, -x])))
    return g


@eagle.Graph.builder
def in_control(x, p, n, c):
    g = eagle.Graph()
    for _ in range(n):
        step(x[:3], p[1, 2:])
    y = mix(x, x)
    p[0, :2] = y[3:]                                # an assignment: an update of p
    if c:
        y = np.concatenate([y[2:], y[:2]])
    g.result = (y, p[:, 1:].reshape(-1))
    return g


def test_views_lower_to_strided_copies():
    x, p = np.arange(5.0) + 1.0, np.arange(10.0).reshape(2, 5)
    run = run_both(views(x, p), times=2, orders=ORDERS)
    labels = [nd.label for nd in run.plan.nodes(role="copy")]
    assert {"slice", "update", "concat"} <= set(labels)
    assert [nd.label for nd in run.plan.nodes("memcpy")].count("reshape") == 3      # p.reshape(-1); np.stack gives each operand its axis


@pytest.mark.parametrize("c", [0, 1])
def test_views_inside_device_flow(c):
    x, p = np.arange(5.0) * 0.5, np.ones((2, 5))
    run_both(in_control(x, p, cell(3), cell(c)), times=2)


def test_the_modules_compile_with_nvrtc(nvrtc):
    from hawk_fx.emit import cuda as hcuda
    run = run_both(views(np.arange(5.0) + 1.0, np.ones((2, 5))), orders=("creation",))
    for name, mod in run.plan.modules.items():           # the staged ufuncs' bodies and the copy kernel
        cubin = hcuda.compile_cubin(mod.source, "sm_90")
        for entry in mod.entries:
            assert b"\0" + entry.encode() + b"\0" in cubin, f"{name}: entry {entry} missing"
