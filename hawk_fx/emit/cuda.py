"""The CUDA C emitter: a kernel body Program becomes CUDA C source, compiled with NVRTC.

Nothing here needs a GPU, and importing this module needs no CUDA package: NVRTC (from the
`cuda-bindings` and `nvidia-cuda-nvrtc-cu12` wheels, the `cuda12` extra) is imported inside
`compile_cubin`/`compile_ptx` only.

Runtime layout (the same as the NumPy backend's, sample axis last)
    * a per-sample input or output is a plane: component `c` (the flat index into the per-sample
      shape, C order) of sample `i` lies at `ptr[c * n + i]`;
    * a uniform input is a one-cell pointer (`(*shape, 1)` arrays: component `c` at `ptr[c]`), or,
      for weak (Python-number) Params and the inputs named in `by_value`, a scalar argument of the
      Var's dtype (a Python float arrives as a `double`, the way cuda.core passes it; pass Python
      ints as `np.int64` and bools as `np.bool_`, since cuda.core reads a Python int as a pointer);
    * a one-cell output (out_sample False) is written at `ptr[c]`.

One thread per sample: every map kernel is a grid-stride loop over `n`. Values that do not depend
on the samples (Params, constants, reduced values) are computed once per thread before the loop.
Vector/Matrix values live in registers, one C scalar per component; index, transpose and broadcast
only relabel components, and einsum/cross are unrolled into sums of products at emission time.

The elementwise op -> C mapping is the data table `C_OPS` (primitive -> dtype class -> template),
float32 using the `f`-suffixed math functions. Helpers that need a few statements (NumPy's
floor-division and remainder, NaN-propagating min/max, integer powers, the block reduction and the
float atomics) are in `PRELUDE`, which every emitted source starts with (guarded, so sources can be
concatenated into one translation unit).

Sample reductions, and what a body with one becomes
    The body is cut into *stages*: a value's stage is the number of sample reductions on its
    longest path from the inputs. A reduction of a stage-s per-sample value is accumulated in map
    kernel `s`: each thread folds its samples into a register, the block folds its threads (warp
    shuffles, then one shared-memory round), and thread 0 of each block does one atomic into a
    workspace cell. Stage s+1 reads that cell; `sample_mean` keeps the sum and divides by `n` where
    it is read. A per-sample value needed again in a later stage is recomputed there from the
    inputs, not stored. So the entries of one body, in launch order, are:

      `<name>_init`    1 thread: writes each workspace accumulator's identity (0, -inf, +inf, the
                       integer limits). Emitted when the body has a reduction. The lowering launches
                       it (or, when `EmittedKernel.init_is_zero`, memsets the workspace to zero
                       instead) before the first map kernel of every run.
      `<name>`         map kernel of stage 0 (grid-stride over n), when there is per-sample work;
      `<name>_pass<s>` map kernel of stage s >= 1: a body that uses a reduced value per sample
                       (`x - hawk.mean(x)`) needs a second pass over the samples;
      `<name>_finish`  1 thread: computes and writes every one-cell output. A reduction followed by
                       further uniform ops (`hm.uint32(hawk.sum(s < lim))`) ends here, so the
                       uniform tail runs once, after every block's atomic has landed (the kernel
                       boundary is the grid-wide barrier). One-cell outputs of bodies without a
                       reduction are written here too: a one-cell Mutable may be the very cell
                       the map kernel's threads read, and only a later kernel may overwrite it.

    Every entry takes the same argument list (`EmittedKernel.params`): inputs, outputs, the
    workspace (when there is one), n. Launch the map kernels with a block size that is a multiple of
    32 (at most 1024; `BLOCK` is a good default) and any grid size; `_init` and `_finish` with one
    block of one thread (extra threads return at once). The workspace is `workspace_bytes` bytes of
    device memory owned by the caller (8-byte aligned); it must not be shared between two bodies
    in flight at once.

    `sample_count` is `n` (as a double), read from the argument wherever it is needed.

    A reduction of a *uniform* value treats it as one sample, as the NumPy backend does
    (sum/max/min/mean of a Param is the Param, converted to the result dtype). Over zero samples a
    reduction gives its identity (sum 0, max -inf or the integer minimum, ...; mean NaN). A float
    sum is compensated: each thread keeps a (sum, error) pair, blocks combine pairs with two_sum,
    and each block's atomic add learns the rounding error of the addition it made (from the old
    value) and adds it to an error cell; readers take sum + error. The atomics' order varies from
    run to run, so the last bit may too; the error is Neumaier's, u|sum| + O(n^2 u^2) sum|x|.
    max/min propagate NaN, as NumPy's do.

Aliasing: a Mutable plane is both an input and an output. Pass `inplace={output: input}` (as
`emit_specialization` does from the Specialization's commits); inputs and outputs not listed get
`__restrict__`. With `inplace=None` (unknown) no pointer is restrict, and any output plane that
could be an input plane (same dtype and shape) is written only in the last stage that reads it.

Guard kernels for the graph lowering (`guard_source()`), each run as one thread:
    `set_cond_from_cell(handle, const unsigned int* cell)`    condition = (*cell != 0)  if/else, while
    `set_cond_from_value(handle, const unsigned int* cell)`   condition = *cell         switch
    `set_cond_lt(handle, const unsigned int* counter, const unsigned int* trips)`  *counter < *trips
    `count_step(handle, unsigned int* counter, const unsigned int* trips)`  ++*counter; < *trips
    `count_start(handle, unsigned int* counter, const unsigned int* trips)` *counter = 0; 0 < *trips
    `loop_start(handle, counter, trips, cell)`   *counter = 0; (0 < *trips) && (*cell != 0)
    `loop_step(handle, counter, trips, cell)`    ++*counter; (*counter < *trips) && (*cell != 0)
        a loop with both a trip count and a guard cell (a capped or counted loop with a break);
        `trips` or `cell` may be null: no cap, or no guard cell
`handle` is a `cudaGraphConditionalHandle` (a 64-bit unsigned). NVRTC's built-in runtime header
declares the handle type but not `cudaGraphSetConditional`, so the guard prelude declares it
`extern "C"` itself (the driver resolves it when the module loads; no -rdc, no cudadevrt).

Integer arithmetic wraps as the GPU's does (NumPy also wraps, with a warning); integer division and
remainder by zero give 0; a negative integer power gives C's truncation of 1/a^|b| (NumPy raises).
float16 and complex values are not supported.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass

import numpy as np

from .. import prims
from ..caches import LRU
from ..core import SAMPLE, UNIFORM, Literal, Program, Var

P = prims.P
BLOCK = 256          # a good block size for the map kernels (any multiple of 32 up to 1024 works)

# ---------------------------------------------------------------------------------------------
# C types

_CTYPE = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
    "uint64": "unsigned long long", "float32": "float", "float64": "double",
}


def ctype(dtype) -> str:
    """The C type of a NumPy dtype."""
    dt = np.dtype(dtype)
    try:
        return _CTYPE[dt.name]
    except KeyError:
        raise NotImplementedError(f"hawk CUDA emitter: dtype {dt.name} is not supported (use float32, float64, "
                                  "a 8-64 bit integer or bool)") from None


def dtype_class(dtype) -> str:
    """The column of C_OPS that a computation in `dtype` uses: f32, f64, int or bool."""
    dt = np.dtype(dtype)
    ctype(dt)
    if dt == np.float32:
        return "f32"
    if dt == np.float64:
        return "f64"
    return "bool" if dt == np.bool_ else "int"


# ---------------------------------------------------------------------------------------------
# The op table: primitive -> {dtype class -> C expression template}. `{0}`, `{1}`, `{2}` are the
# operands, already converted to the computation dtype; `{T}` is that dtype's C type. A missing
# class means NumPy never computes the op in that dtype (sqrt of an int computes in float64).

def _same(tpl, *classes):
    return {c: tpl for c in classes}


_ALL = ("f32", "f64", "int", "bool")
_NUM = ("f32", "f64", "int")


def _math(fname, arity=1):
    args = ", ".join("{%d}" % k for k in range(arity))
    return {"f32": f"{fname}f({args})", "f64": f"{fname}({args})"}


_C_OPS_BY_NAME = {
    "neg": _same("(-{0})", *_NUM),
    "abs": {"f32": "fabsf({0})", "f64": "fabs({0})", "int": "hawk_iabs({0})", "bool": "{0}"},
    "sign": _same("hawk_sign({0})", *_NUM),
    "floor": {"f32": "floorf({0})", "f64": "floor({0})", "int": "{0}", "bool": "{0}"},
    "ceil": {"f32": "ceilf({0})", "f64": "ceil({0})", "int": "{0}", "bool": "{0}"},
    "round": {"f32": "rintf({0})", "f64": "rint({0})", "int": "{0}", "bool": "{0}"},   # half to even
    "trunc": {"f32": "truncf({0})", "f64": "trunc({0})", "int": "{0}", "bool": "{0}"},
    "sqrt": _math("sqrt"), "rsqrt": {"f32": "rsqrtf({0})", "f64": "rsqrt({0})"}, "cbrt": _math("cbrt"),
    "exp": _math("exp"), "exp2": _math("exp2"), "expm1": _math("expm1"),
    "log": _math("log"), "log2": _math("log2"), "log10": _math("log10"), "log1p": _math("log1p"),
    "sin": _math("sin"), "cos": _math("cos"), "tan": _math("tan"),
    "asin": _math("asin"), "acos": _math("acos"), "atan": _math("atan"),
    "sinh": _math("sinh"), "cosh": _math("cosh"), "tanh": _math("tanh"),
    "asinh": _math("asinh"), "acosh": _math("acosh"), "atanh": _math("atanh"),
    "erf": _math("erf"), "erfc": _math("erfc"),
    "isfinite": {"f32": "isfinite({0})", "f64": "isfinite({0})", "int": "true", "bool": "true"},
    "isnan": {"f32": "isnan({0})", "f64": "isnan({0})", "int": "false", "bool": "false"},
    "isinf": {"f32": "isinf({0})", "f64": "isinf({0})", "int": "false", "bool": "false"},
    "not": _same("(!{0})", *_ALL),
    "add": {**_same("({0} + {1})", *_NUM), "bool": "({0} || {1})"},
    "sub": _same("({0} - {1})", *_NUM),
    "mul": {**_same("({0} * {1})", *_NUM), "bool": "({0} && {1})"},
    "div": _same("({0} / {1})", "f32", "f64"),
    "floordiv": {"f32": "hawk_floordiv({0}, {1})", "f64": "hawk_floordiv({0}, {1})",
                 "int": "hawk_ifloordiv({0}, {1})"},
    "mod": {"f32": "hawk_mod({0}, {1})", "f64": "hawk_mod({0}, {1})", "int": "hawk_imod({0}, {1})"},
    "pow": {"f32": "powf({0}, {1})", "f64": "pow({0}, {1})", "int": "hawk_ipow({0}, {1})"},
    "atan2": _math("atan2", 2), "hypot": _math("hypot", 2),
    "fmod": {"f32": "fmodf({0}, {1})", "f64": "fmod({0}, {1})", "int": "hawk_ifmod({0}, {1})"},
    "min": {**_same("hawk_min({0}, {1})", *_NUM), "bool": "({0} && {1})"},     # NaN-propagating
    "max": {**_same("hawk_max({0}, {1})", *_NUM), "bool": "({0} || {1})"},
    "lt": _same("({0} < {1})", *_ALL), "le": _same("({0} <= {1})", *_ALL),
    "gt": _same("({0} > {1})", *_ALL), "ge": _same("({0} >= {1})", *_ALL),
    "eq": _same("({0} == {1})", *_ALL), "ne": _same("({0} != {1})", *_ALL),
    "and": _same("({0} && {1})", *_ALL), "or": _same("({0} || {1})", *_ALL),
    "select": _same("({0} ? {1} : {2})", *_ALL),
    "logistic": {"f32": "(1.0f / (1.0f + expf(-{0})))", "f64": "(1.0 / (1.0 + exp(-{0})))"},
    "logaddexp": _same("hawk_logaddexp({0}, {1})", "f32", "f64"),
    "xlogy": {"f32": "({0} == 0.0f ? 0.0f : {0} * logf({1}))", "f64": "({0} == 0.0 ? 0.0 : {0} * log({1}))"},
    "xlog1py": {"f32": "({0} == 0.0f ? 0.0f : {0} * log1pf({1}))", "f64": "({0} == 0.0 ? 0.0 : {0} * log1p({1}))"},
    "stop_gradient": _same("{0}", *_ALL),
    "copysign": _math("copysign", 2),
    "spacing": {"f32": "(nextafterf({0}, copysignf(__uint_as_float(0x7f800000u), {0})) - {0})",
                "f64": "(nextafter({0}, copysign(__longlong_as_double(0x7ff0000000000000ll), {0})) - {0})"},
}

C_OPS: dict = {P[name]: cols for name, cols in _C_OPS_BY_NAME.items()}

_COMPARE = {"lt", "le", "gt", "ge", "eq", "ne"}
_LOGICAL = {"not", "and", "or"}
_PREDICATE = {"isfinite", "isnan", "isinf"}

# sample reductions: accumulator fold, block-reduce op, atomic
_RED_KIND = {"sample_sum": "sum", "sample_mean": "sum", "sample_max": "max", "sample_min": "min"}

PRELUDE = r"""#ifndef HAWK_PRELUDE
#define HAWK_PRELUDE
// hawk_fx CUDA prelude: helpers for the emitted kernel bodies.
template <typename T> __device__ __forceinline__ T hawk_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T hawk_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T hawk_sign(T x) {
    return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }       // keeps NaN and signed zero
template <typename T> __device__ __forceinline__ bool hawk_signed() { return T(-1) < T(0); }
template <typename T> __device__ __forceinline__ T hawk_logaddexp(T a, T b) {      // numpy.logaddexp
    if (a == b) return a + T(0.6931471805599453);                                  // also +-inf
    T m = a > b ? a : b;
    return m + log1p(exp(-fabs(a - b))); }
template <typename T> __device__ __forceinline__ T hawk_iabs(T x) {
    return (hawk_signed<T>() && x < T(0)) ? T(-x) : x; }
template <typename T> __device__ __forceinline__ T hawk_ifloordiv(T a, T b) {   // Python's a // b
    if (b == T(0)) return T(0);
    T q = T(a / b);
    if (hawk_signed<T>() && T(a % b) != T(0) && ((a < T(0)) != (b < T(0)))) q = T(q - T(1));
    return q; }
template <typename T> __device__ __forceinline__ T hawk_imod(T a, T b) {        // Python's a % b
    if (b == T(0)) return T(0);
    T r = T(a % b);
    if (hawk_signed<T>() && r != T(0) && ((r < T(0)) != (b < T(0)))) r = T(r + b);
    return r; }
template <typename T> __device__ __forceinline__ T hawk_ifmod(T a, T b) { return b == T(0) ? T(0) : T(a % b); }
template <typename T> __device__ __forceinline__ T hawk_ipow(T a, T b) {
    if (hawk_signed<T>() && b < T(0))
        return a == T(1) ? T(1) : (a == T(-1) ? ((b & T(1)) ? T(-1) : T(1)) : T(0));
    T r = T(1);
    while (b != T(0)) { if (b & T(1)) r = T(r * a); a = T(a * a); b = T(b >> 1); }
    return r; }
// NumPy's float remainder and floor division (the sign of the divisor; exact at the edges)
__device__ __forceinline__ float hawk_mod(float a, float b) {
    float m = fmodf(a, b);
    if (b == 0.0f) return m;
    if (m != 0.0f) { if ((b < 0.0f) != (m < 0.0f)) m += b; } else m = copysignf(0.0f, b);
    return m; }
__device__ __forceinline__ double hawk_mod(double a, double b) {
    double m = fmod(a, b);
    if (b == 0.0) return m;
    if (m != 0.0) { if ((b < 0.0) != (m < 0.0)) m += b; } else m = copysign(0.0, b);
    return m; }
__device__ __forceinline__ float hawk_floordiv(float a, float b) {
    if (b == 0.0f) return a / b;
    float m = fmodf(a, b), d = (a - m) / b, f;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
    if (d != 0.0f) { f = floorf(d); if (d - f > 0.5f) f += 1.0f; } else f = copysignf(0.0f, a / b);
    return f; }
__device__ __forceinline__ double hawk_floordiv(double a, double b) {
    if (b == 0.0) return a / b;
    double m = fmod(a, b), d = (a - m) / b, f;
    if (m != 0.0 && ((b < 0.0) != (m < 0.0))) d -= 1.0;
    if (d != 0.0) { f = floor(d); if (d - f > 0.5) f += 1.0; } else f = copysign(0.0, a / b);
    return f; }
// block reduction: warp shuffles, one shared-memory round; the result is valid in thread 0.
// blockDim.x must be a multiple of 32 (at most 1024).
struct hawk_op_sum { template <typename T> __device__ static T f(T a, T b) { return a + b; } };
struct hawk_op_max { template <typename T> __device__ static T f(T a, T b) { return hawk_max(a, b); } };
struct hawk_op_min { template <typename T> __device__ static T f(T a, T b) { return hawk_min(a, b); } };
template <typename Op, typename T> __device__ __forceinline__ T hawk_block_reduce(T v, T identity) {
    __shared__ T part[32];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = Op::f(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();                       // part[] may still be read by the previous reduction
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < ((blockDim.x + 31u) >> 5) ? part[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = Op::f(v, __shfl_down_sync(0xffffffffu, v, o));
    }
    return v; }
// one atomic per block into a workspace cell
__device__ __forceinline__ void hawk_atomic_sum(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void hawk_atomic_sum(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void hawk_atomic_sum(int* p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void hawk_atomic_sum(unsigned int* p, unsigned int v) { atomicAdd(p, v); }
__device__ __forceinline__ void hawk_atomic_sum(unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
__device__ __forceinline__ void hawk_atomic_max(int* p, int v) { atomicMax(p, v); }
__device__ __forceinline__ void hawk_atomic_max(unsigned int* p, unsigned int v) { atomicMax(p, v); }
__device__ __forceinline__ void hawk_atomic_max(long long* p, long long v) { atomicMax(p, v); }
__device__ __forceinline__ void hawk_atomic_max(unsigned long long* p, unsigned long long v) { atomicMax(p, v); }
__device__ __forceinline__ void hawk_atomic_min(int* p, int v) { atomicMin(p, v); }
__device__ __forceinline__ void hawk_atomic_min(unsigned int* p, unsigned int v) { atomicMin(p, v); }
__device__ __forceinline__ void hawk_atomic_min(long long* p, long long v) { atomicMin(p, v); }
__device__ __forceinline__ void hawk_atomic_min(unsigned long long* p, unsigned long long v) { atomicMin(p, v); }
template <typename Op> __device__ __forceinline__ void hawk_atomic_fold(float* p, float v) {
    unsigned int* a = (unsigned int*)p;
    unsigned int old = *a, assumed;
    do {
        assumed = old;
        const unsigned int next = __float_as_uint(Op::f(__uint_as_float(assumed), v));
        if (next == assumed) break;
        old = atomicCAS(a, assumed, next);
    } while (old != assumed); }
template <typename Op> __device__ __forceinline__ void hawk_atomic_fold(double* p, double v) {
    unsigned long long* a = (unsigned long long*)p;
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        const unsigned long long next =
            (unsigned long long)__double_as_longlong(Op::f(__longlong_as_double((long long)assumed), v));
        if (next == assumed) break;
        old = atomicCAS(a, assumed, next);
    } while (old != assumed); }
__device__ __forceinline__ void hawk_atomic_max(float* p, float v) { hawk_atomic_fold<hawk_op_max>(p, v); }
__device__ __forceinline__ void hawk_atomic_max(double* p, double v) { hawk_atomic_fold<hawk_op_max>(p, v); }
__device__ __forceinline__ void hawk_atomic_min(float* p, float v) { hawk_atomic_fold<hawk_op_min>(p, v); }
__device__ __forceinline__ void hawk_atomic_min(double* p, double v) { hawk_atomic_fold<hawk_op_min>(p, v); }
// compensated float sums: a (sum, error) pair; two_sum gives each addition's rounding error exactly
template <typename T> __device__ __forceinline__ void hawk_two_sum(T& s, T& e, const T a, const T b) {
    s = a + b; const T z = s - a; e = (a - (s - z)) + (b - z); }
template <typename T> __device__ __forceinline__ void hawk_sum2_add(T& s, T& c, const T x) {
    T e; hawk_two_sum(s, e, s, x); c += e; }
template <typename T> __device__ __forceinline__ void hawk_sum2_shfl(T& s, T& c) {
    for (int o = 16; o > 0; o >>= 1) {
        const T so = __shfl_down_sync(0xffffffffu, s, o), co = __shfl_down_sync(0xffffffffu, c, o);
        hawk_sum2_add(s, c, so); c += co; } }
template <typename T> __device__ __forceinline__ void hawk_block_sum2(T& s, T& c) {   // valid in thread 0
    __shared__ T part[2][32];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    hawk_sum2_shfl(s, c);
    __syncthreads();
    if (lane == 0) { part[0][warp] = s; part[1][warp] = c; }
    __syncthreads();
    if (warp == 0) {
        const bool live = lane < ((blockDim.x + 31u) >> 5);
        s = live ? part[0][lane] : T(0); c = live ? part[1][lane] : T(0);
        hawk_sum2_shfl(s, c);
    } }
// the cell takes fl(old + s); that rounding error, known from old, goes to the error cell with c
template <typename T> __device__ __forceinline__ void hawk_atomic_sum2(T* sum, T* err, const T s, const T c) {
    const T old = atomicAdd(sum, s);
    T t, e; hawk_two_sum(t, e, old, s);
    atomicAdd(err, c + e); }
// Threefry-2x32 with 20 rounds (Random123; hawk_fx.random): key (k0, k1), counter (x0, x1)
__device__ __forceinline__ unsigned int hawk_rotl32(unsigned int v, unsigned int r) {
    return (v << r) | (v >> (32u - r)); }
struct hawk_u32x2 { unsigned int x, y; };
__device__ __forceinline__ hawk_u32x2 hawk_threefry2x32(unsigned int k0, unsigned int k1, unsigned int x0,
                                                        unsigned int x1) {
    const unsigned int ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
    const unsigned int rot[8] = {13u, 15u, 26u, 6u, 17u, 29u, 16u, 24u};
    x0 += k0; x1 += k1;
#pragma unroll
    for (int g = 0; g < 5; ++g) {
#pragma unroll
        for (int r = 0; r < 4; ++r) { x0 += x1; x1 = hawk_rotl32(x1, rot[4 * (g & 1) + r]); x1 ^= x0; }
        x0 += ks[(g + 1) % 3]; x1 += ks[(g + 2) % 3] + (unsigned int)(g + 1); }
    return hawk_u32x2{x0, x1}; }
#endif  // HAWK_PRELUDE
"""

GUARD_PRELUDE = r"""#ifndef HAWK_GUARD_PRELUDE
#define HAWK_GUARD_PRELUDE
// NVRTC knows the handle type but does not declare the setter; C linkage lets the driver resolve it.
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
#endif  // HAWK_GUARD_PRELUDE
"""

_GUARDS = r"""
extern "C" __global__ void set_cond_from_cell(cudaGraphConditionalHandle handle, const unsigned int* cell) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, *cell != 0u ? 1u : 0u); }
extern "C" __global__ void set_cond_from_value(cudaGraphConditionalHandle handle, const unsigned int* cell) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, *cell); }
extern "C" __global__ void set_cond_lt(cudaGraphConditionalHandle handle, const unsigned int* counter,
                                       const unsigned int* trips) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, *counter < *trips ? 1u : 0u); }
extern "C" __global__ void count_step(cudaGraphConditionalHandle handle, unsigned int* counter,
                                      const unsigned int* trips) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned int c = *counter + 1u;
        *counter = c;
        cudaGraphSetConditional(handle, c < *trips ? 1u : 0u); } }
extern "C" __global__ void count_start(cudaGraphConditionalHandle handle, unsigned int* counter,
                                       const unsigned int* trips) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *counter = 0u;
        cudaGraphSetConditional(handle, 0u < *trips ? 1u : 0u); } }
extern "C" __global__ void loop_start(cudaGraphConditionalHandle handle, unsigned int* counter,
                                      const unsigned int* trips, const unsigned int* cell) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    *counter = 0u;
    const bool go = (trips == nullptr || 0u < *trips) && (cell == nullptr || *cell != 0u);
    cudaGraphSetConditional(handle, go ? 1u : 0u); }
extern "C" __global__ void loop_step(cudaGraphConditionalHandle handle, unsigned int* counter,
                                     const unsigned int* trips, const unsigned int* cell) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned int c = *counter + 1u;
    *counter = c;
    const bool go = (trips == nullptr || c < *trips) && (cell == nullptr || *cell != 0u);
    cudaGraphSetConditional(handle, go ? 1u : 0u); }
"""

GUARD_KERNELS = ("set_cond_from_cell", "set_cond_from_value", "set_cond_lt", "count_step", "count_start",
                 "loop_start", "loop_step")


def guard_source() -> str:
    """CUDA C source of the guard kernels (GUARD_KERNELS) that set graph-conditional handles."""
    return GUARD_PRELUDE + _GUARDS


# ---------------------------------------------------------------------------------------------
# literals

def c_literal(value, dtype) -> str:
    """A C literal of `value` converted to `dtype` (NumPy's conversion), parenthesised if negative."""
    dt = np.dtype(dtype)
    with np.errstate(all="ignore"):
        v = np.asarray(value).astype(dt).item()
    if dt == np.bool_:
        return "true" if v else "false"
    if dt.kind == "f":
        if not np.isfinite(v):
            if dt == np.float32:
                return f"__uint_as_float({int(np.asarray(v, np.float32).view(np.uint32)):#010x}u)"
            return f"__longlong_as_double({int(np.asarray(v, np.float64).view(np.uint64)):#018x}ll)"
        text = repr(float(v)) + ("f" if dt == np.float32 else "")
        return f"({text})" if np.signbit(v) else text
    info = np.iinfo(dt)
    if dt.itemsize < 4:
        return f"(({ctype(dt)}){v})"
    suffix = {("i", 4): "", ("i", 8): "ll", ("u", 4): "u", ("u", 8): "ull"}[(dt.kind, dt.itemsize)]
    if v == info.min and dt.kind == "i":
        return f"({v + 1}{suffix} - 1{suffix})"
    return f"{v}{suffix}" if v >= 0 else f"({v}{suffix})"


def _identity(kind: str, acc_dtype) -> str:
    dt = np.dtype(acc_dtype)
    if kind == "sum":
        return c_literal(0, dt)
    if dt.kind == "f":
        return c_literal(-np.inf if kind == "max" else np.inf, dt)
    info = np.iinfo(dt)
    return c_literal(info.min if kind == "max" else info.max, dt)


def _acc_dtype(kind: str, out_dtype) -> np.dtype:
    """The workspace accumulator's dtype for a reduction with result dtype `out_dtype`."""
    dt = np.dtype(out_dtype)
    if dt.kind == "f":
        ctype(dt)
        return dt
    if kind == "sum":
        return np.dtype(np.uint64) if dt.itemsize == 8 else np.dtype(np.int32 if dt.kind == "i" else np.uint32)
    if dt == np.bool_:
        return np.dtype(np.uint32)
    if dt.itemsize == 8:
        return dt
    return np.dtype(np.int32 if dt.kind == "i" else np.uint32)


# ---------------------------------------------------------------------------------------------
# values: one C expression per component (flat, C order), all of one dtype

class _Val:
    __slots__ = ("comps", "dtype", "shape", "lits")

    def __init__(self, comps, dtype, shape, lits=None):
        self.comps = list(comps)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.lits = lits          # the Python values of a literal's components, else None

    def take(self, flat_idx, shape) -> "_Val":
        idx = list(np.asarray(flat_idx, dtype=np.int64).ravel())
        return _Val([self.comps[k] for k in idx], self.dtype, shape,
                    None if self.lits is None else [self.lits[k] for k in idx])

    def broadcast(self, shape) -> "_Val":
        shape = tuple(shape)
        if shape == self.shape:
            return self
        idx = np.broadcast_to(np.arange(int(np.prod(self.shape, dtype=np.int64))).reshape(self.shape), shape)
        return self.take(idx, shape)

    def cast(self, dtype) -> list[str]:
        dt = np.dtype(dtype)
        if self.lits is not None:
            if dt.kind in "iu" and self.dtype.kind in "iu":
                info = np.iinfo(dt)
                for v in self.lits:
                    if not info.min <= int(v) <= info.max:     # as NumPy refuses it
                        raise OverflowError(f"hawk CUDA emitter: Python integer {v} out of bounds for {dt.name}")
            return [c_literal(v, dt) for v in self.lits]
        if dt == self.dtype:
            return list(self.comps)
        return [f"(({ctype(dt)})({c}))" for c in self.comps]


def _literal_val(lit: Literal) -> _Val:
    arr = np.asarray(lit.value)
    dt = lit.aval.dtype
    vals = [x.item() if isinstance(x, np.generic) else x for x in arr.ravel()]
    return _Val([c_literal(v, dt) for v in vals], dt, arr.shape, vals)


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# per-primitive emission: fn(emitter, eqn, [input _Val]) -> list of component expressions of the
# output (its dtype is the output Var's), or a _Val for pure relabelings (no code).

CUDA_RULES: dict = {}
# prims emitted as C statements (a loop, hawk_fx/loops.py): fn(emitter, eqn, [input _Val]) ->
# (lines, a _Val per output); each also has an entry in CUDA_RULES, which the checks look up
STATEMENT_RULES: dict = {}


def _operand_dtype(e) -> list[np.dtype]:
    """The dtype each operand is converted to before an elementwise op is applied."""
    name = e.prim.name
    out = e.outputs[0].aval.dtype
    if name in _LOGICAL:
        return [np.dtype(np.bool_)] * len(e.inputs)
    if name in _PREDICATE:
        return [e.inputs[0].aval.dtype]
    if name in _COMPARE:
        sig = tuple((a.aval.dtype, a.aval.weak) for a in e.inputs)
        dt = prims._elementwise_dtype("add", sig)
        if dt.kind in "iu":
            # NumPy compares an integer plane with any Python int exactly (x_u32 < -1 is False), so a
            # weak int that may not fit the plane's dtype is compared in a wider one
            weak = [a for a in e.inputs if a.aval.weak and a.aval.dtype.kind in "iu"]
            info = np.iinfo(dt)
            wide = any(isinstance(a, Var) or not info.min <= int(a.value) <= info.max for a in weak)
            if wide:
                fits64 = all(isinstance(a, Var) or -2 ** 63 <= int(a.value) < 2 ** 63 for a in weak)
                dt = np.dtype(np.int64) if dt.itemsize < 8 and fits64 else (
                    dt if all(isinstance(a, Var) for a in weak) else np.dtype(np.float64))
        return [dt] * 2
    if name == "select":
        return [np.dtype(np.bool_), out, out]
    return [out] * len(e.inputs)


def _elementwise_rule(em, e, vals):
    out = e.outputs[0].aval
    dts = _operand_dtype(e)
    cls = dtype_class(dts[-1] if e.prim.name == "select" else dts[0])
    table = C_OPS[e.prim]
    if cls not in table:
        raise NotImplementedError(f"hawk CUDA emitter: {e.prim.name} has no C form in {np.dtype(dts[0]).name}")
    tpl = table[cls]
    ops = [v.broadcast(out.shape).cast(dt) for v, dt in zip(vals, dts)]
    T = ctype(dts[0])
    return [tpl.format(*args, T=T) for args in zip(*ops)] if ops else [tpl.format(T=T)] * _size(out.shape)


for _p in prims.ELEMENTWISE:
    CUDA_RULES[_p] = _elementwise_rule


def _convert_rule(em, e, vals):
    return vals[0].cast(e.outputs[0].aval.dtype)


CUDA_RULES[prims.convert_p] = _convert_rule


def _index_rule(em, e, vals):
    x = vals[0]
    idx = np.arange(_size(x.shape)).reshape(x.shape)[e.params["i"]]
    return x.take(idx, idx.shape)


def _transpose_rule(em, e, vals):
    x = vals[0]
    idx = np.arange(_size(x.shape)).reshape(x.shape).T
    return x.take(idx, idx.shape)


def _broadcast_rule(em, e, vals):
    return vals[0].broadcast(e.params["shape"])


CUDA_RULES[prims.index_p] = _index_rule
CUDA_RULES[prims.transpose_p] = _transpose_rule
CUDA_RULES[prims.broadcast_p] = _broadcast_rule


def _stack_rule(em, e, vals):
    out = e.outputs[0].aval
    comps = []
    for v in vals:
        comps.extend(v.broadcast(out.shape[1:]).cast(out.dtype))
    return comps


CUDA_RULES[prims.stack_p] = _stack_rule


def _einsum_rule(em, e, vals):
    out = e.outputs[0].aval
    terms, out_idx, dims = prims.parse_einsum(e.params["spec"], [v.shape for v in vals])
    ops = [np.array(v.cast(out.dtype), dtype=object).reshape(v.shape) for v in vals]
    summed = [c for c in dims if c not in out_idx]
    comps = []
    for out_pos in itertools.product(*[range(dims[c]) for c in out_idx]):
        fixed = dict(zip(out_idx, out_pos))
        products = []
        for sum_pos in itertools.product(*[range(dims[c]) for c in summed]):
            env = dict(fixed, **dict(zip(summed, sum_pos)))
            factors = [op[tuple(env[c] for c in t)] for op, t in zip(ops, terms)]
            products.append(" * ".join(factors))
        if not products:
            comps.append(c_literal(0, out.dtype))
        else:
            comps.append(products[0] if len(products) == 1 and len(terms) == 1 else "(" + " + ".join(products) + ")")
    return comps


CUDA_RULES[prims.einsum_p] = _einsum_rule


def _cross_rule(em, e, vals):
    dt = e.outputs[0].aval.dtype
    a, b = (v.cast(dt) for v in vals)
    return [f"({a[1]} * {b[2]} - {a[2]} * {b[1]})", f"({a[2]} * {b[0]} - {a[0]} * {b[2]})",
            f"({a[0]} * {b[1]} - {a[1]} * {b[0]})"]


CUDA_RULES[prims.cross_p] = _cross_rule


def _uniform_reduction_rule(em, e, vals):
    # a reduction of a uniform value: the value is one sample (as in the NumPy backend)
    return vals[0].cast(e.outputs[0].aval.dtype)


for _p in prims.REDUCTION:
    CUDA_RULES[_p] = _uniform_reduction_rule


# prims whose value depends on the number of samples only, never on their operand's data
_COUNT_ONLY: set = set()
if "sample_count" in P:
    CUDA_RULES[P["sample_count"]] = lambda em, e, vals: [f"(({ctype(e.outputs[0].aval.dtype)})hawk_n)"]
    _COUNT_ONLY.add(P["sample_count"])


# ---------------------------------------------------------------------------------------------
# the plan and the emitter

@dataclass(frozen=True)
class KernelParam:
    """One C parameter of every entry of an emitted body, in order.

    role: 'in_plane' | 'in_cell' | 'in_value' | 'out_plane' | 'out_cell' | 'workspace' | 'n';
    index: the Program input or output position (None for workspace and n)."""
    name: str
    ctype: str
    role: str
    index: int | None
    dtype: np.dtype | None
    shape: tuple


@dataclass(frozen=True)
class Entry:
    """One kernel of an emitted body. launch: 'grid' (grid-stride over n; a block size that is a
    multiple of 32) or 'single' (one thread). stage: the map stage, None for init/finish."""
    name: str
    role: str          # 'init' | 'map' | 'finish'
    launch: str
    stage: int | None


@dataclass(frozen=True)
class Reduction:
    """A sample reduction's accumulator in the workspace."""
    kind: str          # 'sum' | 'max' | 'min' (sample_mean accumulates a sum)
    prim: str
    acc_dtype: np.dtype
    offset: int        # bytes into the workspace
    size: int          # components
    stage: int         # the map stage that accumulates it

    @property
    def compensated(self) -> bool:
        """A float sum: each component has a second cell, after all the sums, for its rounding error."""
        return self.kind == "sum" and self.acc_dtype.kind == "f"


@dataclass(frozen=True)
class EmittedKernel:
    """The CUDA C of one kernel body: source, its entries in launch order, the shared parameter
    list, and the workspace the reductions need."""
    name: str
    source: str
    entries: tuple
    params: tuple
    workspace_bytes: int
    init_is_zero: bool       # the workspace may be memset to zero instead of launching <name>_init
    reductions: tuple

    def entry_names(self) -> list[str]:
        return [en.name for en in self.entries]


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class _BodyEmitter:
    def __init__(self, prog: Program, name: str, out_sample, inplace, by_value):
        if not _IDENT.match(name):
            raise ValueError(f"hawk CUDA emitter: kernel name {name!r} is not a C identifier")
        out_sample = tuple(bool(s) for s in out_sample)
        if len(out_sample) != len(prog.outputs):
            raise ValueError(f"hawk CUDA emitter: out_sample has {len(out_sample)} entries, the body has "
                             f"{len(prog.outputs)} outputs")
        prog = expand_scatter(prog)          # scatter_add as per-row sample sums (cuda_tables.py)
        self.prog, self.name, self.out_sample = prog, name, out_sample
        self.indexed = read_where_indexed(prog)
        for j, (a, s) in enumerate(zip(prog.outputs, out_sample)):
            if a.aval.kind == SAMPLE and not s:
                raise ValueError(f"hawk CUDA emitter: output {j} is per-sample but its array is a one-cell "
                                 "(out_sample False); reduce it first")
        self.inplace = None if inplace is None else {int(j): int(k) for j, k in dict(inplace).items()}
        if by_value is None:
            by_value = [k for k, v in enumerate(prog.inputs) if v.aval.kind == UNIFORM and v.aval.weak]
        self.by_value = set(by_value)
        for k in self.by_value:
            v = prog.inputs[k]
            if v.aval.kind != UNIFORM or v.aval.shape != ():
                raise ValueError(f"hawk CUDA emitter: input {k} ({v.aval}) cannot be passed by value; only "
                                 "uniform scalars can")
        self.producer: dict[Var, object] = {}
        for e in prog.eqns:
            if e.prim not in CUDA_RULES:
                raise NotImplementedError(f"no CUDA emission rule for primitive '{e.prim}'")
            for v in e.outputs:
                self.producer[v] = e
        for v in list(prog.inputs) + [a for e in prog.eqns for a in e.inputs if isinstance(a, Var)]:
            ctype(v.aval.dtype)
        self._stages()
        self._plan()

    # -- stages ----------------------------------------------------------------------------------
    @staticmethod
    def _is_sample_reduction(e) -> bool:
        return e.prim in prims.REDUCTION and e.inputs[0].aval.kind == SAMPLE

    def _stages(self):
        st: dict[Var, int] = {v: 0 for v in self.prog.inputs}
        for e in self.prog.eqns:
            deps = () if e.prim in _COUNT_ONLY else e.inputs
            s = max((st.get(a, 0) for a in deps if isinstance(a, Var)), default=0)
            if self._is_sample_reduction(e):
                s += 1
            for v in e.outputs:
                st[v] = s
        self.stage_of = st

    def _stage(self, a) -> int:
        return self.stage_of.get(a, 0) if isinstance(a, Var) else 0

    def needed(self, roots):
        """Equations a kernel must compute for `roots` (in program order), and the input Vars and
        reduced (workspace) Vars it reads."""
        eqns, inputs, reduced, seen = set(), set(), set(), set()
        stack = [a for a in roots if isinstance(a, Var)]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            e = self.producer.get(v)
            if e is None:
                inputs.add(v)
            elif self._is_sample_reduction(e):
                reduced.add(v)
            else:
                eqns.add(id(e))
                if e.prim not in _COUNT_ONLY:
                    stack.extend(a for a in e.inputs if isinstance(a, Var))
        return [e for e in self.prog.eqns if id(e) in eqns], inputs, reduced

    def _plan(self):
        prog = self.prog
        self.reds: dict[int, Reduction] = {}     # id(eqn) -> Reduction
        off = 0
        for e in prog.eqns:
            if self._is_sample_reduction(e):
                out = e.outputs[0].aval
                kind = _RED_KIND[e.prim.name]
                acc = _acc_dtype(kind, out.dtype)
                off = (off + 7) // 8 * 8
                red = Reduction(kind, e.prim.name, acc, off, _size(out.shape), self._stage(e.inputs[0]))
                self.reds[id(e)] = red
                off += acc.itemsize * red.size * (2 if red.compensated else 1)
        self.workspace_bytes = (off + 7) // 8 * 8
        # where each per-sample output is written
        self.write_stage = {j: self._stage(a) for j, a in enumerate(prog.outputs) if self.out_sample[j]}
        pairs = []
        for j in self.write_stage:
            oa = prog.outputs[j].aval
            for k, v in enumerate(prog.inputs):
                if v.aval.kind != SAMPLE:
                    continue
                if self.inplace is None:
                    if v.aval.dtype == oa.dtype and v.aval.shape == oa.shape:
                        pairs.append((j, k))
                elif self.inplace.get(j) == k:
                    pairs.append((j, k))
        while True:
            reads = self._map_reads()
            changed = False
            for j, k in pairs:
                last = max((s for s, ins in reads.items() if prog.inputs[k] in ins), default=0)
                if last > self.write_stage[j]:
                    self.write_stage[j] = last
                    changed = True
            if not changed:
                break
        self.map_stages = sorted(set(self.write_stage.values()) | {r.stage for r in self.reds.values()})
        self.finish_outputs = [j for j in range(len(prog.outputs)) if not self.out_sample[j]]

    def map_roots(self, s):
        prog = self.prog
        roots = [prog.outputs[j] for j, w in self.write_stage.items() if w == s]
        roots += [e.inputs[0] for e in prog.eqns if id(e) in self.reds and self.reds[id(e)].stage == s]
        return roots

    def _map_reads(self):
        stages = set(self.write_stage.values()) | {r.stage for r in self.reds.values()}
        return {s: self.needed(self.map_roots(s))[1] for s in stages}

    # -- parameters ------------------------------------------------------------------------------
    def params(self) -> list[KernelParam]:
        prog = self.prog
        aliased_in = set(self.inplace.values()) if self.inplace is not None else set()
        aliased_out = set(self.inplace) if self.inplace is not None else set()
        restrict_ok = self.inplace is not None
        out = []
        for k, v in enumerate(prog.inputs):
            T = ctype(v.aval.dtype)
            if k in self.by_value:
                out.append(KernelParam(f"in{k}", T, "in_value", k, v.aval.dtype, ()))
                continue
            r = " __restrict__" if restrict_ok and k not in aliased_in else ""
            role = "in_plane" if v.aval.kind == SAMPLE else "in_cell"
            out.append(KernelParam(f"in{k}", f"const {T}*{r}", role, k, v.aval.dtype, v.aval.shape))
        for j, a in enumerate(prog.outputs):
            T = ctype(a.aval.dtype)
            r = " __restrict__" if restrict_ok and j not in aliased_out else ""
            out.append(KernelParam(f"out{j}", f"{T}*{r}", "out_plane" if self.out_sample[j] else "out_cell", j,
                                   a.aval.dtype, a.aval.shape))
        if self.reds:
            out.append(KernelParam("hawk_ws", "unsigned char*", "workspace", None, None, ()))
        out.append(KernelParam("hawk_n", "unsigned long long", "n", None, np.dtype(np.uint64), ()))
        return out

    # -- code ------------------------------------------------------------------------------------
    def _names(self):
        names, counter = {}, itertools.count()
        for e in self.prog.eqns:
            for v in e.outputs:
                names[v] = f"v{next(counter)}"
        self.var_names = names

    def _acc_ptr(self, red: Reduction) -> str:
        return f"(({ctype(red.acc_dtype)}*)(hawk_ws + {red.offset}))"

    def _bind_inputs(self, env, inputs, pre, loop):
        for k, v in enumerate(self.prog.inputs):
            if v not in inputs:
                continue
            T, size = ctype(v.aval.dtype), _size(v.aval.shape)
            if k in self.by_value:
                env[v] = _Val([f"in{k}"], v.aval.dtype, ())
            elif v in self.indexed:      # a table: each gather reads the entry it needs
                env[v] = _Val([f"in{k}[{c}]" for c in range(size)], v.aval.dtype, v.aval.shape)
            elif v.aval.kind == SAMPLE:
                for c in range(size):
                    at = "hawk_i" if c == 0 else f"{c}ull * hawk_n + hawk_i"
                    loop.append(f"const {T} in{k}_{c} = in{k}[{at}];")
                env[v] = _Val([f"in{k}_{c}" for c in range(size)], v.aval.dtype, v.aval.shape)
            else:
                for c in range(size):
                    pre.append(f"const {T} in{k}_{c} = in{k}[{c}];")
                env[v] = _Val([f"in{k}_{c}" for c in range(size)], v.aval.dtype, v.aval.shape)

    def _bind_reduced(self, env, reduced, pre):
        for e in self.prog.eqns:
            v = e.outputs[0]
            if v not in reduced:
                continue
            red = self.reds[id(e)]
            out = v.aval
            T, A = ctype(out.dtype), ctype(red.acc_dtype)
            name = self.var_names[v]
            pre.append(f"// {name} = {e.prim.name} (accumulated by an earlier pass)")
            for c in range(red.size):
                cell = f"{self._acc_ptr(red)}[{c}]"
                if red.compensated:
                    cell = f"({cell} + {self._acc_ptr(red)}[{red.size + c}])"
                expr = f"{cell} / ({A})hawk_n" if e.prim.name == "sample_mean" else cell
                pre.append(f"const {T} {name}_{c} = ({T})({expr});")
            env[v] = _Val([f"{name}_{c}" for c in range(red.size)], out.dtype, out.shape)

    def _emit_eqns(self, env, eqns, pre, loop):
        for e in eqns:
            v = e.outputs[0]
            vals = [] if e.prim in _COUNT_ONLY else [self._value(env, a) for a in e.inputs]
            if e.prim in STATEMENT_RULES:   # a loop (hawk_fx/loops.py): statements, then its results
                stmts, results = STATEMENT_RULES[e.prim](self, e, vals)
                loop.extend(stmts)
                env.update(zip(e.outputs, results))
                continue
            res = CUDA_RULES[e.prim](self, e, vals)
            if isinstance(res, _Val):
                env[v] = _Val(res.comps, v.aval.dtype, v.aval.shape, res.lits)
                continue
            lines = loop if v.aval.kind == SAMPLE else pre
            name, T = self.var_names[v], ctype(v.aval.dtype)
            params = " ".join(f"{k}={_param_str(p)}" for k, p in e.params.items())
            lines.append(f"// {name} = {e.prim.name}{'[' + params + ']' if params else ''}")
            comps = []
            for c, expr in enumerate(res):
                lines.append(f"const {T} {name}_{c} = {expr};")
                comps.append(f"{name}_{c}")
            env[v] = _Val(comps, v.aval.dtype, v.aval.shape)

    def _value(self, env, a) -> _Val:
        return env[a] if isinstance(a, Var) else _literal_val(a)

    def _signature(self, entry_name) -> str:
        ps = ", ".join(f"{p.ctype} {p.name}" for p in self.params())
        return f'extern "C" __global__ void {entry_name}({ps})'

    def map_kernel(self, s) -> tuple[str, str]:
        entry = self.name if s == 0 else f"{self.name}_pass{s}"
        prog = self.prog
        roots = self.map_roots(s)
        eqns, inputs, reduced = self.needed(roots)
        env: dict = {}
        pre, loop, post = [], [], []
        self._bind_inputs(env, inputs, pre, loop)
        self._bind_reduced(env, reduced, pre)
        self._emit_eqns(env, eqns, pre, loop)
        for j, w in self.write_stage.items():
            if w != s:
                continue
            a = prog.outputs[j]
            val = self._value(env, a)
            for c, expr in enumerate(val.cast(a.aval.dtype)):
                at = "hawk_i" if c == 0 else f"{c}ull * hawk_n + hawk_i"
                loop.append(f"out{j}[{at}] = {expr};")
        r_index = 0
        for e in prog.eqns:
            red = self.reds.get(id(e))
            if red is None or red.stage != s:
                continue
            A = ctype(red.acc_dtype)
            x = self._value(env, e.inputs[0]).cast(e.outputs[0].aval.dtype)
            ident = _identity(red.kind, red.acc_dtype)
            op = f"hawk_op_{red.kind}"
            pre.append(f"// accumulator of {self.var_names[e.outputs[0]]} = {e.prim.name}")
            for c in range(red.size):
                acc = f"hawk_acc{r_index}_{c}"
                pre.append(f"{A} {acc} = {ident};")
                term = x[c] if red.acc_dtype == e.outputs[0].aval.dtype else f"({A})({x[c]})"
                if red.compensated:
                    pre.append(f"{A} {acc}_err = {ident};")
                    loop.append(f"hawk_sum2_add({acc}, {acc}_err, {term});")
                    post.append(f"{{ {A} s = {acc}, c = {acc}_err; hawk_block_sum2(s, c);")
                    post.append(f"  if (threadIdx.x == 0) hawk_atomic_sum2(&{self._acc_ptr(red)}[{c}], "
                                f"&{self._acc_ptr(red)}[{red.size + c}], s, c); }}")
                    continue
                fold = f"{acc} + {term}" if red.kind == "sum" else f"hawk_{red.kind}({acc}, {term})"
                loop.append(f"{acc} = {fold};")
                post.append(f"{{ const {A} r = hawk_block_reduce<{op}>({acc}, {ident});")
                post.append(f"  if (threadIdx.x == 0) hawk_atomic_{red.kind}(&{self._acc_ptr(red)}[{c}], r); }}")
            r_index += 1
        body = [self._signature(entry) + " {"]
        body += ["    " + ln for ln in pre]
        body.append("    const unsigned long long hawk_stride = (unsigned long long)gridDim.x * blockDim.x;")
        body.append("    for (unsigned long long hawk_i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;"
                    " hawk_i < hawk_n; hawk_i += hawk_stride) {")
        body += ["        " + ln for ln in loop]
        body.append("    }")
        body += ["    " + ln for ln in post]
        body.append("}")
        return entry, "\n".join(body)

    def init_kernel(self) -> tuple[str, str]:
        entry = f"{self.name}_init"
        lines = [self._signature(entry) + " {", "    if (blockIdx.x != 0 || threadIdx.x != 0) return;"]
        for red in self.reds.values():
            ident = _identity(red.kind, red.acc_dtype)
            for c in range(red.size * (2 if red.compensated else 1)):
                lines.append(f"    {self._acc_ptr(red)}[{c}] = {ident};")
        lines.append("}")
        return entry, "\n".join(lines)

    def finish_kernel(self) -> tuple[str, str]:
        entry = f"{self.name}_finish"
        prog = self.prog
        roots = [prog.outputs[j] for j in self.finish_outputs]
        eqns, inputs, reduced = self.needed(roots)
        env: dict = {}
        pre, loop = [], []
        self._bind_inputs(env, inputs, pre, loop)
        self._bind_reduced(env, reduced, pre)
        self._emit_eqns(env, eqns, pre, loop)
        assert not loop, "a one-cell output needs a per-sample value"
        for j in self.finish_outputs:
            a = prog.outputs[j]
            for c, expr in enumerate(self._value(env, a).cast(a.aval.dtype)):
                pre.append(f"out{j}[{c}] = {expr};")
        lines = [self._signature(entry) + " {", "    if (blockIdx.x != 0 || threadIdx.x != 0) return;"]
        lines += ["    " + ln for ln in pre]
        lines.append("}")
        return entry, "\n".join(lines)

    def emit(self, prelude: bool) -> EmittedKernel:
        self._names()
        entries, chunks = [], []
        if self.reds:
            n, src = self.init_kernel()
            entries.append(Entry(n, "init", "single", None))
            chunks.append(src)
        for s in self.map_stages:
            n, src = self.map_kernel(s)
            entries.append(Entry(n, "map", "grid", s))
            chunks.append(src)
        if self.finish_outputs:
            n, src = self.finish_kernel()
            entries.append(Entry(n, "finish", "single", None))
            chunks.append(src)
        head = f"// hawk kernel body '{self.name}': entries {', '.join(en.name for en in entries)}\n"
        source = (PRELUDE if prelude else "") + head + "\n".join(chunks) + "\n"
        init_zero = all(r.kind == "sum" for r in self.reds.values())
        return EmittedKernel(self.name, source, tuple(entries), tuple(self.params()), self.workspace_bytes,
                             init_zero, tuple(self.reds.values()))


def _param_str(p) -> str:
    if isinstance(p, np.dtype):
        return p.name
    return str(p).replace("*/", "* /").replace("\n", " ")


def plan_kernel(prog: Program, name: str, out_sample, *, inplace=None, by_value=None,
                prelude: bool = True) -> EmittedKernel:
    """Emit one kernel body as CUDA C, with its entries, parameters and workspace (see the module
    docstring). out_sample[j]: whether output j's array is a per-sample plane (else a one-cell);
    inplace: {output index: input index} for Mutable planes (None: unknown, assume any may alias);
    by_value: input indices passed as scalar arguments (default: the weak uniform ones);
    prelude=False leaves out PRELUDE (for concatenating several bodies after one PRELUDE)."""
    return _BodyEmitter(prog, name, out_sample, inplace, by_value).emit(prelude)


def emit_kernel(prog: Program, name: str, out_sample, **kw) -> str:
    """CUDA C source for one kernel body Program (see plan_kernel for the keywords)."""
    return plan_kernel(prog, name, out_sample, **kw).source


def emit_specialization(spec, name: str | None = None, **kw) -> EmittedKernel:
    """plan_kernel for a hawk Specialization: its outputs' kinds and its Mutable commits."""
    layout = spec.layout
    out_sample = [k == SAMPLE for k in spec.result_kinds] + [layout[k][0] == SAMPLE for k in spec.commits]
    inplace = {spec.n_results + m: k for m, k in enumerate(spec.commits)}
    return plan_kernel(spec.prog, name or spec.kernel.name, out_sample, inplace=inplace, **kw)


# ---------------------------------------------------------------------------------------------
# NVRTC

class CudaCompileError(RuntimeError):
    """NVRTC rejected a source; the message holds NVRTC's log and the lines it names."""


_cache = LRU("NVRTC-compiled CUDA sources", 512)    # sha256 of target, options and source -> the binary


def _nvrtc():
    try:
        from cuda.bindings import nvrtc          # cuda-bindings >= 12.6
    except ImportError:
        try:
            from cuda import nvrtc               # older cuda-python
        except ImportError as exc:
            raise ImportError("hawk CUDA emitter: compiling needs NVRTC's Python bindings; install the "
                              "'cuda12' extra (cuda-bindings and nvidia-cuda-nvrtc-cu12)") from exc
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor); raises ImportError/RuntimeError when NVRTC cannot be loaded."""
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return int(major), int(minor)


def _check(nvrtc, err, what):
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"hawk CUDA emitter: {what} failed: {err}")


def _excerpt(source: str, log: str) -> str:
    lines = source.splitlines()
    shown = []
    for m in sorted({int(x) for x in re.findall(r"\((\d+)\): (?:error|warning)", log)})[:5]:
        for k in range(max(1, m - 2), min(len(lines), m + 2) + 1):
            shown.append(f"{k:5d}{'>' if k == m else ' '} {lines[k - 1]}")
        shown.append("")
    return "\n".join(shown)


def _compile(source: str, arch: str, target: str, options: tuple) -> bytes:
    digits = re.sub(r"^(sm_|compute_)", "", str(arch))
    if not digits.isdigit() and not re.fullmatch(r"\d+[af]?", digits):
        raise ValueError(f"hawk CUDA emitter: arch {arch!r}; give e.g. 'sm_90'")
    gpu = f"{'sm' if target == 'cubin' else 'compute'}_{digits}"
    opts = (f"--gpu-architecture={gpu}", "-std=c++17") + tuple(options)
    key = hashlib.sha256("\0".join((target,) + opts + (source,)).encode()).hexdigest()
    hit = _cache.get(key)
    if hit is not None:
        return hit
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"hawk_kernel.cu", 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            e2, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\0 ").decode(errors="replace")
            raise CudaCompileError(f"NVRTC could not compile for {gpu} ({err}):\n{log}\n{_excerpt(source, log)}")
        if target == "cubin":
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(nvrtc, err, "nvrtcGetCUBINSize")
            buf = b" " * size
            (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            _check(nvrtc, err, "nvrtcGetCUBIN")
        else:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(nvrtc, err, "nvrtcGetPTXSize")
            buf = b" " * size
            (err,) = nvrtc.nvrtcGetPTX(prog, buf)
            _check(nvrtc, err, "nvrtcGetPTX")
            buf = buf.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    out = bytes(buf)
    _cache[key] = out
    return out


def compile_cubin(source: str, arch: str = "sm_90", options=()) -> bytes:
    """Compile CUDA C to a cubin for `arch` with NVRTC (no GPU or driver needed), cached by the
    hash of the source, arch and options. Raises CudaCompileError with NVRTC's log on failure."""
    return _compile(source, arch, "cubin", tuple(options))


def compile_ptx(source: str, arch: str = "sm_90", options=()) -> str:
    """Compile CUDA C to PTX text for `arch` (compute_XX), cached like compile_cubin."""
    return _compile(source, arch, "ptx", tuple(options)).decode()


def ptx_entries(ptx: str) -> list[str]:
    """The kernel entry names a PTX text defines."""
    return re.findall(r"\.entry\s+([A-Za-z_][A-Za-z0-9_$]*)", ptx)


from .cuda_tables import expand_scatter, read_where_indexed  # noqa: E402  (registers the gather rule)
