"""Every parameter role, checked against plain NumPy on the same arrays."""
from __future__ import annotations

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Int32, Matrix, Mutable, Param, Scalar, UInt32, Vector
from tour_kernels import affine


# ---------------------------------------------------------------------------------------------
# Scalar and Param

def test_scalar_plane_with_python_number_params(rng):
    x = rng.random(7)
    np.testing.assert_allclose(affine(x, 2.0, -1.0), 2.0 * x - 1.0, rtol=1e-15)
    np.testing.assert_allclose(affine(x, 3, 4), 3 * x + 4, rtol=1e-15)       # int Params


def test_keyword_and_positional_calls_agree(rng):
    x = rng.random(5)
    want = 0.5 * x + 0.25
    np.testing.assert_allclose(affine(x, 0.5, 0.25), want)
    np.testing.assert_allclose(affine(x, b=0.25, a=0.5), want)
    np.testing.assert_allclose(affine(b=0.25, x=x, a=0.5), want)


def test_param_array_is_read_at_every_call(rng):
    x = rng.random(6)
    a, b = np.array([2.0]), np.array([0.0])
    np.testing.assert_allclose(affine(x, a, b), 2.0 * x)
    a[0], b[0] = -3.0, 1.5                   # same arrays, new values
    np.testing.assert_allclose(affine(x, a, b), -3.0 * x + 1.5)
    a[0] = 0.0
    np.testing.assert_allclose(affine(x, a, b), np.full(6, 1.5))


def test_param_values_change_between_calls_python_numbers(rng):
    x = rng.random(4)
    for a in (1.0, 2.0, -7.5):
        np.testing.assert_allclose(affine(x, a, 0.0), a * x)


def test_scalar_one_cell_broadcasts_over_samples(rng):
    y = rng.random(5)

    @hawk.kernel
    def add(x: Scalar, y: Scalar):
        return x + y
    np.testing.assert_allclose(add(np.array([10.0]), y), 10.0 + y)
    out = add(np.array([1.0]), np.array([2.0]))         # every plane one cell: n = 1
    assert out.shape == (1,) and out[0] == 3.0


def test_returned_planes_are_new_arrays(rng):
    @hawk.kernel
    def same(x: Scalar, v: Vector[3]):
        return x, v[0], v
    x, v = rng.random(4), rng.random((3, 4))
    r0, r1, r2 = same(x, v)
    for r, src in ((r0, x), (r1, v[0]), (r2, v)):
        np.testing.assert_array_equal(r, src)
        assert not np.shares_memory(r, x) and not np.shares_memory(r, v)
    r0[:] = -1.0
    r2[:] = -1.0
    assert (x >= 0).all() and (v >= 0).all()
    again = same(x, v)                       # a second call gives fresh arrays too
    assert not np.shares_memory(again[0], r0)


# ---------------------------------------------------------------------------------------------
# Mutable

@hawk.kernel
def step(x: Scalar, t: Mutable[Scalar], dt: Param) -> Scalar:
    t += dt
    return x * 2.0


def test_mutable_one_cell_updated_in_place(rng):
    x = rng.random(3)
    t = np.array([1.0])
    t_id = id(t)
    np.testing.assert_allclose(step(x, t, 0.25), 2.0 * x)
    assert t[0] == 1.25
    step(x, t, 0.25)
    step(x, t=t, dt=0.5)
    assert t[0] == 2.0 and id(t) == t_id


def test_mutable_plane_updated_in_place(rng):
    @hawk.kernel
    def decay(x: Mutable[Scalar], k: Param):
        x = x * hm.exp(-k)
    x = rng.random(9)
    want = x * np.exp(-0.3)
    view = x                                 # the same object afterwards
    assert decay(x, 0.3) is None             # no return: results only through Mutables
    np.testing.assert_allclose(view, want, rtol=1e-15)


def test_mutable_float32_plane_keeps_its_dtype(rng):
    @hawk.kernel
    def scale(x: Mutable[Scalar], k: Param):
        x = x * k
    x = rng.random(5).astype(np.float32)
    want = (x.astype(np.float64) * 1.5).astype(np.float32)
    scale(x, 1.5)
    assert x.dtype == np.float32
    np.testing.assert_allclose(x, want, rtol=1e-6)


def test_mutable_uint32_one_cell_from_a_reduction(rng):
    @hawk.kernel
    def count_below(s: Scalar, lim: Param, flag: Mutable[UInt32]):
        flag = hm.uint32(hawk.sum(s < lim))
    s = rng.random(100)
    flag = np.zeros(1, np.uint32)
    count_below(s, 0.3, flag)
    assert flag.dtype == np.uint32 and flag[0] == np.count_nonzero(s < 0.3)
    count_below(s, 2.0, flag)
    assert flag[0] == 100


def test_no_return_commits_several_mutables(rng):
    @hawk.kernel
    def integrate(p: Mutable[Vector[3]], v: Mutable[Vector[3]], a: Vector[3], dt: Param, steps: Mutable[UInt32]):
        v = v + a * dt
        p = p + v * dt
        steps = steps + hm.uint32(1)
    p, v, a = rng.random((3, 6)), rng.random((3, 6)), rng.random((3, 6))
    steps = np.zeros(1, np.uint32)
    v_want = v + a * 0.1
    p_want = p + v_want * 0.1
    assert integrate(p, v, a, 0.1, steps) is None
    np.testing.assert_allclose(v, v_want, rtol=1e-15)
    np.testing.assert_allclose(p, p_want, rtol=1e-15)
    assert steps[0] == 1


def test_swapping_two_mutables():
    @hawk.kernel
    def swap(a: Mutable[Scalar], b: Mutable[Scalar]):
        a, b = b, a
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    swap(a, b)
    np.testing.assert_array_equal(a, [3.0, 4.0])
    np.testing.assert_array_equal(b, [1.0, 2.0])


def test_mutable_read_after_another_is_written():
    @hawk.kernel
    def shift(a: Mutable[Scalar], b: Mutable[Scalar]):
        a, b = a + b, a                       # b gets the OLD a
    a, b = np.array([1.0, 2.0]), np.array([10.0, 20.0])
    shift(a, b)
    np.testing.assert_array_equal(a, [11.0, 22.0])
    np.testing.assert_array_equal(b, [1.0, 2.0])


def test_component_read_before_its_mutable_is_overwritten():
    @hawk.kernel
    def keep_old(x: Mutable[Vector[2]]):
        first = x[0]
        x = x * 2.0
        return first + 1.0                    # the old component, not the doubled one
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(keep_old(x), [2.0, 3.0])
    np.testing.assert_array_equal(x, [[2.0, 4.0], [6.0, 8.0]])


def test_mutable_plane_assigned_a_constant():
    @hawk.kernel
    def reset(x: Mutable[Scalar], v: Mutable[Vector[2]]):
        x = 0.0
        v = hm.vec(1.0, 2.0)
    x, v = np.ones(4), np.zeros((2, 4))
    reset(x, v)
    np.testing.assert_array_equal(x, np.zeros(4))
    np.testing.assert_array_equal(v, np.array([[1.0] * 4, [2.0] * 4]))


def test_unassigned_mutable_is_not_written(rng):
    @hawk.kernel
    def reads_only(x: Scalar, m: Mutable[Scalar]):
        return x + m
    x, m = rng.random(3), rng.random(3)
    m_before = m.copy()
    np.testing.assert_allclose(reads_only(x, m), x + m_before)
    np.testing.assert_array_equal(m, m_before)


# ---------------------------------------------------------------------------------------------
# integer and bool roles

@hawk.kernel
def ints(u: UInt32, i: Int32):
    return u + 1, i * 2, u + i


def test_uint32_int32_planes_follow_numpy_promotion():
    u = np.array([0, 1, 4_000_000_000], np.uint32)
    i = np.array([-5, 0, 7], np.int32)
    ru, ri, rs = ints(u, i)
    for got, want in ((ru, u + 1), (ri, i * 2), (rs, u + i)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_uint32_int32_one_cell():
    u1 = np.array([7], np.uint32)
    i = np.array([1, 2, 3], np.int32)
    ru, ri, rs = ints(u1, i)
    assert ru.shape == (1,) and ru[0] == 8 and ru.dtype == np.uint32
    np.testing.assert_array_equal(rs, u1 + i)
    i1 = np.array([-2], np.int32)
    ru, ri, rs = ints(np.array([1, 2], np.uint32), i1)
    np.testing.assert_array_equal(ri, [-4])
    np.testing.assert_array_equal(rs, np.array([1, 2], np.uint32) + i1)


def test_mutable_uint32_plane_counts(rng):
    @hawk.kernel
    def tally(x: Scalar, c: Mutable[UInt32]):
        c += x > 0.5
    x = rng.random(20)
    c = np.full(20, 3, np.uint32)
    tally(x, c)
    np.testing.assert_array_equal(c, 3 + (x > 0.5))
    assert c.dtype == np.uint32


# ---------------------------------------------------------------------------------------------
# Vector and Matrix planes

def test_vector_plane(rng):
    @hawk.kernel
    def kin(p: Vector[3], v: Vector[3], dt: Param):
        q = p + v * dt
        return q, q[2], hm.vec(q[1], q[0])
    p, v = rng.random((3, 5)), rng.random((3, 5))
    q, qz, swapped = kin(p, v, 0.5)
    np.testing.assert_allclose(q, p + v * 0.5)
    np.testing.assert_allclose(qz, (p + v * 0.5)[2])
    np.testing.assert_allclose(swapped, (p + v * 0.5)[[1, 0]])
    assert q.shape == (3, 5) and qz.shape == (5,) and swapped.shape == (2, 5)


def test_vector_one_cell_and_constant_vector(rng):
    W = np.array([1.0, 2.0, 3.0])

    @hawk.kernel
    def weigh(v: Vector[3], g: Vector[3]):
        return v * W + g, W * v - W, W < v
    v = rng.random((3, 4)) * 3
    g1 = np.array([[10.0], [20.0], [30.0]])               # one cell: (3, 1)
    Wc = W[:, None]
    for vv in (v, v[:, :3]):                               # n == 3 must not confuse the axes
        a, b, c = weigh(vv, g1)
        np.testing.assert_allclose(a, vv * Wc + g1)
        np.testing.assert_allclose(b, Wc * vv - Wc)
        np.testing.assert_array_equal(c, Wc < vv)


def test_matrix_plane(rng):
    @hawk.kernel
    def mat(m: Matrix[2, 3], v: Vector[3]):
        return m @ v, m[1, 2], m.T
    m, v = rng.random((2, 3, 4)), rng.random((3, 4))
    mv, m12, mt = mat(m, v)
    np.testing.assert_allclose(mv, np.einsum("ijn,jn->in", m, v))
    np.testing.assert_allclose(m12, m[1, 2])
    np.testing.assert_allclose(mt, np.swapaxes(m, 0, 1))
    assert mt.shape == (3, 2, 4)


def test_mutable_matrix(rng):
    @hawk.kernel
    def relax(m: Mutable[Matrix[2, 2]], k: Param):
        m = m * (1.0 - k) + hm.transpose(m) * k
    m = rng.random((2, 2, 5))
    want = m * 0.75 + np.swapaxes(m, 0, 1) * 0.25
    relax(m, 0.25)
    np.testing.assert_allclose(m, want, rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# layouts: one kernel, many argument kinds

def test_one_kernel_many_layouts(rng):
    x32, x64 = rng.random(5).astype(np.float32), rng.random(5)
    assert affine(x32, 2.0, 1.0).dtype == np.float32         # Python numbers are weak
    assert affine(x64, 2.0, 1.0).dtype == np.float64
    assert affine(x32, np.array([2.0]), 1.0).dtype == np.float64   # a float64 array is not
    assert affine(x32, np.float64(2.0), 1.0).dtype == (x32 * np.float64(2.0)).dtype
    assert affine(x32, np.float32(2.0), 1.0).dtype == np.float32
    ix = np.arange(5, dtype=np.int32)
    np.testing.assert_allclose(affine(ix, 0.5, 0.0), ix * 0.5)
    # back to the first layout: still right after the others
    np.testing.assert_allclose(affine(x64, 3.0, 0.0), 3.0 * x64)


def test_different_sample_counts_between_calls(rng):
    for n in (2, 17, 3, 1000, 2):
        x = rng.random(n)
        np.testing.assert_allclose(affine(x, 2.0, 1.0), 2.0 * x + 1.0)


def test_non_contiguous_planes(rng):
    @hawk.kernel
    def addv(a: Vector[2], b: Scalar):
        return a * b
    big = rng.random((4, 10))
    a = big[::2, ::2]                         # strided (2, 5)
    b = big[1, 1::2]
    np.testing.assert_allclose(addv(a, b), a * b)


def test_kernel_repr_names_roles():
    assert repr(step) == "<hawk.kernel step(x: Scalar, t: Mutable[Scalar], dt: Param)>"


@pytest.mark.parametrize("role,plane", [(Scalar, "(n,)"), (Vector[3], "(3, n)"), (Matrix[2, 4], "(2, 4, n)")])
def test_role_plane_shape(role, plane):
    assert role.plane_shape() == plane
