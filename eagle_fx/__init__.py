"""eagle_fx: graphs of hawk_fx kernels, staged from plain Python into Programs and replayed.

    @eagle_fx.Graph.builder
    def chain(x):
        g = eagle_fx.Graph()
        g.result = square(scale(x, 2.0, 1.0))
        return g

    g = chain(x)        # build once
    g()                 # replay
"""
from . import diff
from .frontend.cache import clear_caches
from .frontend.eager import disable_staging
from .api import make_graph, make_program
from .batching import vmap
from .derivatives import grad, jvp, value_and_grad, vjp
from .jacobians import hessian, jacfwd, jacrev
from .frontend.building import Branch, Fork, opaque
from .graph import Graph
from .frontend.staging import UncappedLoopWarning
from .to_jax import to_jax
from .simulate import SimResult, simulate
from .collect import collect
from . import tree
from . import host_rules  # noqa: F401  (host nodes' derivative rules in every table)
from .custom import custom_jvp, custom_vjp
from .linear import linear_transpose, linearize
from .shapes import ShapeDtypeStruct, eval_shape
from .implicit import fixed_point
from .backends.select import use_backend

__version__ = "0.1.0"

__all__ = ["diff", "make_program", "make_graph", "vmap", "vjp", "jvp", "grad", "jacfwd", "jacrev", "value_and_grad",
           "hessian", "Graph", "Fork", "Branch", "opaque", "UncappedLoopWarning", "clear_caches", "to_jax",
           "disable_staging", "simulate", "SimResult", "collect",
           "tree", "linearize", "linear_transpose", "eval_shape", "ShapeDtypeStruct", "custom_vjp", "custom_jvp",
           "fixed_point", "use_backend"]
