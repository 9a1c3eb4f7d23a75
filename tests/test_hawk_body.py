"""Kernel bodies: result trees, reductions, per-sample if, static loops, small tensors, chunked
evaluation and the printed IR. Oracles are plain NumPy / np.einsum / np.cross."""
from __future__ import annotations

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.emit.numpy as emit_numpy
import hawk_fx.math as hm
from hawk_fx import Matrix, Mutable, Param, Scalar, UInt32, Vector


# ---------------------------------------------------------------------------------------------
# result trees

def test_return_trees(rng):
    @hawk.kernel
    def tree(x: Scalar, y: Scalar):
        return {"sum": x + y, "parts": [x, (y, x * y)], "k": 2.0}
    x, y = rng.random(4), rng.random(4)
    out = tree(x, y)
    assert isinstance(out, dict) and list(out) == ["sum", "parts", "k"]
    assert isinstance(out["parts"], list) and isinstance(out["parts"][1], tuple)
    np.testing.assert_allclose(out["sum"], x + y)
    np.testing.assert_allclose(out["parts"][0], x)
    np.testing.assert_allclose(out["parts"][1][0], y)
    np.testing.assert_allclose(out["parts"][1][1], x * y)
    np.testing.assert_array_equal(out["k"], np.full(4, 2.0))   # a number: one per sample, as jax.vmap broadcasts


@pytest.mark.parametrize("shape", ["tuple1", "list", "nested", "single"])
def test_tree_kinds(shape, rng):
    @hawk.kernel
    def t(x: Scalar):
        y = x * 3.0
        if shape == "tuple1":          # a Python test on a closure constant: one arm is traced
            out = (y,)
        elif shape == "list":
            out = [y, x]
        elif shape == "nested":
            out = ((y, [x]), {"a": {"b": y}})
        else:
            out = y
        return out
    x = rng.random(3)
    got = t(x)
    if shape == "tuple1":
        assert isinstance(got, tuple) and len(got) == 1
        np.testing.assert_allclose(got[0], 3 * x)
    elif shape == "list":
        assert isinstance(got, list) and len(got) == 2
    elif shape == "nested":
        np.testing.assert_allclose(got[0][1][0], x)
        np.testing.assert_allclose(got[1]["a"]["b"], 3 * x)
    else:
        assert isinstance(got, np.ndarray)
    assert "select" not in str(t.ir)


# ---------------------------------------------------------------------------------------------
# reductions

def test_reductions_give_one_value_for_all_samples(rng):
    @hawk.kernel
    def stats(x: Scalar):
        return hawk.sum(x), hawk.max(x), hawk.min(x), hawk.mean(x), x - hawk.mean(x)
    x = rng.normal(size=50)
    s, mx, mn, mean, centred = stats(x)
    for got, want in ((s, x.sum()), (mx, x.max()), (mn, x.min()), (mean, x.mean())):
        assert got.shape == (1,)
        np.testing.assert_allclose(got[0], want, rtol=1e-13)
    np.testing.assert_allclose(centred, x - x.mean(), rtol=1e-12, atol=1e-15)


def test_reduction_dtypes_follow_numpy(rng):
    @hawk.kernel
    def red(x: Scalar, b: Scalar):
        return hawk.sum(x), hawk.mean(x), hawk.sum(b > 0.5)
    x, b = rng.random(10).astype(np.float32), rng.random(10)
    s, m, c = red(x, b)
    assert s.dtype == np.sum(x).dtype and m.dtype == np.mean(x).dtype
    assert c.dtype == np.sum(b > 0.5).dtype and c[0] == np.count_nonzero(b > 0.5)


def test_reduction_over_vector_components(rng):
    @hawk.kernel
    def centroid(p: Vector[3]):
        return hawk.mean(p)
    p = rng.random((3, 40))
    got = centroid(p)
    assert got.shape == (3, 1)
    np.testing.assert_allclose(got[:, 0], p.mean(axis=1))


def test_reduction_over_more_samples_than_a_chunk(rng):
    @hawk.kernel
    def tot(x: Scalar, total: Mutable[Scalar]):
        total = hawk.sum(x * x)
        return x / hm.sqrt(hawk.sum(x * x))
    n = emit_numpy.CHUNK * 2 + 77
    x = rng.random(n)
    total = np.zeros(1)
    unit = tot(x, total)
    np.testing.assert_allclose(total[0], np.sum(x * x), rtol=1e-12)
    np.testing.assert_allclose(unit, x / np.sqrt(np.sum(x * x)), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# per-sample if and static loops

@hawk.kernel
def branches(x: Scalar, a: Param):
    y = x
    if x < -1.0:
        y = hm.sin(x)
        z = 1.0
    elif x < 1.0:
        z = 2.0
    else:
        y = hm.cos(x) * a
        z = 3.0
    return y, z


def test_if_elif_else_selects_per_sample(rng):
    x = np.linspace(-3, 3, 25)
    y, z = branches(x, 2.0)
    np.testing.assert_allclose(y, np.where(x < -1, np.sin(x), np.where(x < 1, x, np.cos(x) * 2.0)))
    np.testing.assert_array_equal(z, np.where(x < -1, 1.0, np.where(x < 1, 2.0, 3.0)))


def test_if_traces_both_arms_into_selects():
    text = str(branches.ir)
    assert "select" in text
    assert "sin" in text and "cos" in text          # both arms were traced


def test_if_on_a_param_selects_python_numbers():
    @hawk.kernel
    def sgn(x: Scalar, a: Param):
        if a > 0:
            s = 1.0
        else:
            s = -1.0
        return x * s
    x = np.arange(3.0)
    np.testing.assert_array_equal(sgn(x, 2.0), x)
    np.testing.assert_array_equal(sgn(x, -2.0), -x)
    assert sgn(x.astype(np.float32), 1.0).dtype == np.float32


def test_if_without_else_keeps_earlier_value(rng):
    @hawk.kernel
    def relu(x: Scalar, count: Mutable[UInt32]):
        if x < 0:
            x = 0.0 * x
            count = count + hm.uint32(1)
        return x
    x = rng.normal(size=12)
    count = np.zeros(12, np.uint32)
    np.testing.assert_array_equal(relu(x, count), np.maximum(x, 0.0))
    np.testing.assert_array_equal(count, (x < 0).astype(np.uint32))


def test_helper_defined_in_one_arm_stays_there():
    @hawk.kernel
    def arm_helper(x: Scalar):
        y = x
        if x > 0:
            def double(z):
                return z * 2.0
            y = double(x)
        return y
    np.testing.assert_array_equal(arm_helper(np.array([-1.0, 3.0])), [-1.0, 6.0])


def test_nested_if_in_loop(rng):
    @hawk.kernel
    def nest(x: Scalar, v: Vector[2]):
        acc = 0.0 * x
        for i in range(2):
            if v[i] > 0.5:
                acc = acc + v[i]
            elif x > 0.5:
                acc = acc - 1.0
        return acc
    x, v = rng.random(20), rng.random((2, 20))
    want = sum(np.where(v[i] > 0.5, v[i], np.where(x > 0.5, -1.0, 0.0)) for i in range(2))
    np.testing.assert_allclose(nest(x, v), want)


def test_static_for_loop_unrolls(rng):
    @hawk.kernel
    def poly(x: Scalar, c: Vector[4]):
        acc = 0.0 * x
        for i in range(4):
            acc = acc * x + c[i]
        total = 0.0
        for ci in c:
            total = total + ci
        return acc, total
    x, c = rng.random(5), rng.random((4, 5))
    acc, total = poly(x, c)
    want = ((c[0] * x + c[1]) * x + c[2]) * x + c[3]
    np.testing.assert_allclose(acc, want, rtol=1e-14)
    np.testing.assert_allclose(total, c.sum(axis=0), rtol=1e-14)
    text = str(poly.ir)
    assert text.count(" = index") == 8 and "while" not in text    # 2 x 4 unrolled reads


def test_helper_functions_inline(rng):
    def smoothstep(t):
        t = hm.clip(t, 0.0, 1.0)
        return t * t * (3.0 - 2.0 * t)

    @hawk.kernel
    def ss(x: Scalar):
        return smoothstep(x)
    x = rng.uniform(-0.5, 1.5, 30)
    t = np.clip(x, 0, 1)
    np.testing.assert_allclose(ss(x), t * t * (3 - 2 * t), rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# Vector / Matrix operations

def test_vector_ops_against_numpy(rng):
    @hawk.kernel
    def vops(a: Vector[3], b: Vector[3]):
        return (hm.vec(a[0], b[1], 1.0), hm.dot(a, b), hm.norm(a), hm.cross(a, b), hm.outer(a, b),
                a @ b)
    a, b = rng.random((3, 6)), rng.random((3, 6))
    v, d, nrm, cr, out, ab = vops(a, b)
    np.testing.assert_allclose(v, np.stack([a[0], b[1], np.ones(6)]))
    np.testing.assert_allclose(d, np.einsum("in,in->n", a, b))
    np.testing.assert_allclose(nrm, np.linalg.norm(a, axis=0))
    np.testing.assert_allclose(cr, np.cross(a, b, axis=0))
    np.testing.assert_allclose(out, np.einsum("in,jn->ijn", a, b))
    np.testing.assert_allclose(ab, d)


def test_matrix_ops_against_einsum(rng):
    @hawk.kernel
    def mops(m: Matrix[3, 3], k: Matrix[3, 2], v: Vector[3]):
        return (hm.matmul(m, v), hm.matmul(m, k), hm.matmul(v, m), hm.matmul(v, v), hm.trace(m),
                hm.transpose(k), m.T @ v)
    m, k, v = rng.random((3, 3, 5)), rng.random((3, 2, 5)), rng.random((3, 5))
    mv, mk, vm, vv, tr, kt, mtv = mops(m, k, v)
    np.testing.assert_allclose(mv, np.einsum("ijn,jn->in", m, v))
    np.testing.assert_allclose(mk, np.einsum("ijn,jkn->ikn", m, k))
    np.testing.assert_allclose(vm, np.einsum("jn,jkn->kn", v, m))
    np.testing.assert_allclose(vv, np.einsum("in,in->n", v, v))
    np.testing.assert_allclose(tr, np.einsum("iin->n", m))
    np.testing.assert_allclose(kt, np.swapaxes(k, 0, 1))
    np.testing.assert_allclose(mtv, np.einsum("jin,jn->in", m, v))


def test_einsum_two_operands(rng):
    @hawk.kernel
    def e2(m: Matrix[2, 3], k: Matrix[3, 4]):
        return hm.einsum("ij,jk->ik", m, k), hm.einsum("ij,ij->", m, m), hm.einsum("ij->ji", m)
    m, k = rng.random((2, 3, 7)), rng.random((3, 4, 7))
    a, b, c = e2(m, k)
    np.testing.assert_allclose(a, np.einsum("ijn,jkn->ikn", m, k))
    np.testing.assert_allclose(b, np.einsum("ijn,ijn->n", m, m))
    np.testing.assert_allclose(c, np.einsum("ijn->jin", m))


def test_einsum_three_and_more_operands_contract_pairwise(rng):
    @hawk.kernel
    def e3(a: Vector[3], m: Matrix[3, 4], k: Matrix[4, 2], b: Vector[2]):
        return hm.einsum("i,ij,jk,k->", a, m, k, b), hm.einsum("ij,jk,k->i", m, k, b), \
            hm.einsum("i,ij,j->j", a, m, m[0])
    a, m, k, b = rng.random((3, 5)), rng.random((3, 4, 5)), rng.random((4, 2, 5)), rng.random((2, 5))
    s, v, w = e3(a, m, k, b)
    np.testing.assert_allclose(s, np.einsum("in,ijn,jkn,kn->n", a, m, k, b))
    np.testing.assert_allclose(v, np.einsum("ijn,jkn,kn->in", m, k, b))
    np.testing.assert_allclose(w, np.einsum("in,ijn,jn->jn", a, m, m[0]))
    eqns = [line for line in str(e3.ir).splitlines() if " = einsum" in line]
    assert len(eqns) == 3 + 2 + 2                # (operands - 1) pairwise contractions each
    for line in eqns:
        spec = line.split("spec=")[1].split("]")[0]
        assert spec.count(",") <= 1              # each a one- or two-operand einsum


def test_einsum_with_constant_operand(rng):
    R = np.array([[0.0, -1.0], [1.0, 0.0]])

    @hawk.kernel
    def rot(v: Vector[2]):
        return hm.einsum("ij,j->i", R, v), R @ v
    v = rng.random((2, 6))
    a, b = rot(v)
    np.testing.assert_allclose(a, R @ v)
    np.testing.assert_allclose(b, R @ v)


# ---------------------------------------------------------------------------------------------
# chunked evaluation

@hawk.kernel
def chunky(x: Scalar, v: Vector[2], acc: Mutable[Scalar], t: Mutable[Scalar], dt: Param):
    y = x * t + hm.sin(v[0]) * v[1]
    acc = acc + y
    t += dt
    return y, hm.vec(v[1], v[0] * y)


def chunky_numpy(x, v, acc, t, dt):
    y = x * t + np.sin(v[0]) * v[1]
    return y, np.stack([v[1], v[0] * y]), acc + y, t + dt


@pytest.mark.parametrize("threads", [1, 3])
def test_chunked_matches_small_n(threads, rng, monkeypatch):
    monkeypatch.setattr(emit_numpy, "THREADS", threads)
    monkeypatch.setattr(emit_numpy, "PARALLEL_MIN", 0)          # worker threads even at this n
    n = emit_numpy.CHUNK * 3 + 1001                               # not a multiple of CHUNK
    assert n % emit_numpy.CHUNK
    x, v, acc0, t0 = rng.random(n), rng.random((2, n)), rng.random(n), np.array([0.5])
    acc, t = acc0.copy(), t0.copy()
    y, w = chunky(x, v, acc, t, 0.25)
    y_np, w_np, acc_np, t_np = chunky_numpy(x, v, acc0, t0, 0.25)
    np.testing.assert_allclose(y, y_np, rtol=1e-15)
    np.testing.assert_allclose(w, w_np, rtol=1e-15)
    np.testing.assert_allclose(acc, acc_np, rtol=1e-15)
    np.testing.assert_allclose(t, t_np)                           # one-cell Mutable written once
    # the same samples in small calls give the same values
    for lo in (0, 5000, n - 300):
        sl = slice(lo, lo + 300)
        a_small, t_small = acc0[sl].copy(), t0.copy()
        ys, ws = chunky(x[sl], v[:, sl], a_small, t_small, 0.25)
        np.testing.assert_array_equal(ys, y[sl])
        np.testing.assert_array_equal(ws, w[:, sl])
        np.testing.assert_array_equal(a_small, acc[sl])


def test_chunk_boundaries_exact_multiple(rng):
    n = emit_numpy.CHUNK * 2
    x = rng.random(n)

    @hawk.kernel
    def sq(x: Scalar):
        return x * x + 1.0
    np.testing.assert_allclose(sq(x), x * x + 1.0)


# ---------------------------------------------------------------------------------------------
# printing

def test_printed_ir_golden_affine():
    @hawk.kernel
    def axpb(x: Scalar, a: Param, b: Param):
        return a * x + b
    # inputs named a, b, c in order; a float64 plane is f64[n]; a Python-number Param is a weak
    # uniform f64[]~; `a * x` binds mul(a, x), then add; one result
    assert str(axpb.ir) == (
        "{ lambda a:f64[n] b:f64[]~ c:f64[]~ . let\n"
        "    d:f64[n] = mul b a\n"
        "    e:f64[n] = add d c\n"
        "  in (e) }")


def test_printed_ir_golden_select_and_commit():
    @hawk.kernel
    def fold(x: Scalar, t: Mutable[Scalar]):
        if x > 0.0:
            y = x
        else:
            y = -x
        t = y + 1.0
    # the test first, then the else arm (neg), then select(test, then, else); the Mutable's new
    # value is the program's only output
    assert str(fold.ir) == (
        "{ lambda a:f64[n] b:f64[n] . let\n"
        "    c:bool[n] = gt a 0.0\n"
        "    d:f64[n] = neg a\n"
        "    e:f64[n] = select c a d\n"
        "    f:f64[n] = add e 1.0\n"
        "  in (f) }")


def test_printed_ir_golden_reduction_and_cast():
    @hawk.kernel
    def count(s: Scalar, lim: Param, flag: Mutable[UInt32]):
        flag = hm.uint32(hawk.sum(s < lim))
    # a bool summed is int64 (as np.sum); one value for all samples has no `n`; the cast shows its param
    assert str(count.ir) == (
        "{ lambda a:f64[n] b:f64[]~ c:u32[n] . let\n"
        "    d:bool[n] = lt a b\n"
        "    e:i64[] = sample_sum d\n"
        "    f:u32[] = convert[dtype=uint32] e\n"
        "  in (f) }")


def test_trace_for_given_arguments_shows_their_types():
    @hawk.kernel
    def scale(v: Vector[3], k: Param):
        return v * k
    text = str(scale.trace(np.ones((3, 4), np.float32), np.array([2.0], np.float32)))
    assert text.splitlines()[0] == "{ lambda a:f32[3,n] b:f32[] . let"
    assert "c:f32[3,n] = mul a b" in text
