"""A Program as one pure JAX function: the graph-level rules of the JAX backend.

`lower(prog, n)` gives `fn(*inputs) -> outputs` over jax values, ready for jax.jit (the backend),
jax.custom_vjp and jax.vmap (to_jax). Each primitive has one rule in `graph_rules`:

    call                    the kernel body as jax.numpy (hawk_fx/emit/jax.py)
    cond / switch           lax.cond / lax.switch; batched (masked): every arm, merged per instance
    while                   lax.while_loop with the turn counter in the carry, tested against the
                            cap and the trip count; batched: run until every instance is done,
                            finished instances frozen
    opaque                  jax.experimental.io_callback(ordered=True) around the host function,
                            which sees its declared arrays hold the graph's values
    parallel branches       plain dataflow (they are already sequenced in the Program)
    derivative primitives   zeros, add_any, stack_push/read (.at[].set / indexing), cell_inc/rev
    slice / update / reshape / concat   indexing, .at[index].set, jnp.reshape, jnp.concatenate

`inplace` pairs mean nothing here: every output is a new value. Which outputs are the caller's
written arrays is the executable's concern (backends/jax.py).
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Literal, Program, RuleTable, Var
from hawk_fx.emit.jax import run_call

from .. import ir

graph_rules = RuleTable("JAX graph lowering")    # prim -> fn(lw, e, ins) -> list of output values


class LoweringError(ValueError):
    """A Program this backend cannot lower as asked (raised at build, before anything runs)."""


def _jnp():
    import jax.numpy as jnp
    return jnp


def _lax():
    from jax import lax
    return lax


def fit(x, aval):
    """x as a value of exactly `aval` (a literal, or a narrower value where branches must agree)."""
    jnp = _jnp()
    x = jnp.asarray(x, dtype=aval.dtype)
    return x if x.shape == aval.shape else jnp.broadcast_to(x, aval.shape)


class Lowering:
    """The state of one lowering: the sample count, where opaque operands live, and the host
    checks a replay makes (a counted loop's saved turns against the trip count it is given)."""

    def __init__(self, n: int, host_arrays=None, opaque_ok: str | None = None):
        self.n = n
        self.host_arrays = host_arrays      # per Program input: the caller's NumPy array (None: not host)
        self.opaque_ok = opaque_ok          # None: opaque nodes run; else why they cannot (the refusal)
        self.root: dict[Var, int] = {}      # a Var -> the Program input whose buffer it is (Mutable chains)
        self.loop_trips: list = []          # the trip atoms of the enclosing counted loops
        self.trip_checks: list = []         # (input index, capacity): a replay checks trip <= capacity
        self.host_errors: list = []         # what an opaque node raised during the running replay
        self.has_host = False               # the Program calls host nodes (a replay waits for them)
        self.scan_loops = False             # capped loops as masked lax.scan: JAX can transpose them

    def eval(self, prog: Program, args) -> list:
        env = dict(zip(prog.inputs, args))

        def read(a):
            return a.value if isinstance(a, Literal) else env[a]

        for e in prog.eqns:
            for j, i in e.params.get("inplace", ()) or ():
                a = e.inputs[i]
                if isinstance(a, Var) and a in self.root:
                    self.root[e.outputs[j]] = self.root[a]
            outs = graph_rules[e.prim](self, e, [read(a) for a in e.inputs])
            for v, x in zip(e.outputs, outs):
                env[v] = x
        return [read(a) for a in prog.outputs]

    def sub(self, prog: Program, operands, atoms) -> list:
        """Evaluate a sub-program whose inputs are the operands (atoms: the outer atoms they are)."""
        for v, a in zip(prog.inputs, atoms):
            if isinstance(a, Var) and a in self.root:
                self.root[v] = self.root[a]
        return [fit(x, v.aval) for x, v in zip(self.eval(prog, operands), prog.outputs)]


def lower(prog: Program, n: int, host_arrays=None, opaque_ok=None, scan_loops=False):
    """(fn, lowering): fn(*inputs) -> outputs of `prog`, a pure function of jax values. The
    lowering's trip_checks are filled once fn has been traced. scan_loops: a loop with a cap runs
    as a lax.scan of cap masked turns (JAX can linearize and transpose it; a while_loop it cannot)."""
    from ..custom import inline_custom          # custom rules are the transforms': the body runs
    prog = inline_custom(prog)
    lw = Lowering(n, host_arrays, opaque_ok)
    lw.scan_loops = scan_loops

    def fn(*inputs):
        lw.root = {v: k for k, v in enumerate(prog.inputs)}
        lw.trip_checks = []
        ins = [fit(x, v.aval) for x, v in zip(inputs, prog.inputs)]
        return [fit(x, a.aval) for x, a in zip(lw.eval(prog, ins), prog.outputs)]
    return fn, lw


# -- kernel calls and host nodes -------------------------------------------------------------------

@graph_rules.register(ir.call_p)
def _call(lw, e, ins):
    spec = e.params["spec"]
    nparams = len(spec.kernel.param_names)
    return run_call(spec, ins[:nparams], e.params["n"], tuple(e.params.get("batch", ())), e.params.get("in_batched"))


@graph_rules.register(ir.opaque_p)
def _opaque(lw, e, ins):
    from jax.experimental import io_callback
    fn = e.params["fn"]
    name = getattr(fn, "__name__", "fn")
    where = f" ({e.info.where})" if e.info.where else ""
    if lw.opaque_ok is not None:
        raise LoweringError(f"eagle_fx jax backend: the opaque node {name!r}{where} {lw.opaque_ok}")
    arrays = []
    for a in e.inputs:
        k = lw.root.get(a) if isinstance(a, Var) else None
        arr = lw.host_arrays[k] if k is not None and lw.host_arrays is not None else None
        if arr is None:
            raise LoweringError(f"eagle_fx jax backend: the opaque node {name!r}{where} touches a plane the graph "
                                "makes; under jit a host node sees only the caller's NumPy arrays: declare "
                                "builder arguments (or arrays made outside the builder) in its reads/writes")
        arrays.append(arr)
    lw.has_host = True
    written = [i for _, i in e.params["inplace"]]
    shapes = [_shape_struct(e.inputs[i].aval) for i in written]

    def host(*values):
        # an exception cannot cross XLA: it is kept, the rest of the replay skips its host nodes,
        # and the executable raises it instead of writing anything back
        if not lw.host_errors:
            for arr, v in zip(arrays, values):
                if arr.flags.writeable:     # read-only: an input the graph only reads (enqueue locks it), current
                    np.copyto(arr, np.asarray(v))
            try:
                fn()
            except BaseException as exc:
                lw.host_errors.append(exc)
        return [np.array(arrays[i]) for i in written]

    return io_callback(host, shapes, *ins, ordered=True)


def _shape_struct(aval):
    import jax
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)




# -- cells -----------------------------------------------------------------------------------------

def _cell(fn):
    def rule(lw, e, ins):
        jnp = _jnp()
        return [fn(jnp, *[jnp.asarray(x) != 0 for x in ins]).astype(e.outputs[0].aval.dtype)]
    return rule


graph_rules[ir.cell_not_p] = _cell(lambda jnp, a: ~a)
graph_rules[ir.cell_and_p] = _cell(lambda jnp, a, b: a & b)
graph_rules[ir.cell_or_p] = _cell(lambda jnp, a, b: a | b)
graph_rules[ir.batch_sum_p] = lambda lw, e, ins: [fit(_jnp().sum(_jnp().asarray(ins[0]), axis=e.params.get("axis", 0)),
                                                        e.outputs[0].aval)]
graph_rules[ir.batch_broadcast_p] = lambda lw, e, ins: [fit(_jnp().expand_dims(ins[0], e.params["axis"])
                                                              if e.params.get("axis") else ins[0], e.outputs[0].aval)]


# -- control flow ----------------------------------------------------------------------------------

def _mask(pred_mask, aval):
    """A per-instance mask (B, 1) shaped to broadcast over a (B, ...) value."""
    return pred_mask.reshape(pred_mask.shape[:1] + (1,) * (len(aval.shape) - 1))


@graph_rules.register(ir.cond_p)
def _cond(lw, e, ins):
    jnp, lax = _jnp(), _lax()
    pred, ops, atoms = ins[0], ins[1:], e.inputs[1:]
    false_p, true_p = e.params["branches"]
    if e.params.get("masked"):
        f = lw.sub(false_p, ops, atoms)
        t = lw.sub(true_p, ops, atoms)
        m = jnp.asarray(pred) != 0
        return [jnp.where(_mask(m, v.aval), a, b) for v, a, b in zip(e.outputs, t, f)]
    return lax.cond(jnp.asarray(pred)[0] != 0, lambda o: lw.sub(true_p, o, atoms),
                    lambda o: lw.sub(false_p, o, atoms), list(ops))


@graph_rules.register(ir.switch_p)
def _switch(lw, e, ins):
    jnp, lax = _jnp(), _lax()
    pred, ops, atoms = jnp.asarray(ins[0]), ins[1:], e.inputs[1:]
    cases, arms = e.params["cases"], e.params["branches"]
    if e.params.get("masked"):
        outs = lw.sub(arms[-1], ops, atoms)
        for c, arm in zip(cases, arms[:-1]):
            got = lw.sub(arm, ops, atoms)
            m = pred == c
            outs = [jnp.where(_mask(m, v.aval), a, b) for v, a, b in zip(e.outputs, got, outs)]
        return outs
    index = jnp.int32(len(cases))
    for k in reversed(range(len(cases))):
        index = jnp.where(pred[0] == cases[k], jnp.int32(k), index)
    return lax.switch(index, [lambda o, arm=arm: lw.sub(arm, o, atoms) for arm in arms], list(ops))


def _guard(lw, cond, consts, c_atoms, carries, carry_atoms):
    if cond is None:
        return None
    return lw.sub(cond, list(consts) + list(carries), list(c_atoms) + list(carry_atoms))[0]


@graph_rules.register(ir.while_p)
def _while(lw, e, ins):
    jnp, lax = _jnp(), _lax()
    body, cond = e.params["body"], e.params["cond"]
    cap, counted = e.params["cap"], e.params["counted"]
    ops, atoms = ir.WhileOperands(e, ins), ir.WhileOperands(e)
    trip = jnp.asarray(ops.trip) if counted else None
    trip_atom = atoms.trip
    consts, init = ops.consts, [fit(x, v.aval) for x, v in zip(ops.carries, e.outputs)]
    c_atoms, i_atoms = atoms.consts, atoms.carries
    carry_atoms = list(body.outputs)          # inside the loop a carry is the body's last output
    masked = e.params.get("masked")
    lw.loop_trips.append(trip_atom)

    def run_body(t, carries):
        ctr = t.astype(np.uint32).reshape(1)
        return lw.sub(body, [ctr] + list(consts) + list(carries), [None] + c_atoms + i_atoms)

    try:
        if lw.scan_loops and cap is not None:
            return _scanned(lw, e, trip, cap, init, masked, run_body,
                            lambda carries: _guard(lw, cond, consts, c_atoms, carries, i_atoms))
        if not masked:
            def test(state):
                t, carries = state
                ok = jnp.bool_(True)
                if cap is not None:
                    ok = ok & (t < cap)
                if counted:
                    ok = ok & (t < trip.reshape(-1)[0].astype(np.int64))
                g = _guard(lw, cond, consts, c_atoms, carries, i_atoms)
                if g is not None:
                    ok = ok & (jnp.asarray(g).reshape(-1)[0] != 0)
                return ok

            def step(state):
                t, carries = state
                return t + 1, run_body(t, carries)

            return list(lax.while_loop(test, step, (jnp.int64(0), list(init)))[1])

        # batched: each instance runs while its own guard holds; finished instances keep their carries
        if not init:            # it carries nothing and writes nothing: no turn has an effect
            return []
        def live(t, carries):
            m = jnp.ones(init[0].shape[:1] + (1,), bool)
            g = _guard(lw, cond, consts, c_atoms, carries, i_atoms)
            if g is not None:
                m = m & (jnp.asarray(g) != 0).reshape(m.shape[0], -1)[:, :1]
            if counted:
                m = m & (trip.astype(np.int64) > t).reshape(-1, 1)
            return m

        def test(state):
            t, carries, m = state
            ok = jnp.any(m)
            return ok & (t < cap) if cap is not None else ok

        def step(state):
            t, carries, m = state
            new = run_body(t, carries)
            carries = [jnp.where(_mask(m, v.aval), a, b) for v, a, b in zip(e.outputs, new, carries)]
            return t + 1, carries, m & live(t + 1, carries)

        return list(lax.while_loop(test, step, (jnp.int64(0), list(init), live(jnp.int64(0), init)))[1])
    finally:
        lw.loop_trips.pop()


def _scanned(lw, e, trip, cap, init, masked, run_body, guard):
    """A capped loop as lax.scan over its cap: a turn after the loop has ended keeps the carries
    (per instance when batched), so the values equal the while_loop's."""
    jnp, lax = _jnp(), _lax()
    if not init:
        return []

    def alive(t, carries):
        shape = init[0].shape[:1] + (1,) if masked else ()
        m = jnp.ones(shape, bool)
        g = guard(carries)
        if g is not None:
            g = jnp.asarray(g) != 0
            m = m & (g.reshape(shape[0], -1)[:, :1] if masked else g.reshape(-1)[0])
        if trip is not None:
            more = trip.astype(np.int64) > t
            m = m & (more.reshape(-1, 1) if masked else more.reshape(-1)[0])
        return m

    def step(state, _):
        t, carries, m = state
        new = run_body(t, carries)
        carries = [jnp.where(_mask(m, v.aval) if masked else m, a, b) for v, a, b in zip(e.outputs, new, carries)]
        return (t + 1, carries, m & alive(t + 1, carries)), None

    return list(lax.scan(step, (jnp.int64(0), list(init), alive(jnp.int64(0), init)), None, length=cap)[0][1])


# -- the primitives of derivative programs ---------------------------------------------------------

graph_rules[ir.zeros_p] = lambda lw, e, ins: [_jnp().zeros(e.params["aval"].shape, e.params["aval"].dtype)]
graph_rules[ir.add_any_p] = lambda lw, e, ins: [fit(_jnp().asarray(ins[0]) + _jnp().asarray(ins[1]),
                                                    e.outputs[0].aval)]
graph_rules[ir.cell_inc_p] = lambda lw, e, ins: [fit(_jnp().asarray(ins[0]) + 1, e.outputs[0].aval)]


@graph_rules.register(ir.cell_rev_p)
def _cell_rev(lw, e, ins):
    jnp = _jnp()
    turns, turn = (jnp.asarray(x).astype(np.int64) for x in ins)
    return [fit(jnp.maximum(turns - 1 - turn, 0), e.outputs[0].aval)]


@graph_rules.register(ir.stack_push_p)
def _stack_push(lw, e, ins):
    stack, turn, value = ins
    cap = e.params["cap"]
    if cap is None:
        raise LoweringError(f"eagle_fx jax backend: reverse mode through the device loop at {e.info.where}, which has "
                            "no bound on its turns (an uncapped `while`, or a counted loop whose trip count is "
                            "computed in the graph): XLA needs a static size for its stack of saved turns. Cap the "
                            "loop (`for _ in range(N): if not cell: break`), or run it on the NumPy backend, whose "
                            "stacks grow with the turns run")
    trip = lw.loop_trips[-1] if lw.loop_trips else None
    if isinstance(trip, Var) and trip in lw.root:        # a replay checks the trip count it is given
        lw.trip_checks.append((lw.root[trip], cap))
    i = _jnp().asarray(turn).reshape(-1)[0].astype(np.int64)
    value = _jnp().asarray(value, dtype=stack.dtype)
    if e.params["batched"]:
        return [stack.at[:, i].set(value, **_out_sharding(value, 1))]
    return [stack.at[i].set(value, **_out_sharding(value, 0))]


def _out_sharding(value, axis):
    """`out_sharding=` for writing `value` into a stack along a new axis at `axis`, where the value
    is sharded over a mesh with Explicit axes (jax.make_mesh's default): JAX asks for the result's
    sharding then, and it is the value's with the stack's turn axis unsharded. {} elsewhere."""
    import jax
    try:
        sh = jax.typeof(value).sharding
        explicit = jax.sharding.AxisType.Explicit in tuple(sh.mesh.axis_types)
    except (AttributeError, TypeError):
        return {}
    spec = tuple(sh.spec) + (None,) * (value.ndim - len(tuple(sh.spec)))
    if not explicit or not any(s is not None for s in spec):
        return {}
    return {"out_sharding": jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec(
        *spec[:axis], None, *spec[axis:]))}


@graph_rules.refuse(ir.revolve_p)
def _revolve(lw, e, ins):
    """A checkpointed reverse pass runs on the NumPy backend only."""
    raise LoweringError(f"eagle_fx jax backend: the reverse pass through the device loop at {e.info.where} is "
                        "checkpointed (checkpoints=), which runs on the NumPy backend; on JAX, take the gradient "
                        "without checkpoints")


@graph_rules.register(ir.stack_read_p)
def _stack_read(lw, e, ins):
    jnp = _jnp()
    stack, turn = jnp.asarray(ins[0]), jnp.asarray(ins[1])
    if e.params["turn_batched"]:                  # a turn per instance
        rows = turn[:, 0].astype(np.int64)
        out = stack[jnp.arange(stack.shape[0]), rows] if e.params["batched"] else stack[rows]
    else:
        i = turn.reshape(-1)[0].astype(np.int64)
        out = stack[:, i] if e.params["batched"] else stack[i]
    return [fit(out, e.outputs[0].aval)]


# -- array structure (views, x[idx] = value, reshape, concatenate): copies, as everywhere here ---------

graph_rules[ir.slice_p] = lambda lw, e, ins: [fit(_jnp().asarray(ins[0])[ir.numpy_index(e.params["index"])],
                                                  e.outputs[0].aval)]
graph_rules[ir.reshape_p] = lambda lw, e, ins: [_jnp().reshape(_jnp().asarray(ins[0]), e.params["shape"])]
graph_rules[ir.concat_p] = lambda lw, e, ins: [fit(_jnp().concatenate([_jnp().asarray(x) for x in ins],
                                                                      axis=e.params["axis"]), e.outputs[0].aval)]


@graph_rules.register(ir.update_p)
def _update(lw, e, ins):
    jnp = _jnp()
    base, value = jnp.asarray(ins[0]), ins[1]
    value = jnp.asarray(value).astype(base.dtype)       # NumPy's assignment casts to the base's dtype
    return [base.at[ir.numpy_index(e.params["index"])].set(value)]
