"""Each refusal of the functional API names the call and says what to do instead; a refused call
writes nothing into the caller's arrays."""
import numpy as np
import pytest

import eagle_fx as ef
from eagle_fx.transforms.program import TransformError
from tour_kernels import affine, cell, loss, total


@ef.Graph.builder
def fit(x, a):
    g = ef.Graph()
    g.result = total(affine(x, a, 0.5))
    return g


X = np.linspace(0.0, 1.0, 5)


def test_calling_a_graph_on_new_arrays_says_bind_or_call_the_builder():
    g = fit(X, np.array([2.0]))
    with pytest.raises(TypeError, match=r"replay the graph n times on its own arrays.*g\.bind\(x=\.\.\., a=\.\.\.\).*"
                                        r"call fit\(\.\.\.\) again"):
        g(X)


def test_binding_a_list_names_the_array_it_needs():
    g = fit(X, np.array([2.0]))
    with pytest.raises(ValueError, match=r"bind: 'x' takes an array of shape \(5,\) and dtype float64, got list"):
        g.bind(x=[1.0, 2.0, 3.0, 4.0, 5.0])
    g.bind(x=X[::-1].copy())
    np.testing.assert_allclose(g(), [np.sum((2.0 * X + 0.5) ** 2)])     # the refused bind changed nothing


def test_a_keyword_typo_names_the_builder_and_its_parameters():
    with pytest.raises(TypeError, match=r"fit: missing a required argument: 'x'; the builder takes \(x, a\); 'xx' is "
                                        "not one of them"):
        fit(xx=X, a=np.array([2.0]))


def test_a_0d_param_says_reshape_or_float():
    with pytest.raises(ValueError, match=r"a 0-d array: pass a\.reshape\(1\).*or float\(a\)"):
        fit(X, np.array(2.0))
    np.testing.assert_allclose(ef.grad(fit, argnums=1)(X, np.array(2.0)), 2 * np.sum((2.0 * X + 0.5) * X))


def test_differentiating_a_jacobian_points_to_hessian():
    # a Jacobian is not one value: grad of it is refused (as jax.grad refuses it), pointing to hessian
    with pytest.raises(TypeError, match=r"eagle_fx\.grad: jacrev\(fit\) returns.*a Jacobian.*eagle_fx\.hessian\(f\), "
                             r"eagle_fx\.jacfwd\(eagle_fx\.jacrev\(f\)\)"):
        ef.grad(ef.jacrev(fit))(X, np.array([2.0]))


def test_transform_argument_errors():
    with pytest.raises(TypeError, match=r"eagle_fx\.grad: argument flag holds no floating array, only integer values "
                                        r"\(uint32\); integer inputs have no derivative.*pick another argnums"):
        ef.grad(loss, argnums=1)(X, cell(1), cell(2))
    with pytest.raises(ValueError, match=r"eagle_fx\.grad: argnums 3 for 3 positional arguments"):
        ef.grad(loss, argnums=3)(X, cell(1), cell(2))
    with pytest.raises(TypeError, match=r"eagle_fx\.value_and_grad: loss is given has_aux=True but its result is \*; "
                                        r"declare g\.result = \(value, aux\)"):
        ef.value_and_grad(loss, has_aux=True)(X, cell(1), cell(2))
    with pytest.raises(ValueError, match=r"eagle_fx\.jvp: the tangent for argument x has structure \(\*, \*,\); the "
                                        r"argument has \*"):
        ef.jvp(loss, (X, cell(1), cell(2)), ((X, X), None, None))
    with pytest.raises(ValueError, match=r"eagle_fx\.vmap\(grad\(loss\)\): in_axes of argument 0: the axes \{'a': 0\} do not "
                                        "match its structure"):
        ef.vmap(ef.grad(loss), in_axes=({"a": 0}, None, None))(np.stack([X, X]), cell(1), cell(2))
    with pytest.raises(TypeError, match=r"grad\(loss\): pass the arguments positionally"):
        ef.grad(loss)(x=X, flag=cell(1), n=cell(2))


def test_transforms_on_jax_arrays_point_to_to_jax_and_jax_transforms():
    jnp = pytest.importorskip("jax.numpy")
    import jax
    xj, aj = jnp.asarray(X), jnp.asarray([2.0])
    calls = {"grad": lambda: ef.grad(fit)(xj, aj), "value_and_grad": lambda: ef.value_and_grad(fit)(xj, aj),
             "vmap": lambda: ef.vmap(fit)(jnp.stack([xj, xj]), jnp.stack([aj, aj])),
             "jacrev": lambda: ef.jacrev(fit)(xj, aj), "hessian": lambda: ef.hessian(fit)(xj, aj),
             "eagle_fx.vjp": lambda: ef.vjp(fit, xj, aj),
             "eagle_fx.jvp": lambda: ef.jvp(fit, (xj, aj), (jnp.ones(5), jnp.ones(1)))}
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"{name}.*argument 0 holds a jax.Array.*np.asarray.*eagle_fx.to_jax"):
            call()
    # the way it points to works, and agrees with eagle_fx.grad on NumPy arrays (and with the closed form)
    want = ef.grad(fit)(X, np.array([2.0]))
    got = jax.grad(lambda x: ef.to_jax(fit)(x, aj)[0])(xj)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    np.testing.assert_allclose(want, 2 * 2.0 * (2.0 * X + 0.5), rtol=1e-12)
