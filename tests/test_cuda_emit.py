"""The CUDA C emitter: every primitive compiles with NVRTC for sm_90 (no GPU needed), and the
generated C has the shape it must. Compile tests batch many kernels into one translation unit.

NVRTC comes from the `nvrtc` extra (cuda-bindings + nvidia-cuda-nvrtc-cu12). Without it the compile
tests skip, except under CI (the CI variable set), where a missing NVRTC is a failure.
"""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import prims
from hawk_fx.core import SAMPLE, UNIFORM, AVal, Eqn, Literal, Program, Var, abstract_eval
from hawk_fx.emit import cuda
from hawk_fx.roles import Matrix, Mutable, Param, Scalar, Vector
from tour_kernels import below

P = prims.P
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
FLOATS = [F32, F64]
INTS = [np.dtype(d) for d in (np.int32, np.uint32, np.int64, np.bool_)]


# ---------------------------------------------------------------------------------------------
# helpers

def sample(dtype, shape=()):
    return AVal(shape, dtype, SAMPLE)


def weak(dtype=F64):
    return AVal((), dtype, UNIFORM, weak=True)


def cell(dtype, shape=()):
    return AVal(shape, dtype, UNIFORM)


def one_op(prim, operands, **params) -> Program:
    """A Program of one equation; operands are AVals (become inputs) or Literals."""
    ins = [Var(a) if isinstance(a, AVal) else a for a in operands]
    outs = [Var(av) for av in abstract_eval[prim](*[a.aval for a in ins], **params)]
    return Program([a for a in ins if isinstance(a, Var)], [Eqn(prim, ins, outs, params)], outs)


def out_sample(prog):
    return [a.aval.kind == SAMPLE for a in prog.outputs]


class Batch:
    """Kernel bodies gathered into one translation unit, compiled once."""

    def __init__(self):
        self.bodies: list[cuda.EmittedKernel] = []

    def add(self, prog, tag, **kw):
        name = re.sub(r"\W", "_", f"k{len(self.bodies)}_{tag}")
        ek = cuda.plan_kernel(prog, name, out_sample(prog), prelude=False, **kw)
        self.bodies.append(ek)
        return ek

    def source(self, bodies=None):
        return cuda.PRELUDE + "\n".join(b.source for b in (self.bodies if bodies is None else bodies))

    def compile(self):
        try:
            cubin = cuda.compile_cubin(self.source(), arch="sm_90")
        except cuda.CudaCompileError:
            bad = []
            for b in self.bodies:          # find the culprits
                try:
                    cuda.compile_cubin(self.source([b]), arch="sm_90")
                except cuda.CudaCompileError as exc:
                    bad.append(f"{b.name}: {str(exc)[:2000]}")
            pytest.fail("kernels that do not compile:\n" + "\n".join(bad))
        assert cubin[:4] == b"\x7fELF"
        for b in self.bodies:
            for name in b.entry_names():
                assert b"\0" + name.encode() + b"\0" in cubin, f"entry {name} missing from the cubin"
        return cubin

    @property
    def n_entries(self):
        return sum(len(b.entries) for b in self.bodies)


def elementwise_variants(prim, dt, shapes=True):
    """(tag, operands) one-op kernels for an elementwise prim computing in dt; `shapes` adds the
    Vector/Matrix and one-cell variants (broadcasting does not depend on the dtype)."""
    arity = prims.ELEMENTWISE[prim][0]
    if prim.name == "select":
        yield "planes", [sample(np.bool_), sample(dt), sample(dt)]
        yield "mixed", [sample(np.bool_, (3,) if shapes else ()), sample(dt, (3,) if shapes else ()),
                        Literal(0.5 if dt.kind == "f" else 2)]
        return
    yield "planes", [sample(dt)] * arity
    if shapes:
        yield "vec3", [sample(dt, (3,))] * arity
    if arity == 2:
        yield "weak", [sample(dt), weak(F64 if dt.kind == "f" else np.dtype(np.int64))]
        yield "lit", [Literal(1.5 if dt.kind == "f" else 3), sample(dt, (2, 2) if shapes else ())]
        if shapes:
            yield "cell", [cell(dt, (3,)), sample(dt)]


def _valid(prim, operands):
    """Whether NumPy computes the op in these dtypes (no negative of a bool) without float16."""
    try:
        out = abstract_eval[prim](*[a.aval if isinstance(a, Literal) else a for a in operands])
    except Exception:
        return False
    return all(o.dtype != np.float16 for o in out)


# ---------------------------------------------------------------------------------------------
# coverage and golden checks (no NVRTC needed)

def test_every_primitive_has_a_cuda_rule():
    missing = [name for name, p in P.items() if p not in cuda.CUDA_RULES]
    assert not missing, f"primitives without a CUDA emission rule: {missing}"
    for p in prims.ELEMENTWISE:
        assert p in cuda.C_OPS and {"f32", "f64"} <= set(cuda.C_OPS[p]), p


def test_float32_uses_f_suffixed_math():
    for p, cols in cuda.C_OPS.items():
        f64_calls = re.findall(r"\b([a-z][a-z0-9]*)\(", cols["f64"])
        for fn in f64_calls:
            if fn.startswith("hawk_") or fn in ("isfinite", "isnan", "isinf"):
                continue
            assert f"{fn}f(" in cols["f32"], f"{p}: float64 calls {fn}(, float32 should call {fn}f("


@pytest.mark.parametrize("name,f32,f64", [("sin", "sinf(", "sin("), ("exp", "expf(", "exp("),
                                          ("rsqrt", "rsqrtf(", "rsqrt("), ("erfc", "erfcf(", "erfc("),
                                          ("atan2", "atan2f(", "atan2("), ("pow", "powf(", "pow(")])
def test_golden_math_names(name, f32, f64):
    p = P[name]
    arity = prims.ELEMENTWISE[p][0]
    s32 = cuda.emit_kernel(one_op(p, [sample(F32)] * arity), "k", [True], prelude=False)
    s64 = cuda.emit_kernel(one_op(p, [sample(F64)] * arity), "k", [True], prelude=False)
    assert f32 in s32 and "const float v0_0 = " in s32
    assert f64 in s64 and f32 not in s64 and "const double v0_0 = " in s64


def test_golden_layout_and_arguments():
    prog = one_op(P["mul"], [sample(F32, (3,)), weak()])
    src = cuda.emit_kernel(prog, "scale3", [True], prelude=False)
    assert 'extern "C" __global__ void scale3(const float* in0, double in1, float* out0, unsigned long long hawk_n)' in src
    assert "hawk_i < hawk_n; hawk_i += hawk_stride" in src                   # grid-stride loop
    assert "const float in0_2 = in0[2ull * hawk_n + hawk_i];" in src        # sample axis last
    assert "(in0_1 * ((float)(in1)))" in src                                 # weak double meets float32
    assert "out0[2ull * hawk_n + hawk_i] = v0_2;" in src
    # a literal takes the dtype it meets; a one-cell input is read at index c
    src = cuda.emit_kernel(one_op(P["add"], [cell(F32, (3,)), Literal(1.5)]), "k", [False], prelude=False)
    assert "const float in0_1 = in0[1];" in src and "(in0_1 + 1.5f)" in src and "out0[1] = v0_1;" in src
    assert "k_finish" in src and "hawk_stride" not in src


def test_golden_literals():
    assert cuda.c_literal(0.1, F32) == "0.10000000149011612f"
    assert cuda.c_literal(-2.0, F64) == "(-2.0)" and cuda.c_literal(-0.0, F32) == "(-0.0f)"
    assert cuda.c_literal(np.inf, F32) == "__uint_as_float(0x7f800000u)"
    assert cuda.c_literal(-np.inf, F64) == "__longlong_as_double(0xfff0000000000000ll)"
    assert cuda.c_literal(-2 ** 31, np.int32) == "(-2147483647 - 1)"
    assert cuda.c_literal(7, np.uint64) == "7ull" and cuda.c_literal(True, np.bool_) == "true"


def test_inplace_controls_restrict():
    prog = one_op(P["add"], [sample(F64), sample(F64)])
    plain = cuda.plan_kernel(prog, "k", [True])
    assert "__restrict__" not in plain.source          # aliasing unknown
    known = cuda.plan_kernel(prog, "k", [True], inplace={0: 0})
    sig = [p.ctype for p in known.params]
    assert sig[:3] == ["const double*", "const double* __restrict__", "double*"]


@hawk.kernel
def vec3(a: Vector[3], b: Vector[3], k: Param) -> Vector[3]:
    c = hm.cross(a, b)
    return c * hm.dot(a, b) / hm.norm(a) + k


@hawk.kernel
def mat2(a: Matrix[2, 2], b: Matrix[2, 2], v: Vector[2]) -> Vector[2]:
    m = hm.matmul(a, hm.transpose(b))
    return hm.matmul(m, v) + hm.trace(m)


@hawk.kernel
def center(x: Scalar, y: Mutable[Scalar]) -> Scalar:
    m = hawk.mean(x)
    y = y - m
    return hawk.max(y * 2.0)


def layout_for(kern, dtype, cells=()):
    """A Layout with planes of `dtype` (where the role allows), weak Params, one-cell `cells`."""
    out = []
    for k, (role, (kind, dt, shape, w)) in enumerate(zip(kern.roles, kern.default_layout())):
        if kind == SAMPLE and role.dtype is None:
            dt = np.dtype(dtype)
        if kern.param_names[k] in cells:
            kind = UNIFORM
        out.append((kind, dt, shape, w))
    return type(kern.default_layout())(out)


def test_below_plan():
    ek = cuda.emit_specialization(below.specialize(layout_for(below, F64, cells=("flag",))))
    assert ek.entry_names() == ["below_init", "below", "below_finish"]
    assert [p.role for p in ek.params] == ["in_plane", "in_value", "in_cell", "out_cell", "workspace", "n"]
    assert ek.workspace_bytes == 8 and ek.init_is_zero
    assert ek.reductions[0].acc_dtype == np.uint64 and ek.reductions[0].kind == "sum"
    assert "hawk_block_reduce<hawk_op_sum>" in ek.source and "hawk_atomic_sum(" in ek.source
    finish = ek.source.split("void below_finish(")[1]
    assert "((unsigned int)(v1_0))" in finish and "out0[0] = v2_0;" in finish
    # the flag as a plane: the reduced value is broadcast by a second pass
    ek = cuda.emit_specialization(below.specialize(below.default_layout()))
    assert ek.entry_names() == ["below_init", "below", "below_pass1"]
    assert "out0[hawk_i] = v2_0;" in ek.source.split("void below_pass1(")[1]


def test_two_pass_plan_and_inplace():
    ek = cuda.emit_specialization(center.specialize(center.default_layout()))
    assert ek.entry_names() == ["center_init", "center", "center_pass1", "center_finish"]
    assert not ek.init_is_zero and ek.workspace_bytes == 24     # the mean: a sum and its error cell; the max
    assert "__longlong_as_double(0xfff0000000000000ll)" in ek.source.split("void center_init(")[1]
    p1 = ek.source.split("void center_pass1(")[1].split("__global__")[0]
    assert "/ (double)hawk_n" in p1 and "out1[hawk_i] = v1_0;" in p1 and "hawk_atomic_max(" in p1
    # the Mutable y is read and written: neither gets __restrict__
    assert [p.ctype for p in ek.params][:4] == ["const double* __restrict__", "const double*",
                                                "double* __restrict__", "double*"]


def test_aliased_plane_is_written_in_the_last_pass_that_reads_it():
    # y = 2 * y (stage 0) while a later pass still reads y: the write waits for that pass
    x, y = Var(sample(F64)), Var(sample(F64))
    m, t, y2 = Var(cell(F64)), Var(sample(F64)), Var(sample(F64))
    prog = Program([x, y], [Eqn(P["mul"], [y, Literal(2.0)], [y2]), Eqn(P["sample_sum"], [x], [m]),
                            Eqn(P["sub"], [y, m], [t])], [t, y2])
    ek = cuda.plan_kernel(prog, "k", [True, True], inplace={1: 1})
    assert ek.entry_names() == ["k_init", "k", "k_pass1"]
    assert "out1[" not in ek.source.split("void k(")[1].split("__global__")[0]
    assert "out1[hawk_i]" in ek.source.split("void k_pass1(")[1]
    ek = cuda.plan_kernel(prog, "k", [True, True], inplace={})
    assert "out1[hawk_i]" in ek.source.split("void k(")[1].split("__global__")[0]


@pytest.mark.skipif("sample_count" not in P, reason="no sample_count primitive")
def test_sample_count_reads_n_only():
    # m = mean(x) by hand: sum(x) / count(x); the count needs no pass of its own
    x = Var(sample(F32))
    s, c, m, d = Var(cell(F32)), Var(weak()), Var(cell(F32)), Var(sample(F32))
    prog = Program([x], [Eqn(P["sample_sum"], [x], [s]), Eqn(P["sample_count"], [s], [c]),
                         Eqn(P["div"], [s, c], [m]), Eqn(P["sub"], [x, m], [d])], [m, d])
    ek = cuda.plan_kernel(prog, "k", [False, True])
    assert ek.entry_names() == ["k_init", "k", "k_pass1", "k_finish"]
    assert "const double v1_0 = ((double)hawk_n);" in ek.source
    count_only = one_op(P["sample_count"], [sample(F64, (3,))])
    src = cuda.emit_kernel(count_only, "k", [False], prelude=False)
    assert "in0[" not in src and "out0[0] = v0_0;" in src


def test_guard_source_golden():
    src = cuda.guard_source()
    assert 'extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);' in src
    for name in ("set_cond_from_cell", "set_cond_lt", "count_step"):
        assert f'extern "C" __global__ void {name}(cudaGraphConditionalHandle handle' in src
    assert "*cell != 0u" in src and "*counter < *trips" in src and "c < *trips" in src
    for name in cuda.GUARD_KERNELS:
        assert f'extern "C" __global__ void {name}(' in src


def test_import_needs_no_cuda_package():
    # (cuda-bindings' .pth file may create the bare `cuda` namespace at start-up; that is not an import)
    code = ("import sys, hawk_fx, hawk_fx.emit.cuda as c; c.plan_kernel; "
            "bad = [m for m in sys.modules if m.startswith(('cuda.', 'cupy', 'nvidia'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unsupported_dtype_is_named():
    with pytest.raises(NotImplementedError, match="float16"):
        cuda.emit_kernel(one_op(P["add"], [sample(np.float16), sample(np.float16)]), "k", [True])


# ---------------------------------------------------------------------------------------------
# NVRTC compile checks (sm_90)

@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_elementwise_compile(nvrtc, dt):
    b = Batch()
    for p in prims.ELEMENTWISE:
        for tag, ops in elementwise_variants(p, dt):
            b.add(one_op(p, ops), f"{p.name}_{tag}_{dt.name}")
    cubin = b.compile()
    assert b.n_entries >= 2 * len(prims.ELEMENTWISE)
    assert len(cubin) > 10000


def test_elementwise_int_bool_compile(nvrtc):
    b = Batch()
    for dt in INTS:
        for p in prims.ELEMENTWISE:
            for tag, ops in elementwise_variants(p, dt, shapes=False):
                if _valid(p, ops):
                    b.add(one_op(p, ops), f"{p.name}_{tag}_{dt.name}")
    b.compile()
    assert b.n_entries >= 150


def test_convert_compile(nvrtc):
    b = Batch()
    dts = FLOATS + INTS
    for src in dts:
        for dst in dts:
            b.add(one_op(prims.convert_p, [sample(src, (2,))], dtype=dst), f"cvt_{src.name}_{dst.name}")
    b.add(one_op(prims.convert_p, [weak()], dtype=F32), "cvt_weak")
    b.compile()


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_small_tensor_prims_compile(nvrtc, dt):
    b = Batch()
    b.add(one_op(prims.index_p, [sample(dt, (3,))], i=1), "index_vec")
    b.add(one_op(prims.index_p, [sample(dt, (2, 3))], i=-1), "index_mat")
    b.add(one_op(prims.stack_p, [sample(dt), weak(), Literal(2.0)]), "stack_mixed")
    b.add(one_op(prims.stack_p, [sample(dt, (2,)), cell(dt, (2,))]), "stack_rows")
    for spec, shapes in [("i,i->", [(3,), (3,)]), ("ij,j->i", [(2, 3), (3,)]), ("ij,jk->ik", [(2, 2), (2, 2)]),
                         ("j,jk->k", [(2,), (2, 3)]), ("ii->", [(3, 3)]), ("i,j->ij", [(3,), (2,)]),
                         ("ij->ji", [(2, 3)]), ("i->", [(4,)])]:
        b.add(one_op(prims.einsum_p, [sample(dt, s) for s in shapes], spec=spec), f"einsum_{spec}")
    b.add(one_op(prims.einsum_p, [sample(dt, (3,)), cell(dt, (3,))], spec="i,i->"), "einsum_cell")
    b.add(one_op(prims.cross_p, [sample(dt, (3,)), sample(dt, (3,))]), "cross")
    b.add(one_op(prims.cross_p, [sample(dt, (3,)), cell(dt, (3,))]), "cross_cell")
    b.add(one_op(prims.transpose_p, [sample(dt, (2, 3))]), "transpose")
    b.add(one_op(prims.broadcast_p, [cell(dt)], shape=(), kind=SAMPLE), "bcast_kind")
    b.add(one_op(prims.broadcast_p, [sample(dt)], shape=(3,), kind=SAMPLE), "bcast_shape")
    b.add(one_op(prims.broadcast_p, [weak()], shape=(2, 2), kind=SAMPLE), "bcast_weak")
    if "sample_count" in P:
        x, c, y = Var(sample(dt, (3,))), Var(weak()), Var(sample(dt, (3,)))
        b.add(Program([x], [Eqn(P["sample_count"], [x], [c]), Eqn(P["div"], [x, c], [y])], [y]), "count")
    b.compile()


@pytest.mark.parametrize("dt", FLOATS + INTS, ids=lambda d: d.name)
def test_reductions_compile(nvrtc, dt):
    b = Batch()
    for name in prims.REDUCTIONS:
        p = P[name]
        b.add(one_op(p, [sample(dt)]), f"{name}_scalar")
        b.add(one_op(p, [sample(dt, (3,))]), f"{name}_vec3")
        b.add(one_op(p, [cell(dt)]), f"{name}_uniform")
        # a reduction followed by a uniform op (finish kernel) and by a per-sample op (second pass)
        x = Var(sample(dt))
        r = Var(abstract_eval[p](x.aval)[0])
        u = Var(abstract_eval[P["mul"]](r.aval, Literal(2).aval)[0])
        xc = Var(sample(r.aval.dtype))
        d = Var(abstract_eval[P["add"]](xc.aval, r.aval)[0])
        prog = Program([x], [Eqn(p, [x], [r]), Eqn(P["mul"], [r, Literal(2)], [u]),
                             Eqn(prims.convert_p, [x], [xc], {"dtype": r.aval.dtype}), Eqn(P["add"], [xc, r], [d])],
                       [u, d])
        ek = b.add(prog, f"{name}_two_pass")
        assert [e.role for e in ek.entries] == ["init", "map", "map", "finish"]
    b.compile()


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_tour_kernels_compile(nvrtc, dt):
    b = Batch()
    specs = [below.specialize(layout_for(below, dt, cells=("flag",))), below.specialize(layout_for(below, dt)),
             vec3.specialize(layout_for(vec3, dt)), mat2.specialize(layout_for(mat2, dt)),
             center.specialize(layout_for(center, dt))]
    for k, spec in enumerate(specs):
        b.bodies.append(cuda.emit_specialization(spec, f"{spec.kernel.name}_{k}", prelude=False))
    b.compile()
    src = b.source()
    assert ("sqrtf(" in src) == (dt == F32)
    assert ("const float " in src) == (dt == F32)


def test_guard_kernels_compile(nvrtc):
    cubin = cuda.compile_cubin(cuda.guard_source(), arch="sm_90")
    for name in cuda.GUARD_KERNELS:
        assert b"\0" + name.encode() + b"\0" in cubin
    ptx = cuda.compile_ptx(cuda.guard_source(), arch="sm_90")
    assert sorted(cuda.ptx_entries(ptx)) == sorted(cuda.GUARD_KERNELS)
    assert ".extern .func cudaGraphSetConditional" in ptx
    # body kernels do not reference the conditional setter
    body = cuda.emit_kernel(below.ir, "below", [True], inplace={0: 2})
    bptx = cuda.compile_ptx(body)
    assert cuda.ptx_entries(bptx) == ["below_init", "below", "below_pass1"]
    assert "cudaGraphSetConditional" not in bptx and "atom.global.add.u64" in bptx
    # guards and a body in one module
    both = cuda.compile_cubin(cuda.guard_source() + body)
    assert b"\0count_step\0" in both and b"\0below_pass1\0" in both


def test_compile_cache_and_errors(nvrtc):
    src = cuda.emit_kernel(one_op(P["sin"], [sample(F32)]), "k_cache", [True])
    a = cuda.compile_cubin(src)
    assert cuda.compile_cubin(src) is a
    assert cuda.compile_cubin(src, arch="sm_80") is not a
    with pytest.raises(cuda.CudaCompileError, match="undefined"):
        cuda.compile_cubin('extern "C" __global__ void broken() { not_a_function(); }')


# ---------------------------------------------------------------------------------------------
# Values, without a GPU: the emitted C runs on the host under a small CUDA emulation (each block's
# threads are real threads; barriers stand in for __syncthreads and the warp shuffles; atomics
# take a lock), compiled by g++, and is compared with the NumPy backend on the same Program.
# This checks the emitter's logic (layout, broadcasting, casts, literals, the helpers' NumPy
# semantics, the passes of a reduction and its block reduce), not the GPU's own arithmetic.

EMU_HEADER = r"""
#include <cmath>
#include <math.h>
#include <cstring>
#include <cstdint>
#include <thread>
#include <barrier>
#include <mutex>
#include <vector>
#include <memory>
using std::isfinite; using std::isnan; using std::isinf;
struct hawk_dim3 { unsigned int x, y, z; };
static hawk_dim3 gridDim, blockDim, blockIdx;          // blocks run one after another
static thread_local hawk_dim3 threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static                                // the running block's shared memory
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
static inline long long __double_as_longlong(double f) { long long u; std::memcpy(&u, &f, 8); return u; }
static std::mutex emu_lock;
template <typename T> T atomicAdd(T* p, T v) { std::lock_guard<std::mutex> g(emu_lock); T o = *p; *p = T(o + v); return o; }
template <typename T> T atomicMax(T* p, T v) { std::lock_guard<std::mutex> g(emu_lock); T o = *p; *p = v > o ? v : o; return o; }
template <typename T> T atomicMin(T* p, T v) { std::lock_guard<std::mutex> g(emu_lock); T o = *p; *p = v < o ? v : o; return o; }
template <typename T> T atomicCAS(T* p, T c, T v) { std::lock_guard<std::mutex> g(emu_lock); T o = *p; if (o == c) *p = v; return o; }
struct emu_warp { std::unique_ptr<std::barrier<>> bar; uint64_t slot[32]; };
static std::vector<emu_warp>* emu_warps;
static std::barrier<>* emu_block_barrier;
static inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
template <typename T> T __shfl_down_sync(unsigned int, T v, int o) {
    const unsigned int lane = threadIdx.x & 31u;
    emu_warp& w = (*emu_warps)[threadIdx.x >> 5];
    std::memcpy(&w.slot[lane], &v, sizeof(T));
    w.bar->arrive_and_wait();
    T r = v;
    if (lane + o < 32u) std::memcpy(&r, &w.slot[lane + o], sizeof(T));
    w.bar->arrive_and_wait();
    return r;
}
static void emu_launch(unsigned int grid, unsigned int block, void (*body)(void**), void** args) {
    gridDim = {grid, 1, 1}; blockDim = {block, 1, 1};
    for (unsigned int b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        std::barrier<> bar((std::ptrdiff_t)block);
        std::vector<emu_warp> warps((block + 31) / 32);
        for (auto& w : warps) w.bar.reset(new std::barrier<>(32));
        emu_block_barrier = &bar; emu_warps = &warps;
        std::vector<std::thread> ts;
        for (unsigned int t = 0; t < block; ++t) ts.emplace_back([=] { threadIdx = {t, 0, 0}; body(args); });
        for (auto& t : ts) t.join();
    }
}
"""

_CT = {"bool": "c_bool", "int8": "c_int8", "int16": "c_int16", "int32": "c_int32", "int64": "c_int64",
       "uint8": "c_uint8", "uint16": "c_uint16", "uint32": "c_uint32", "uint64": "c_uint64",
       "float32": "c_float", "float64": "c_double"}
EMU_N, EMU_GRID, EMU_BLOCK = 250, 2, 64       # 128 threads, two warps a block: each takes about two samples


@pytest.fixture(scope="module")
def emu_dir(tmp_path_factory):
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("no g++ for the host emulation")
    return tmp_path_factory.mktemp("cuda_emu")


def emu_build(bodies, workdir):
    import ctypes
    src = [EMU_HEADER, cuda.PRELUDE]
    for b in bodies:
        src.append(b.source)
        for en in b.entries:
            args = ", ".join(f"*({p.ctype.replace('__restrict__', '')}*)a[{k}]" for k, p in enumerate(b.params))
            src.append(f'static void emu_body_{en.name}(void** a) {{ {en.name}({args}); }}\n'
                       f'extern "C" void emu_{en.name}(void** a, unsigned int grid, unsigned int block) '
                       f'{{ emu_launch(grid, block, emu_body_{en.name}, a); }}')
    cpp = workdir / f"emu{len(list(workdir.iterdir()))}.cpp"
    cpp.write_text("\n".join(src))
    so = cpp.with_suffix(".so")
    r = subprocess.run(["g++", "-std=c++20", "-O0", "-w", "-shared", "-fPIC", "-pthread", str(cpp), "-o", str(so)],
                       capture_output=True, text=True)
    if r.returncode:
        if "barrier" in r.stderr and "No such file" in r.stderr:
            pytest.skip("g++ without C++20 <barrier>")
        pytest.fail("the host emulation does not compile:\n" + r.stderr[:4000])
    return ctypes.CDLL(str(so))


def emu_run(lib, ek, ins, outs, n=EMU_N):
    """Run every entry of `ek` in order; ins/outs in the runtime layout (planes (*shape, n), cells
    (*shape, 1), weak inputs as Python numbers)."""
    import ctypes
    ws = np.zeros(max(ek.workspace_bytes, 8), np.uint8)
    keep, slots = [ws], []
    for p in ek.params:
        if p.role in ("in_plane", "in_cell", "out_plane", "out_cell"):
            a = (ins if p.role.startswith("in") else outs)[p.index]
            assert a.flags.c_contiguous and a.dtype == p.dtype, p
            v = ctypes.c_void_p(a.ctypes.data)
        elif p.role == "in_value":
            v = getattr(ctypes, _CT[p.dtype.name])(ins[p.index])
        elif p.role == "workspace":
            v = ctypes.c_void_p(ws.ctypes.data)
        else:
            v = ctypes.c_uint64(n)
        keep.append(v)
        slots.append(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p))
    argv = (ctypes.c_void_p * len(slots))(*slots)
    for en in ek.entries:
        g, b = (EMU_GRID, EMU_BLOCK) if en.launch == "grid" else (1, 1)
        getattr(lib, f"emu_{en.name}")(argv, ctypes.c_uint(g), ctypes.c_uint(b))


_DOMAIN = {"sqrt": (0.1, 4), "rsqrt": (0.1, 4), "log": (0.1, 4), "log2": (0.1, 4), "log10": (0.1, 4),
           "log1p": (0.1, 4), "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9),
           "acosh": (1.1, 4), "pow": (0.1, 3), "exp": (-3, 3), "cosh": (-3, 3), "sinh": (-3, 3)}


def emu_data(rng, aval, prim_name="", n=EMU_N):
    """An input in the runtime layout for aval."""
    dt = aval.dtype
    shape = aval.shape + ((n,) if aval.kind == SAMPLE else (1,))
    if dt == np.bool_:
        a = rng.random(shape) < 0.5
    elif dt.kind == "f":
        lo, hi = _DOMAIN.get(prim_name, (-3.0, 3.0))
        a = rng.uniform(lo, hi, shape)
        if prim_name in ("floor", "ceil", "round", "trunc", "floordiv", "mod", "fmod"):
            a = np.round(a * 4) / 4          # exact halves and integers: the edge cases
        if prim_name in ("isnan", "isinf", "isfinite", "max", "min", "sample_max", "sample_min", "sign"):
            flat = a.reshape(-1)
            flat[::7], flat[3::11] = np.nan, np.inf
            flat[5::13] = -np.inf
    else:
        lo, hi = (-20, 21) if dt.kind == "i" and not aval.weak else (0, 41)    # a Python int must fit a uint
        if prim_name == "pow":
            lo, hi = 0, 5                    # NumPy refuses negative integer powers
        a = rng.integers(lo, hi, shape)
    a = np.ascontiguousarray(a.astype(dt))
    if aval.kind == UNIFORM and aval.weak:
        return a.reshape(-1)[0].item()
    return a


def emu_check(lib, ek, prog, ins, rtol, inplace=None):
    """Run the emulated body and the NumPy backend on copies of `ins`; compare every output.
    Outputs listed in the body's inplace map write into their input's array, as a Mutable does."""
    from hawk_fx.emit.numpy import NumpyKernel
    osamp = [p.role == "out_plane" for p in ek.params if p.role.startswith("out")]
    inplace = inplace or {}

    def fresh():
        xs = [x.copy() if isinstance(x, np.ndarray) else x for x in ins]
        outs = []
        for j, a in enumerate(prog.outputs):
            if j in inplace:
                outs.append(xs[inplace[j]])
            else:
                shape = a.aval.shape + ((EMU_N,) if osamp[j] else (1,))
                outs.append(np.full(shape, 77, a.aval.dtype))
        return xs, outs

    xs, want = fresh()
    with np.errstate(all="ignore"):
        NumpyKernel(prog, osamp)(xs, want, EMU_N)
    xs, got = fresh()
    emu_run(lib, ek, xs, got)
    for j, (g, w) in enumerate(zip(got, want)):
        where = f"{ek.name} output {j}"
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(g, w, err_msg=where)


def _tolerance(dt):
    return 2e-5 if dt == F32 else 1e-12


@pytest.mark.parametrize("dt", FLOATS + INTS, ids=lambda d: d.name)
def test_emulated_values_match_numpy(emu_dir, dt):
    rng = np.random.default_rng(7)
    cases = []
    for p in prims.ELEMENTWISE:
        for tag, ops in elementwise_variants(p, dt, shapes=dt.kind == "f"):
            if _valid(p, ops):
                cases.append((f"{p.name}_{tag}", one_op(p, ops), p.name))
    for dst in FLOATS + INTS:
        cases.append((f"cvt_{dst.name}", one_op(prims.convert_p, [sample(dt, (2,))], dtype=dst), ""))
    for name in prims.REDUCTIONS:
        cases.append((f"{name}_vec3", one_op(P[name], [sample(dt, (3,))]), name))
        cases.append((f"{name}_uniform", one_op(P[name], [cell(dt)]), name))
        x = Var(sample(dt))
        r = Var(abstract_eval[P[name]](x.aval)[0])
        xc, d = Var(sample(r.aval.dtype)), Var(abstract_eval[P["add"]](sample(r.aval.dtype), r.aval)[0])
        cases.append((f"{name}_two_pass", Program([x], [Eqn(P[name], [x], [r]),
                                                        Eqn(prims.convert_p, [x], [xc], {"dtype": r.aval.dtype}),
                                                        Eqn(P["add"], [xc, r], [d])], [r, d]), name))
    if dt.kind == "f":
        cases += [("index", one_op(prims.index_p, [sample(dt, (2, 3))], i=-1), ""),
                  ("stack", one_op(prims.stack_p, [sample(dt), weak(), Literal(2.0)]), ""),
                  ("cross", one_op(prims.cross_p, [sample(dt, (3,)), cell(dt, (3,))]), ""),
                  ("transpose", one_op(prims.transpose_p, [sample(dt, (2, 3))]), ""),
                  ("bcast", one_op(prims.broadcast_p, [cell(dt, (2,))], shape=(3, 2), kind=SAMPLE), "")]
        for spec, shapes in [("i,i->", [(3,), (3,)]), ("ij,j->i", [(2, 3), (3,)]), ("ij,jk->ik", [(2, 2), (2, 3)]),
                             ("ii->", [(3, 3)]), ("i,j->ij", [(3,), (2,)]), ("ij->ji", [(2, 3)])]:
            cases.append((f"einsum_{spec}", one_op(prims.einsum_p, [sample(dt, s) for s in shapes], spec=spec), ""))
    bodies = []
    for k, (tag, prog, _) in enumerate(cases):
        name = re.sub(r"\W", "_", f"e{k}_{tag}")
        bodies.append(cuda.plan_kernel(prog, name, out_sample(prog), prelude=False, inplace={}))
    lib = emu_build(bodies, emu_dir)
    failures = []
    for (tag, prog, pname), ek in zip(cases, bodies):
        ins = [emu_data(rng, v.aval, pname) for v in prog.inputs]
        try:
            emu_check(lib, ek, prog, ins, _tolerance(dt))
        except Exception as exc:
            failures.append(f"{ek.name}: {type(exc).__name__}: {str(exc)[:600]}")
    assert not failures, f"{len(failures)} of {len(cases)} bodies differ from NumPy:\n" + "\n".join(failures)
    assert len(cases) > 80


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_emulated_tour_kernels(emu_dir, dt):
    rng = np.random.default_rng(3)
    specs = [below.specialize(layout_for(below, dt, cells=("flag",))), below.specialize(layout_for(below, dt)),
             vec3.specialize(layout_for(vec3, dt)), mat2.specialize(layout_for(mat2, dt)),
             center.specialize(layout_for(center, dt))]
    bodies = [cuda.emit_specialization(s, f"{s.kernel.name}_{k}", prelude=False) for k, s in enumerate(specs)]
    lib = emu_build(bodies, emu_dir)
    for spec, ek in zip(specs, bodies):
        ins = [emu_data(rng, v.aval) for v in spec.prog.inputs]
        inplace = {spec.n_results + m: k for m, k in enumerate(spec.commits)}
        emu_check(lib, ek, spec.prog, ins, _tolerance(dt), inplace=inplace)


GUARD_EMU = r"""
static unsigned long long emu_cond_handle = 0; static unsigned int emu_cond_value = 99;
extern "C" void cudaGraphSetConditional(unsigned long long h, unsigned int v) { emu_cond_handle = h; emu_cond_value = v; }
extern "C" unsigned int emu_cond(unsigned long long* h) { *h = emu_cond_handle; return emu_cond_value; }
extern "C" void emu_guard2(int which, unsigned long long h, unsigned int* a, unsigned int* b) {
    blockIdx = {0, 0, 0}; threadIdx = {0, 0, 0};
    if (which == 0) set_cond_from_cell(h, a);
    if (which == 1) set_cond_from_value(h, a);
    if (which == 2) set_cond_lt(h, a, b);
    if (which == 3) count_step(h, a, b);
    if (which == 4) count_start(h, a, b); }
extern "C" void emu_guard3(int which, unsigned long long h, unsigned int* a, unsigned int* b, unsigned int* c) {
    blockIdx = {0, 0, 0}; threadIdx = {0, 0, 0};
    if (which == 0) loop_start(h, a, b, c);
    if (which == 1) loop_step(h, a, b, c); }
"""


def test_emulated_guards(emu_dir):
    import ctypes
    cpp = emu_dir / "guards.cpp"
    cpp.write_text(EMU_HEADER + cuda.guard_source() + GUARD_EMU)
    so = emu_dir / "guards.so"
    r = subprocess.run(["g++", "-std=c++20", "-O0", "-w", "-shared", "-fPIC", "-pthread", str(cpp), "-o", str(so)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]
    lib = ctypes.CDLL(str(so))
    u32p = ctypes.POINTER(ctypes.c_uint32)

    def cells(*vals):
        return [None if v is None else np.array([v], np.uint32) for v in vals]

    def ptr(a):
        return None if a is None else a.ctypes.data_as(u32p)

    def cond():
        h = ctypes.c_ulonglong()
        v = lib.emu_cond(ctypes.byref(h))
        assert h.value == 0xABCDEF0123               # the handle it was given
        return v

    H = ctypes.c_ulonglong(0xABCDEF0123)
    for which, a, b, want in [(0, 0, None, 0), (0, 5, None, 1), (1, 2, None, 2), (1, 7, None, 7),
                              (2, 0, 0, 0), (2, 2, 3, 1), (2, 3, 3, 0)]:
        x, y = cells(a, b)
        lib.emu_guard2(which, H, ptr(x), ptr(y))
        assert cond() == want, (which, a, b)
    for trips, turns in [(0, 0), (1, 1), (5, 5)]:      # count_start, then count_step while it says go
        ctr, t = cells(123, trips)
        lib.emu_guard2(4, H, ptr(ctr), ptr(t))
        n = 0
        while cond():
            n += 1
            lib.emu_guard2(3, H, ptr(ctr), ptr(t))
        assert n == turns and ctr[0] == trips
    # loop_start/step: trips and/or a guard cell, either may be null
    for trips, cell_v, want_start in [(None, None, 1), (3, None, 1), (0, None, 0), (None, 0, 0), (2, 1, 1), (2, 0, 0)]:
        ctr, t, c = cells(9, trips, cell_v)
        lib.emu_guard3(0, H, ptr(ctr), ptr(t), ptr(c))
        assert cond() == want_start and ctr[0] == 0
    ctr, t, c = cells(0, 3, 1)
    lib.emu_guard3(1, H, ptr(ctr), ptr(t), ptr(c))
    assert cond() == 1 and ctr[0] == 1
    c[0] = 0
    lib.emu_guard3(1, H, ptr(ctr), ptr(t), ptr(c))
    assert cond() == 0 and ctr[0] == 2
    c[0] = 1
    lib.emu_guard3(1, H, ptr(ctr), ptr(t), ptr(c))
    assert cond() == 0 and ctr[0] == 3                   # the cap


@hawk.kernel
def _sum_plus(x: Scalar, w: Param) -> Scalar:
    return hawk.sum(x + w)


def test_the_cotangent_of_a_param_summed_with_every_sample_is_n_on_the_emulated_device(emu_dir):
    """d/dw sum_i (x_i + w) = n: the reduction's one cotangent is spread over the samples before
    it is summed back into the Param (a per-sample broadcast in the vjp body), on the C too."""
    from hawk_fx.diff import vjp_spec
    spec = _sum_plus.specialize(_sum_plus.layout_of([np.ones(EMU_N), np.ones(1)])[0])
    vs = vjp_spec(spec)
    ek = cuda.emit_specialization(vs, "sum_plus_vjp", prelude=False)
    lib = emu_build([ek], emu_dir)
    x, w, ct = np.random.default_rng(3).normal(size=EMU_N), np.array([0.3]), np.array([1.5])
    osamp = [p.role == "out_plane" for p in ek.params if p.role.startswith("out")]
    outs = [np.zeros(EMU_N) if o else np.zeros(1) for o in osamp]
    emu_run(lib, ek, [x, w, ct], outs)
    np.testing.assert_allclose(outs[0], np.full(EMU_N, 1.5), rtol=1e-15)     # d/dx_i: the cotangent
    np.testing.assert_allclose(outs[1], [1.5 * EMU_N], rtol=1e-12)          # d/dw: n times it
