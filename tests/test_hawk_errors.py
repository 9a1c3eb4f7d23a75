"""Refused calls and bodies. Each case checks the exception type, that the message names the
kernel and the parameter (and, for trace errors, the file and line), and that nothing was
written into the caller's Mutable arrays."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import file_and_line, refused

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Mutable, Param, Scalar, TraceError, UInt32, Vector

N = 5


@hawk.kernel
def guarded(x: Scalar, v: Vector[3], a: Param, t: Mutable[Scalar], m: Mutable[Scalar]):
    t = t + a
    m = m + x * v[0]
    return x * a


class FakeCupyArray:
    """Looks like a cupy.ndarray to the binding code: right module, shape and dtype."""
    __module__ = "cupy"

    def __init__(self, shape):
        self.shape, self.dtype, self.ndim = shape, np.dtype(np.float64), len(shape)


@pytest.fixture
def args(rng):
    x, v = rng.random(N), rng.random((3, N))
    t, m = np.array([1.0]), rng.random(N)
    guarded(x, v, 0.5, t.copy(), m.copy())            # primes the fast path for this layout
    return dict(x=x, v=v, a=0.5, t=t, m=m)


def call(args, **changes):
    d = dict(args, **changes)
    return lambda: guarded(d["x"], d["v"], d["a"], d["t"], d["m"])


BAD_VALUES = [
    # (parameter, value, exception, fragments beyond the kernel and parameter names)
    ("x", "abc", TypeError, ["str"]),
    ("x", None, TypeError, ["None"]),
    ("v", None, TypeError, ["None"]),
    ("a", "1.0", TypeError, ["str"]),
    ("m", None, TypeError, ["None"]),
    ("m", "plane", TypeError, ["str"]),
    ("x", np.zeros((2, 3)), ValueError, ["(2, 3)", "(n,)"]),            # a (2, 3) plane for a Scalar
    ("v", np.zeros((2, N)), ValueError, ["(3, n)"]),
    ("v", np.zeros(N), ValueError, ["(3, n)"]),
    ("v", 1.0, ValueError, ["(3, n)"]),                                # a number for a Vector
    ("a", np.zeros(2), ValueError, ["(2,)"]),                          # a Param is one cell
    ("a", np.zeros((1, 1)), ValueError, ["(1, 1)"]),
    ("t", 1.0, TypeError, ["Python float", "np.array([1.0])"]),        # a Python float to a Mutable
    ("t", np.float64(1.0), TypeError, ["NumPy array"]),
    ("m", np.zeros(N, np.int64), TypeError, ["int64", "floating"]),    # Mutable[Scalar] is written
    ("x", np.zeros(N, np.complex128), TypeError, ["complex128"]),
    ("x", FakeCupyArray((N,)), NotImplementedError, ["cupy", "NumPy"]),
    ("m", FakeCupyArray((N,)), NotImplementedError, ["cupy", "NumPy"]),
    ("m", np.zeros(N + 1), ValueError, [f"{N + 1} samples", "'x'"]),   # inconsistent sample counts
    ("v", np.zeros((3, N + 2)), ValueError, [f"{N + 2} samples"]),
]


@pytest.mark.parametrize("param,value,exc,fragments", BAD_VALUES,
                         ids=[f"{p}-{type(v).__name__}-{i}" for i, (p, v, _, _) in enumerate(BAD_VALUES)])
def test_bad_argument_values(args, param, value, exc, fragments):
    refused(exc, call(args, **{param: value}), "guarded", f"'{param}'", *fragments,
            untouched=(args["t"], args["m"]))


def test_read_only_mutable(args):
    m = args["m"].copy()
    m.flags.writeable = False
    refused(ValueError, call(args, m=m), "guarded", "'m'", "read-only", untouched=(args["t"], m))


def test_mutables_sharing_memory(args):
    m = args["m"]
    refused(ValueError, call(args, t=m[:1]), "guarded", "'t'", "'m'", "share memory", untouched=(m,))


def test_missing_argument(args):
    d = args
    refused(TypeError, lambda: guarded(d["x"], d["v"], d["a"], d["t"]), "guarded", "'m'", "missing",
            untouched=(d["t"],))


def test_extra_argument(args):
    d = args
    refused(TypeError, lambda: guarded(d["x"], d["v"], d["a"], d["t"], d["m"], 2.0), "guarded",
            "x, v, a, t, m", "got 6", untouched=(d["t"], d["m"]))


def test_unknown_keyword(args):
    d = args
    refused(TypeError, lambda: guarded(d["x"], d["v"], d["a"], d["t"], m=d["m"], q=1.0), "guarded", "'q'",
            "x, v, a, t, m", untouched=(d["t"], d["m"]))


def test_argument_given_twice(args):
    d = args
    refused(TypeError, lambda: guarded(d["x"], d["v"], d["a"], d["t"], d["m"], x=d["x"]), "guarded", "'x'",
            "twice", untouched=(d["t"], d["m"]))


def test_buffer_outside_a_graph(args):
    d = args
    refused(TypeError, lambda: guarded(d["x"], d["v"], d["a"], d["t"], d["m"], buffer=object()), "guarded",
            "buffer=", untouched=(d["t"], d["m"]))


def test_good_call_still_works_after_refusals(args):
    d = args
    t, m = d["t"].copy(), d["m"].copy()
    for param, value, exc, _ in BAD_VALUES:
        with pytest.raises(exc):
            call(dict(d, t=t, m=m), **{param: value})()
    np.testing.assert_allclose(guarded(d["x"], d["v"], 0.5, t, m), d["x"] * 0.5)
    assert t[0] == d["t"][0] + 0.5
    np.testing.assert_allclose(m, d["m"] + d["x"] * d["v"][0])


# ---------------------------------------------------------------------------------------------
# roles with exact dtypes

@hawk.kernel
def typed(u: UInt32, done: Scalar, c: Mutable[UInt32]):
    c = c + u
    return hm.where(done, u, 0)


@pytest.mark.parametrize("param,value,fragments", [
    ("u", np.zeros(N, np.float64), ["float64", "integer"]),
    ("u", 1.5, ["Python float", "integer"]),
    ("c", np.zeros(N, np.int32), ["int32", "uint32"]),
])
def test_exact_dtype_roles(param, value, fragments):
    ok = dict(u=np.arange(N, dtype=np.uint32), done=np.zeros(N, bool), c=np.zeros(N, np.uint32))
    typed(**{k: v.copy() for k, v in ok.items()})
    bad = dict(ok, **{param: value})
    refused(TypeError, lambda: typed(bad["u"], bad["done"], bad["c"]), "typed", f"'{param}'", *fragments,
            untouched=(ok["c"],))


# ---------------------------------------------------------------------------------------------
# trace errors: the kernel, the parameter, the user's file and line

def trace_refused(kern, fragment, call_args, untouched, *more):
    fname, line = file_and_line(kern, fragment)
    return refused(TraceError, lambda: kern(*call_args), kern.__name__, fname, line, *more, untouched=untouched)


def test_per_sample_value_written_to_one_cell_mutable(rng):
    @hawk.kernel
    def onecell(x: Scalar, t: Mutable[Scalar]):
        t = x * 2.0
    t = np.array([3.0])
    trace_refused(onecell, "t = x * 2.0", (rng.random(N), t), (t,), "'t'", "one-cell", "hawk.sum")


def test_while_on_a_per_sample_value(rng):
    @hawk.kernel
    def countdown(x: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        while x > 0:
            x = x - 1.0
        return x
    log = np.zeros(N)
    trace_refused(countdown, "while x > 0", (rng.random(N), log), (log,), "`while x > 0:`", "hm.where")


def test_bool_of_per_sample_value_in_and(rng):
    @hawk.kernel
    def both(x: Scalar, y: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        return hm.where(x > 0 and y > 0, x, y)
    log = np.zeros(N)
    trace_refused(both, "x > 0 and y > 0", (rng.random(N), rng.random(N), log), (log,), "x > 0 and y > 0", "bool")


def test_if_around_break_on_per_sample_value(rng):
    # in a capped `for _ in range(K)` a per-sample break is a loop that stops per sample
    # (tests/test_kernel_loops.py); in a `while` it stays refused
    @hawk.kernel
    def search(x: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        i = 0
        while i < 3:
            if x > i:
                break
            i += 1
        return x
    log = np.zeros(N)
    trace_refused(search, "if x > i", (rng.random(N), log), (log,), "x > i", "break")


@pytest.mark.parametrize("which", ["np.sin", "math.sin", "float", "int", "np.asarray"])
def test_arbitrary_functions_on_traced_values(which, rng):
    @hawk.kernel
    def foreign(x: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        if which == "np.sin":
            y = np.sin(x)
        elif which == "math.sin":
            y = math.sin(x)
        elif which == "float":
            y = float(x)
        elif which == "int":
            y = int(x) * 1.0
        else:
            y = np.asarray(x)
        return y
    log = np.zeros(N)
    fragment = {"np.sin": "np.sin(x)", "math.sin": "math.sin(x)", "float": "float(x)", "int": "int(x)",
                "np.asarray": "np.asarray(x)"}[which]
    hint = {"np.sin": "hm.sin", "math.sin": "hm.sin", "float": "hm.float64", "int": "hm.int32",
            "np.asarray": "hawk.math"}[which]
    trace_refused(foreign, "y = " + fragment, (rng.random(N), log), (log,), fragment, hint)


def test_value_assigned_in_one_arm_only(rng):
    @hawk.kernel
    def onearm(x: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        if x > 0.5:
            y = x * 2.0
        return y
    log = np.zeros(N)
    trace_refused(onearm, "if x > 0.5", (rng.random(N), log), (log,), "'y'", "only one arm")


def test_shape_error_in_a_body_names_the_line(rng):
    @hawk.kernel
    def mismatch(v: Vector[3], w: Vector[2], log: Mutable[Scalar]):
        log = log + 1.0
        return v + w
    log = np.zeros(N)
    fname, line = file_and_line(mismatch, "return v + w")
    refused(ValueError, lambda: mismatch(rng.random((3, N)), rng.random((2, N)), log), "mismatch", fname, line,
            "v + w", "(3,)", "(2,)", untouched=(log,))


def test_bad_einsum_spec_names_the_line(rng):
    @hawk.kernel
    def badspec(v: Vector[3], log: Mutable[Scalar]):
        log = log + 1.0
        return hm.einsum("ij,j", v, v)
    log = np.zeros(N)
    fname, line = file_and_line(badspec, "hm.einsum(")
    refused(ValueError, lambda: badspec(rng.random((3, N)), log), "badspec", fname, line, "->", untouched=(log,))


def test_returning_a_string(rng):
    @hawk.kernel
    def stringy(x: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        return x, "done"
    log = np.zeros(N)
    refused(TraceError, lambda: stringy(rng.random(N), log), "stringy", "str", "'done'", untouched=(log,))


def test_early_return_is_refused_at_definition():
    with pytest.raises(TraceError) as info:
        @hawk.kernel
        def early(x: Scalar):
            if x > 0:
                return x
            return -x
    msg = str(info.value)
    fname, line = file_and_line(test_early_return_is_refused_at_definition, "return x")
    assert "early" in msg and "early `return`" in msg and "`return x`" in msg
    assert fname in msg and line in msg


def test_parameter_without_role_is_refused():
    def plain(x: Scalar, y):
        return x
    with pytest.raises(TypeError) as info:
        hawk.kernel(plain)
    assert "plain" in str(info.value) and "'y'" in str(info.value) and "role" in str(info.value)


def test_star_args_are_refused():
    def star(x: Scalar, *rest):
        return x
    with pytest.raises(TypeError) as info:
        hawk.kernel(star)
    assert "star" in str(info.value) and "*rest" in str(info.value)
