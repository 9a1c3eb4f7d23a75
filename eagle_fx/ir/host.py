"""host: a pure host function of graph values, what derivative rules of host nodes lower to.

    outs = host(*ins; fn, avals_out, name, rules)    fn(list of NumPy arrays) -> list of NumPy arrays

Unlike `opaque` (a host node with declared reads and writes of the caller's arrays, run for its
effect), `host` reads values the graph made (tangents, cotangents) and returns new ones.
"""
from __future__ import annotations

from hawk_fx.core import Primitive, abstract_eval, pp_params_rules

host_p = Primitive("host", multiple_results=True)


@abstract_eval.register(host_p)
def _host_abstract(*avals, fn, avals_out, name, rules=None):
    return list(avals_out)


pp_params_rules[host_p] = lambda params: {"fn": params["name"]}
