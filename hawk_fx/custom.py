"""A kernel with a per-sample derivative rule, as jax.custom_jvp on a one-sample function.

    @hawk_fx.custom_jvp
    @hawk_fx.kernel
    def softplus(x: Scalar) -> Scalar:
        return hm.log(1.0 + hm.exp(x))

    @softplus.defjvp
    def softplus_jvp(x: Scalar, t: Scalar):            # the kernel's parameters, then a tangent each
        return hm.log(1.0 + hm.exp(x)), t / (1.0 + hm.exp(-x))

The rule is a kernel too (its parameters annotated with roles; it returns (result, tangent of
the result) for one sample). Called outside a graph, the kernel runs as it is. Called inside an
eagle_fx builder, it is staged with its rule (eagle_fx registers the stager): eagle_fx's transforms
use the rule in forward mode and transpose it in reverse mode, as eagle_fx.custom_jvp does.
"""
from __future__ import annotations

from .context import CONTEXT
from .kernel import Kernel, kernel

STAGER = []          # eagle_fx appends its stager: fn(custom kernel, args) -> the staged result


class custom_jvp:
    """A kernel with a per-sample jvp rule: f.defjvp(rule), rule(*params, *tangents) -> (result, tangent)."""

    def __init__(self, k):
        if not isinstance(k, Kernel):
            raise TypeError(f"hawk_fx.custom_jvp: takes a @hawk_fx.kernel, got {type(k).__name__} (decorate the "
                            "function with @hawk_fx.kernel first, under @hawk_fx.custom_jvp)")
        self.kernel, self.rule = k, None
        self.name = self.__name__ = k.name
        self.__doc__ = k.__doc__

    def defjvp(self, fn):
        """The rule: a one-sample function of the kernel's parameters, then one tangent per parameter."""
        rule = fn if isinstance(fn, Kernel) else kernel(fn)
        n = len(self.kernel.param_names)
        if len(rule.param_names) != 2 * n:
            raise TypeError(f"hawk_fx.custom_jvp({self.name}).defjvp: the rule takes {len(rule.param_names)} "
                            f"parameters; it takes the kernel's {n} ({', '.join(self.kernel.param_names)}), then a "
                            "tangent for each")
        self.rule = rule
        return rule

    def __call__(self, *args):
        if CONTEXT.kernel_traces:
            raise TypeError(f"hawk_fx.custom_jvp({self.name}): called inside another kernel's body, where its rule "
                            "would not be seen by that kernel's derivatives; call it from an eagle_fx builder (its "
                            "transforms use the rule), or call the plain kernel's function in the body")
        if CONTEXT.graph_stagers and STAGER:
            if self.rule is None:
                raise TypeError(f"hawk_fx.custom_jvp({self.name}): no rule yet; define it with @{self.name}.defjvp")
            return STAGER[-1](self, args)
        return self.kernel(*args)

    def __repr__(self):
        return f"<hawk_fx.custom_jvp {self.name}>"
