"""Errors at the seams between transforms: each refusal names the composition as written, the
user's function and line, and what to write instead; the caller's arrays are left as they were."""
import numpy as np
import pytest

import eagle_fx as ef
from tour_kernels import cell, grow, total, wobble


@ef.Graph.builder
def with_aux(x):
    g = ef.Graph()
    y = wobble(x)
    g.result = (total(y), y)
    return g


@ef.Graph.builder
def int_count(x, n):
    g = ef.Graph()
    for _ in range(int(n[0])):
        x = grow(x, 1.1)
    g.result = total(x)
    return g


@ef.Graph.builder
def plain(x):
    g = ef.Graph()
    g.result = total(wobble(x))
    return g


def test_has_aux_forgotten_names_both_transforms_the_builder_and_has_aux():
    xs = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    keep = xs.copy()
    with pytest.raises(TypeError) as info:
        ef.vmap(ef.grad(with_aux))(xs)
    msg = str(info.value)
    assert msg.startswith("eagle_fx.vmap(eagle_fx.grad(with_aux))")
    assert "test_compose_seams.py, line" in msg and "has_aux=True" in msg and "(gradient, aux)" in msg
    with pytest.raises(TypeError, match=r"value_and_grad\(with_aux, has_aux=True\) returns \(\(value, aux\), gradient\)"):
        ef.value_and_grad(with_aux)(xs[0])
    np.testing.assert_array_equal(xs, keep)
    # with has_aux it runs: the gradient of sum(w^2), w = x sin x, and w itself
    g, aux = ef.vmap(ef.grad(with_aux, has_aux=True))(xs)
    w = np.sin(xs) * xs
    np.testing.assert_allclose(aux, w, rtol=1e-12)
    np.testing.assert_allclose(g, 2 * w * (np.sin(xs) + xs * np.cos(xs)), rtol=1e-12)


def test_int_of_a_cell_as_a_loop_count_says_range_takes_the_cell():
    xs, n = np.ones((2, 3)), cell(2)
    with pytest.raises(IndexError) as info:
        ef.vmap(ef.grad(int_count), in_axes=(0, None))(xs, n)
    msg = str(info.value)
    assert "int_count:4" in msg and "staged by eagle_fx.grad inside eagle_fx.vmap" in msg
    assert "int(n[0])" in msg and "for _ in range(n):" in msg
    with pytest.raises(IndexError, match=r"staged by eagle_fx.grad\)"):
        ef.grad(int_count)(xs[0], n)
    assert n[0] == 2


def test_grad_of_an_integer_input_names_the_composition_and_says_pass_floats():
    xi = np.ones((2, 3), int)
    with pytest.raises(TypeError) as info:
        ef.vmap(ef.grad(plain))(xi)
    msg = str(info.value)
    assert msg.startswith("eagle_fx.grad: argument x holds no floating array, only integer values (int64)")
    assert "x.astype(np.float64)" in msg
    assert "(in eagle_fx.vmap(eagle_fx.grad(plain)), at plain (test_compose_seams.py, line" in msg
    with pytest.raises(TypeError, match=r"integer inputs have no derivative.*\(in eagle_fx.grad\(plain\), at plain \("):
        ef.grad(plain)(xi[0])
