"""Trust follow-ups: refusals that name the user's builder and line, and say what to change."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
from conftest import line_of, refused
from tour_kernels import add, dbl


def _where(builder, fragment):
    """`builder:line` as refusals write it: lines counted from the decorator."""
    return f"{builder.__name__}:{line_of(builder, fragment) - line_of(builder, '@eagle') + 1}"


@eagle.Graph.builder
def asserts_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    assert y
    g.result = y
    return g


@eagle.Graph.builder
def bool_of_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = add(x, y) if bool(y) else y
    return g


@eagle.Graph.builder
def or_of_planes(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = y or x
    return g


@eagle.Graph.builder
def filters_on_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = [add(x, y) for _ in range(2) if y]
    return g


@pytest.mark.parametrize("builder, fragment", [(asserts_a_plane, "assert y"), (bool_of_a_plane, "bool(y)"),
                                               (or_of_planes, "y or x"), (filters_on_a_plane, "if y]")])
def test_a_plane_as_a_python_bool_in_a_builder(builder, fragment):
    """Inside a builder the refusal names the builder and line, and says which constructs stage a
    device condition (it used to say 'outside a builder's if/while')."""
    msg = refused(TypeError, lambda: builder(np.ones(3)), f"eagle.Graph.builder {_where(builder, fragment)}: ",
                  "plane 'y'", "used as a Python bool", "only a builder's own if/while/match",
                  "one-cell uint32 array", "hm.uint32(hawk.sum(")
    assert "outside" not in msg
