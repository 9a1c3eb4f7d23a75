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


def test_transforms_on_jax_arrays_run_on_xla_and_return_jax_arrays():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    xj, aj = jnp.asarray(X), jnp.asarray([2.0])
    a = np.array([2.0])
    closed_form = 2 * 2.0 * (2.0 * X + 0.5)                 # d/dx sum((2x + 0.5)^2)
    got = ef.grad(fit)(xj, aj)
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(np.asarray(got), closed_form, rtol=1e-12)
    v, (dx, da) = ef.value_and_grad(fit, argnums=(0, 1))(xj, aj)
    want_v, (want_dx, want_da) = ef.value_and_grad(fit, argnums=(0, 1))(X, a)
    np.testing.assert_allclose(np.asarray(v), want_v, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(da), want_da, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ef.hessian(fit)(xj, aj)), ef.hessian(fit)(X, a), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ef.jacrev(fit)(xj, aj)), ef.jacrev(fit)(X, a), rtol=1e-12)
    y, pullback = ef.vjp(fit, xj, aj)
    np.testing.assert_allclose(np.asarray(pullback(jnp.ones(1))[0]), closed_form, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jit(ef.grad(fit))(xj, aj)), closed_form, rtol=1e-12)   # under jit too
    t = np.linspace(-1.0, 1.0, 5)
    y, ty = ef.jvp(fit, (xj, aj), (jnp.asarray(t), None))                 # forward mode on jax.Arrays
    want_y, want_ty = ef.jvp(fit, (X, a), (t, None))
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ty), want_ty, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ty), [closed_form @ t], rtol=1e-12)
    # a transform that returns a graph (vmap of a builder) takes NumPy arrays, and says so
    with pytest.raises(TypeError, match=r"vmap\(fit\): argument 0 holds a jax.Array.*np.asarray.*eagle_fx.to_jax"):
        ef.vmap(fit)(jnp.stack([xj, xj]), jnp.stack([aj, aj]))
