"""Graph.bind takes a tree argument of every kind the builder call takes (dict, tuple, NamedTuple,
dataclass, class registered with eagle_fx.tree.register_pytree_node): a bound graph gives what a
fresh build with the new arrays gives, and what plain NumPy computes on the same math. A tree of
another structure is refused naming bind and the argument, and changes nothing."""

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx import math as hm


@hawk.kernel
def affine(x: Scalar, w: Param, b: Param) -> Scalar:
    return hm.sin(w * x + b)


from test_vmap_tree_args import Boxed, Fields, Pair  # noqa: E402  (the same tree kinds, registered once)

KINDS = {"dict": lambda w, b: {"w": w, "b": b}, "tuple": lambda w, b: (w, b), "namedtuple": Pair,
         "dataclass": Fields, "registered": Boxed}


def _wb(p):
    if isinstance(p, dict):
        return p["w"], p["b"]
    return p if isinstance(p, tuple) and not hasattr(p, "_fields") else (p.w, p.b)


@ef.Graph.builder
def model(p, x):
    g = ef.Graph()
    w, b = _wb(p)
    g.result = affine(x, w * 2.0, b)
    return g


def oracle(w, b, x):
    return np.sin(2.0 * w[0] * x + b[0])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("seed", range(3))
def test_bind_takes_the_trees_the_call_takes(kind, seed):
    mk, rng = KINDS[kind], np.random.default_rng(seed)
    x = rng.normal(size=9)
    g = model(mk(rng.normal(size=1), rng.normal(size=1)), x)
    g()
    for _ in range(2):
        w, b = rng.normal(size=1), rng.normal(size=1)
        got = np.array(g.bind(p=mk(w, b))())
        np.testing.assert_array_equal(got, np.array(model(mk(w.copy(), b.copy()), x)()))
        np.testing.assert_allclose(got, oracle(w, b, x), rtol=1e-13, atol=1e-15)


def test_bind_refuses_a_tree_of_another_kind_and_changes_nothing():
    rng = np.random.default_rng(5)
    x, w, b = rng.normal(size=4), rng.normal(size=1), rng.normal(size=1)
    g = model(Fields(w, b), x)
    before = np.array(g())
    with pytest.raises(ValueError, match=r"eagle.Graph.bind: 'p' takes a tree of structure") as e:
        g.bind(p=Boxed(w + 1.0, b))
    assert "Fields" in str(e.value)
    np.testing.assert_array_equal(np.array(g()), before)
    with pytest.raises(ValueError, match=r"eagle.Graph.bind: 'p \(leaf 0 of .*changed shape/dtype"):
        g.bind(p=Fields(np.zeros(2), b))
    np.testing.assert_array_equal(np.array(g()), before)
