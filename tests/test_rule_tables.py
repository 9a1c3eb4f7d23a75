"""Every eagle primitive has a rule, or a documented refusal, in every interpreter's table; a missing
rule's error names the table and the primitive."""
import pytest

from hawk_fx.core import Primitive, RuleTable, abstract_eval, pp_params_rules

from eagle_fx import ir

from eagle_fx.ir import dot

from eagle_fx.backends import cuda_lower, fusion, jax_lower, numpy as numpy_backend, recording
from eagle_fx.transforms import jvp_graph, program, split, structure, vjp_graph, vmap

PRIMS = sorted((v for v in vars(ir).values() if isinstance(v, Primitive)), key=lambda p: p.name)
EAGLE = PRIMS          # batch_broadcast (vmap's) included

# the tables every primitive needs an entry in
EVERY = {
    "abstract evaluation": abstract_eval,
    "jvp": jvp_graph.jvp_rules,
    "reverse (vjp / transpose)": vjp_graph.vjp_rules,
    "batching": vmap.batch_rules,
    "NumPy lowering": numpy_backend.numpy_rules,
    "JAX lowering": jax_lower.graph_rules,
    "CUDA lowering": cuda_lower.cuda_rules,
}

# primitives with params (printing shows them through a rule), and the ones drawing tells apart
WITH_PARAMS = [p for p in PRIMS if p not in (ir.cell_not_p, ir.cell_and_p, ir.cell_or_p, ir.add_any_p,
                                             ir.cell_inc_p, ir.cell_rev_p)]
DRAWN = [ir.call_p, ir.opaque_p, ir.cond_p, ir.switch_p, ir.while_p]

# tables of one family of primitives (the others have no rule there on purpose: a plain write, a copy
# as it is, a node with its name, nothing inside to fuse, as each table's module says)
WITH_SUBPROGRAMS = [ir.cond_p, ir.switch_p, ir.while_p]
FAMILY = [(t, ir.STRUCTURE) for t in (structure.transpose_rules, structure.batch_rules, structure.array_rules,
                                      structure.array_transpose_rules)] + [
    (pp_params_rules, WITH_PARAMS),
    (dot.draw_rules, DRAWN),
    (program.copy_rules, WITH_SUBPROGRAMS + [ir.call_p, ir.stack_push_p]),
    (vjp_graph.forward_rules, [ir.call_p, ir.while_p]),
    (fusion.fuse_inside_rules, WITH_SUBPROGRAMS + [ir.revolve_p]),
    (split.unread_rules, [ir.call_p]),
    (split.zero_rules, [ir.add_any_p]),
] + [(t, WITH_SUBPROGRAMS) for t in (recording.gap_rules, recording.steady_rules, recording.walk_rules,
                                     recording.thread_rules)] + [(recording.read_rules, [ir.cond_p, ir.switch_p])]


def test_the_primitives_are_found():
    assert {p.name for p in PRIMS} >= {"call", "opaque", "cond", "switch", "while", "revolve", "zeros", "add_any",
                                       "stack_push", "stack_read", "cell_inc", "cell_rev", "slice", "update",
                                       "reshape", "concat", "cell_not", "cell_and", "cell_or"}


@pytest.mark.parametrize("name", sorted(EVERY))
def test_every_primitive_has_a_rule_or_a_refusal(name):
    table = EVERY[name]
    missing = [p.name for p in EAGLE if p not in table]
    assert not missing, f"no {name} rule for {missing}"


@pytest.mark.parametrize("table,prims", FAMILY, ids=lambda x: getattr(x, "rule", None))
def test_each_family_has_its_rules(table, prims):
    missing = [p.name for p in prims if p not in table]
    assert not missing, f"no {table.rule} rule for {missing}"


def _tables():
    return list(EVERY.values()) + [t for t, _ in FAMILY]


@pytest.mark.parametrize("table", _tables(), ids=lambda t: t.rule)
def test_refusals_are_documented(table):
    assert isinstance(table, RuleTable)
    for p in table.refused:
        assert p in table and (table[p].__doc__ or "").strip(), f"{table.rule}: the refusal of {p} says not why"


def test_the_refusals_that_are_meant():
    assert ir.opaque_p in jvp_graph.jvp_rules.refused and ir.revolve_p in jvp_graph.jvp_rules.refused
    assert ir.opaque_p in vjp_graph.vjp_rules.refused and ir.stack_read_p in vjp_graph.vjp_rules.refused
    assert ir.revolve_p in jax_lower.graph_rules.refused
    assert ir.batch_sum_p in cuda_lower.cuda_rules.refused
    # vmap batches a batched program again (a Jacobian's, another vmap's): batch_broadcast has a rule
    assert vmap.batch_broadcast_p in vmap.batch_rules and vmap.batch_broadcast_p not in vmap.batch_rules.refused


@pytest.mark.parametrize("table", _tables(), ids=lambda t: t.rule)
def test_a_missing_rule_names_the_table_and_the_primitive(table):
    stranger = Primitive("stranger")
    with pytest.raises(NotImplementedError) as info:
        table[stranger]
    assert str(info.value) == f"no {table.rule} rule for primitive 'stranger'"
    assert "stranger" in str(info.value) and table.rule in str(info.value)


def test_refuse_registers_a_rule_that_raises():
    t = RuleTable("demo")
    p = Primitive("p")

    @t.refuse(p)
    def _no(*args):
        """demo refuses p."""
        raise ValueError("refused")
    assert p in t and p in t.refused
    with pytest.raises(ValueError, match="refused"):
        t[p]()


def test_while_operands_split_the_layout():
    from hawk_fx.core import Eqn, Program, Var
    cell = ir.U32_CELL
    turn, c, k = Var(cell), Var(cell), Var(cell)
    body = Program([turn, c, k], [], [k])
    trip, const, carry = Var(cell), Var(cell), Var(cell)
    e = Eqn(ir.while_p, [trip, const, carry], [Var(cell)],
            {"body": body, "cond": None, "cap": None, "counted": True, "n_consts": 1, "inplace": ()})
    w = ir.WhileOperands(e)
    assert (w.head, w.trip, w.consts, w.carries, w.rest) == (1, trip, [const], [carry], [])
    assert w.body_parts(body.inputs) == (turn, [c], [k])
    assert w.guard_parts(["x", "y"]) == (["x"], ["y"])
    assert ir.WhileOperands(e, ["t", "c", "k"]).carries == ["k"]
    uncounted = e.replace(inputs=[const, carry], params=dict(e.params, counted=False))
    w = ir.WhileOperands(uncounted)
    assert (w.head, w.trip, w.consts, w.carries) == (0, None, [const], [carry])


def test_while_operands_split_a_revolve():
    from hawk_fx.core import Eqn, Program, Var
    cell = ir.U32_CELL
    fwd = Program([Var(cell), Var(cell), Var(cell)], [], [Var(cell)])
    turns, const, carry, ct, total = (Var(cell) for _ in range(5))
    e = Eqn(ir.revolve_p, [turns, const, carry, ct, total], [Var(cell), Var(cell)],
            {"forward": fwd, "backward": fwd, "checkpoints": 2, "n_consts": 1})
    w = ir.WhileOperands(e)
    assert (w.head, w.trip, w.consts, w.carries, w.rest) == (1, turns, [const], [carry], [ct, total])
