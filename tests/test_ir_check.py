"""Every Program the library makes type-checks: check_program re-runs abstract evaluation over
kernel bodies, their derivatives and staged graphs (sub-programs included), and must also catch
a Program that was put together wrong."""
import contextlib
import io
import runpy

import numpy as np
import pytest

from hawk_fx import diff
from hawk_fx.core import Eqn, Program, Var, check_program
from hawk_fx.prims import P


@pytest.fixture(scope="module")
def tour():
    with contextlib.redirect_stdout(io.StringIO()):
        return runpy.run_module("eagle_fx.tour")


def test_tour_graphs_type_check(tour):
    x, c = np.arange(4.0), np.array([1], np.uint32)
    graphs = [tour["first"](x), tour["forks"](x), tour["choose"](x, c.copy(), c.copy(), True),
              tour["capped"](np.ones(4), c.copy()), tour["counted"](np.zeros(4), np.array([3], np.uint32)),
              tour["chooser"](np.full(4, 3.0), c.copy()), tour["keep"](x)]
    for g in graphs:
        check_program(g.program)


def test_kernel_bodies_and_their_derivatives_type_check(tour):
    for name in ("inc", "dbl", "add", "square", "affine", "below", "over", "accumulate"):
        k = tour[name]
        spec = k.specialize(k.default_layout())
        check_program(spec.prog)
        check_program(diff.kernel_vjp(spec).prog)
        check_program(diff.kernel_jvp(spec).prog)


def test_a_mistyped_program_is_caught():
    from hawk_fx.core import SAMPLE, AVal
    a = Var(AVal((), np.float64, SAMPLE))
    wrong = Var(AVal((3,), np.float64, SAMPLE))          # sin keeps the shape: () -> (), not (3,)
    with pytest.raises(AssertionError, match="abstract evaluation"):
        check_program(Program([a], [Eqn(P["sin"], [a], [wrong])], [wrong]))
    undefined = Var(AVal((), np.float64, SAMPLE))
    with pytest.raises(AssertionError, match="used before it is defined"):
        check_program(Program([a], [Eqn(P["sin"], [undefined], [wrong])], [wrong]))


def test_batched_programs_type_check(tour):
    import eagle_fx as eagle
    xs = np.random.rand(3, 4)
    cells = np.ones((3, 1), np.uint32)
    check_program(eagle.vmap(tour["choose"], in_axes=(0, 0, 0, None))(xs, cells, cells.copy(), True).program)
    check_program(eagle.vmap(tour["capped"])(xs + 1.0, cells.copy()).program)


def test_the_reference_interpreter_agrees_with_the_compiled_kernel(tour):
    # eval_program walks a body with the plain eager NumPy rules: an independent path from the
    # generated chunked code
    from hawk_fx.core import eval_program
    k = tour["affine"]
    x = np.linspace(-2.0, 3.0, 7)
    spec = k.specialize(k.layout_of([x, 2.0, 1.0])[0])
    (ref,) = eval_program(spec.prog, [x, 2.0, 1.0])
    np.testing.assert_allclose(k(x, 2.0, 1.0), ref)
    np.testing.assert_allclose(ref, 2.0 * x + 1.0)


def test_derived_programs_type_check(tour):
    # the Programs jvp, grad and their compositions make: derivative bodies, stacks of saved
    # turns, backward loops, masked versions of all of these
    import eagle_fx as eagle
    x, c = np.arange(4.0) + 1.0, np.array([1], np.uint32)
    for f, args in ((tour["capped"], (np.ones(4), c.copy())), (tour["counted"], (np.zeros(4), np.array([3], np.uint32))),
                    (tour["chooser"], (np.full(4, 3.0), c.copy()))):
        check_program(eagle.make_program(eagle.jacrev(f))(*args))
        check_program(eagle.make_program(eagle.jacfwd(f))(*args))
    loss = _loss()
    check_program(eagle.make_program(eagle.grad(loss))(x, c))
    check_program(eagle.make_program(eagle.jacfwd(eagle.grad(loss)))(x, c))
    check_program(eagle.make_program(eagle.vmap(eagle.grad(loss), in_axes=(0, 0)))(np.ones((3, 4)), np.ones((3, 1), np.uint32)))


def _loss():
    import eagle_fx as eagle
    import hawk_fx as hawk
    from tour_kernels import dbl, inc

    @hawk.kernel
    def total(x: hawk.Scalar) -> hawk.Scalar:
        return hawk.sum(x * x)

    @eagle.Graph.builder
    def loss(x, n):
        g = eagle.Graph()
        for _ in range(n):
            x = inc(dbl(x))
        g.result = total(x)
        return g
    return loss
