"""The JAX backend: a Program compiled once, at build, into one XLA executable.

Two ways in, one lowering (jax_lower.py):

* NumPy arrays with `eagle_fx.Graph(backend="jax")`: the NumPy backend's semantics. Every replay
  reads the caller's arrays (cells included), runs the executable, and writes the new values of
  Mutable arguments and `buffer=` arrays back into the caller's arrays; results are stable NumPy
  arrays the replay overwrites; `bind` swaps an array without compiling again.
* jax.Array arguments: arrays are immutable, so the graph carries them. A replay reads the arrays
  bound now; a Mutable write rebinds that argument to the new value (the next replay, and
  `g.argument(name)`, see it; the caller's jax.Array is unchanged); `g.result` holds the jax.Arrays of
  the last replay, new arrays each replay. Sharded arguments keep their sharding.

With a `mesh` (a jax.sharding.Mesh, one axis), NumPy planes are split over its devices along the
sample axis (last); cells and Params are replicated; reductions and loop guards become
collectives in XLA's partitioner.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Program, Var
from hawk_fx.emit.jax import is_jax_array, require_jax
from hawk_fx.context import CONTEXT

from .aligned import SpanInput, aligned_empty, is_aligned, span_lead, span_size
from .jax_lower import LoweringError, lower

__all__ = ["JaxExecutable", "LoweringError", "check_arrays", "follow_committed", "plane_sharding"]



def _arg(names, k):
    name = names[k] if names and k < len(names) else None
    return f"argument {name!r}" if name else f"array {k} of the graph (one the builder reads by closure or a buffer=)"


def check_arrays(arrays, names, mesh, api="eagle.Graph"):
    """Refuse, before anything runs, what one executable cannot take: NumPy and jax arrays mixed,
    jax arrays on different meshes, a mesh whose size does not divide the sample count."""
    kinds = [is_jax_array(a) for a in arrays]
    if any(kinds) and not all(kinds):
        j, h = kinds.index(True), kinds.index(False)
        raise TypeError(f"{api}: backend 'jax' takes NumPy arrays or jax.Arrays, not both: {_arg(names, j)} is a "
                        f"jax.Array and {_arg(names, h)} is a {type(arrays[h]).__name__}; pass jnp.asarray(...) "
                        "for every array (or NumPy arrays for every one)")
    if all(kinds) and arrays:
        meshes = []
        for k, a in enumerate(arrays):
            m = getattr(getattr(a, "sharding", None), "mesh", None)
            if m is not None and all(m is not x and m != x for _, x in meshes):
                meshes.append((k, m))
        if len(meshes) > 1:
            (k0, m0), (k1, m1) = meshes[:2]
            raise ValueError(f"{api}: {_arg(names, k0)} and {_arg(names, k1)} are sharded over different meshes "
                             f"({dict(m0.shape)} and {dict(m1.shape)}); a graph runs on one mesh: "
                             "jax.device_put them with one NamedSharding")
        if mesh is not None and meshes and meshes[0][1] != mesh:
            raise ValueError(f"{api}: {_arg(names, meshes[0][0])} is sharded over another mesh than the graph's "
                             "mesh=; drop mesh= (jax.Arrays keep their own sharding) or device_put it on that mesh")
        check_processes_agree(arrays, names, api)
    return bool(arrays) and all(kinds)


def check_processes_agree(arrays, names, api="eagle.Graph"):
    """On a mesh that spans processes, each process builds the graph from its own arguments: they
    must agree on every global shape and dtype, and on the values of the arrays they replicate (a
    cell that decides a loop), or the processes would run different programs, or one loop for
    different turns, and wait on each other. One small all-gather at build checks it (nothing runs
    when every array lives in this process)."""
    spans = [k for k, a in enumerate(arrays) if is_jax_array(a) and not getattr(a, "is_fully_addressable", True)]
    if not spans:
        return
    import hashlib
    from jax.experimental import multihost_utils
    rows = []
    for k in spans:
        a = arrays[k]
        h = hashlib.blake2b(f"{tuple(a.shape)} {np.dtype(a.dtype).str}".encode(), digest_size=8)
        v = hashlib.blake2b(np.asarray(a.addressable_data(0)).tobytes() if a.sharding.is_fully_replicated else b"",
                            digest_size=8)
        rows.append([int.from_bytes(h.digest(), "little", signed=True), int.from_bytes(v.digest(), "little",
                                                                                        signed=True)])
    seen = np.asarray(multihost_utils.process_allgather(np.array(rows, np.int64)))     # (processes, arrays, 2)
    for j, k in enumerate(spans):
        if (seen[:, j, 0] != seen[0, j, 0]).any():
            raise ValueError(f"{api}: {_arg(names, k)} has global shape {tuple(arrays[k].shape)} here and another in "
                             "another process: every process must build the graph from process-local data of the same "
                             "shape (jax.make_array_from_process_local_data)")
        if (seen[:, j, 1] != seen[0, j, 1]).any():
            raise ValueError(f"{api}: {_arg(names, k)} is replicated over the mesh but holds different values in "
                             "different processes; a replicated array (a cell deciding a loop) must be the same "
                             "everywhere: give every process the same value")


def reads_after_writes(prog):
    """(written input, read input) index pairs where an equation reads an argument after another
    was written, or one equation with sub-programs (a loop's next turn, an arm's later call) both
    writes one and reads the other. Only there can two arguments' shared memory change the answer:
    one kernel call reads all its inputs before it writes."""
    root = {v: k for k, v in enumerate(prog.inputs)}
    written, pairs = set(), set()
    for e in prog.eqns:
        reads = {root[a] for a in e.inputs if isinstance(a, Var) and a in root}
        wrote = set()
        for j, i in e.params.get("inplace", ()) or ():
            a = e.inputs[i]
            if isinstance(a, Var) and a in root:
                root[e.outputs[j]] = root[a]
                wrote.add(root[a])
        pairs |= {(w, r) for w in written for r in reads}
        if any(isinstance(p, Program) or isinstance(p, tuple) and any(isinstance(q, Program) for q in p)
               for p in e.params.values()):
            pairs |= {(w, r) for w in wrote for r in reads}
        written |= wrote
    return {(w, r) for w, r in pairs if w != r}


def refuse_overlap(arrays, pairs, names, api="eagle.Graph(backend='jax')"):
    """Refuse NumPy arguments that share memory where one is written and the other read after it
    (`reads_after_writes`): the NumPy backend updates them in place, so the write is seen through
    the other, while the JAX backend copies each to the device on its own and would silently
    compute with the old values."""
    for i, k in sorted(pairs):
        a, b = arrays[i], arrays[k]
        if np.may_share_memory(a, b) and np.shares_memory(a, b):      # one array passed twice too
            raise ValueError(f"{api}: {_arg(names, i)} is written and shares memory with {_arg(names, k)}, which "
                             "is read after the write; JAX arrays do not alias, so the write would not be seen "
                             "through it: pass a copy of one (np.array(..., copy=True)) or build on the NumPy "
                             "backend")


def plane_sharding(mesh, shape, n, names=None, k=0, api="eagle.Graph"):
    """The sharding of one plane on `mesh`: split along the sample axis (last) when the plane has
    the graph's n samples, replicated otherwise (cells, Params, small arrays)."""
    from jax.sharding import NamedSharding, PartitionSpec
    axis = mesh.axis_names[0]
    size = int(np.prod(list(mesh.shape.values())))
    if len(shape) and shape[-1] == n and n > 1:
        if n % size:
            raise ValueError(f"{api}: {_arg(names, k)} has {n} samples, which {size} devices of the mesh do not "
                             f"divide; pad the sample axis to a multiple of {size} or use a mesh whose size divides "
                             f"{n}")
        return NamedSharding(mesh, PartitionSpec(*([None] * (len(shape) - 1)), axis))
    return NamedSharding(mesh, PartitionSpec())


def follow_committed(arrays, n, names=None):
    """The jax.Arrays, with the uncommitted ones (made by jnp.asarray, never device_put) on the mesh
    of the committed sharded ones, as jax.jit places them: planes split like the samples, cells
    replicated. Left on their one device, they would make lowering refuse 'incompatible devices'."""
    import jax
    meshes = [getattr(a.sharding, "mesh", None) for a in arrays if a.committed]
    mesh = next((m for m in meshes if m is not None and m.size > 1), None)
    if mesh is None:
        return arrays
    return [a if a.committed else jax.device_put(a, plane_sharding(mesh, np.shape(a), n, names, k))
            for k, a in enumerate(arrays)]


def _written_inputs(prog):
    """(output index, input index) for the final value of each written input, and every output Var
    that is a version of a written input -> that input (it reads as the caller's array, as on the
    NumPy backend, where every version lives in the caller's buffer)."""
    root = {v: k for k, v in enumerate(prog.inputs)}
    made = {}                                   # a version -> the index of the equation that wrote it
    for at, e in enumerate(prog.eqns):
        for j, i in e.params.get("inplace", ()) or ():
            a = e.inputs[i]
            if isinstance(a, Var) and a in root:
                root[e.outputs[j]] = root[a]
                made[e.outputs[j]] = at
    final, every = {}, {}
    for j, a in enumerate(prog.outputs):
        if isinstance(a, Var) and a in root and a not in prog.inputs:
            # the last version written, wherever it sits among the outputs (a handle kept on an
            # earlier version may come after it)
            k = root[a]
            if k not in final or made[a] > made[prog.outputs[final[k]]]:
                final[k] = j
            every[a] = k
    return sorted((j, i) for i, j in final.items()), every


ALIGNED_BYTES = 1 << 16      # NumPy arguments from this size on reach XLA through an aligned buffer
MIRROR_BYTES = 4096          # NumPy arguments up to this size are passed as a device array while unchanged
TAKE_BYTES = 1 << 16         # results from this size on are handed to `take` as XLA's own memory, not copied


class JaxExecutable:
    backend_name = "jax"

    def __init__(self, prog, input_arrays, keep, n, names=None, mesh=None, compile_now=None):
        jax = require_jax("eagle.Graph(backend='jax')")
        self.prog, self.n, self.names, self.mesh = prog, n, list(names or []), mesh
        self.on_jax = check_arrays(input_arrays, self.names, mesh)
        self.arrays = follow_committed(list(input_arrays), n, self.names) if self.on_jax else list(input_arrays)
        # what the executable returns: the Program's outputs, then kept values it does not return
        # (buffer= planes) that are defined at the top level
        top = {v for e in prog.eqns for v in e.outputs}
        extra = [v for v in keep if v in top and v not in prog.outputs]
        self.out_vars = list(prog.outputs) + extra
        self.written, versions = _written_inputs(prog.replace(outputs=self.out_vars))
        self.late_reads = () if self.on_jax else reads_after_writes(prog)
        refuse_overlap(self.arrays, self.late_reads, self.names)
        host = None if self.on_jax else list(self.arrays)
        why = ("reads and writes host arrays, and this graph's arguments are jax.Arrays; build it on NumPy arrays "
               "with eagle.Graph(backend='jax')" if self.on_jax else None)
        fn, self.lowering = lower(prog.replace(outputs=self.out_vars), n, host, why)
        shardings = None
        if mesh is not None and not self.on_jax:
            shardings = [plane_sharding(mesh, np.shape(a), n, self.names, k) for k, a in enumerate(self.arrays)]
        self.shardings = shardings
        self.fn = fn                # the pure function of the Program
        # NumPy arguments: a replay's device copies of them are its own, so those of the written
        # arguments are donated (their outputs reuse them; the caller's arrays get the values copied
        # back). jax.Arrays are never donated: the caller may hold them.
        self.donated = () if self.on_jax else tuple(sorted({i for _, i in self.written}))
        # small NumPy arguments are mirrored (_mirrored_inputs): the read-only ones are returned too, after
        # the results, so that the next replay finds them on the device already
        self.mirrored = () if self.on_jax or mesh is not None else \
            tuple(k for k, a in enumerate(self.arrays) if a.nbytes <= MIRROR_BYTES)
        echo = [k for k in self.mirrored if k not in self.donated]
        self._mirror = {k: (None, None) for k in self.mirrored}     # argument -> (its bytes, device array)
        self._mirror_out = [(j, i, True) for j, i in self.written if i in self._mirror]
        self._mirror_out += [(len(self.out_vars) + e, k, False) for e, k in enumerate(echo)]
        # large read-only NumPy arguments not on a 64-byte boundary: XLA reads the aligned span around
        # each in place (aligned.span_view) and the function slices the argument out of it
        self.spans = {} if self.on_jax or mesh is not None else \
            {k: lead for k, a in enumerate(self.arrays) if k not in self.donated and a.nbytes >= ALIGNED_BYTES
             and (lead := span_lead(a)) is not None}
        spans = {k: (lead, self.arrays[k].size, self.arrays[k].shape) for k, lead in self.spans.items()}

        def wrapped(*xs):
            if spans:
                xs = [x if k not in spans else x[spans[k][0]:spans[k][0] + spans[k][1]].reshape(spans[k][2])
                      for k, x in enumerate(xs)]
            return fn(*xs) + [xs[k] for k in echo]
        self.wrapped = wrapped      # what is compiled: the Program's function over the arguments as passed
        self._jit = jax.jit(wrapped, in_shardings=shardings, donate_argnums=self.donated)
        self._lowered_fn = None
        self._compiled = None
        self._staged = None         # per argument: the aligned buffer a large NumPy argument is copied into
        self._lean = self._numpy_lean = False
        self._back = None           # what a NumPy-mode replay copies back: (output, argument or None, result array)
        self.values = None          # the outputs of the last replay (jax mode), in out_vars order
        self.stable: dict = {}      # Var -> the NumPy array a replay copies it into (NumPy mode)
        # NumPy mode, lean replays: a plane's value is copied into its stable array only once that array
        # has been handed out (array_of); until then the replay keeps XLA's output (pending), which
        # `take` can give away with no copy at all (a transformed function's fresh result)
        self._shown: set = set()    # Vars whose stable array array_of has handed out: copied every replay
        self._pending: dict = {}    # Var -> the last replay's XLA output, not yet copied into stable
        self._passed = ()           # the arguments of the last lean replay (what a taken result must not alias)
        if not self.on_jax:
            for v in self.out_vars:
                if isinstance(v, Var) and v not in versions and v not in prog.inputs:
                    self.stable.setdefault(v, np.zeros(v.aval.shape, v.aval.dtype))
        self._takes = any(a.nbytes >= TAKE_BYTES for a in self.stable.values())
        # what each Var reads as, in one lookup (array_of runs at every g()): ("arg", input index) for an
        # argument and every version of a written one, ("out", output index) for a result (jax.Arrays)
        self.where = {v: ("out", j) for j, v in reversed(list(enumerate(self.out_vars)))} if self.on_jax else {}
        self.where.update({v: ("arg", k) for k, v in enumerate(prog.inputs)})
        self.where.update({v: ("arg", k) for v, k in versions.items()})
        if compile_now if compile_now is not None else not CONTEXT.lazy_compile:
            self.compile()

    def _lowered(self):
        """The jitted function traced and lowered for the bound arrays' shapes (and shardings), once."""
        import jax  # lazy: jax is an optional dependency
        if self._lowered_fn is None:
            structs = []
            for k, a in enumerate(self.arrays):
                sh = getattr(a, "sharding", None) if self.on_jax else (self.shardings[k] if self.shardings else None)
                structs.append(jax.ShapeDtypeStruct(np.shape(a), np.dtype(a.dtype), sharding=sh))
            self._lowered_fn = self._jit.lower(*self.as_passed(structs))
        return self._lowered_fn

    def as_passed(self, structs):
        """The shapes the compiled function takes, from those of the bound arrays: an argument read
        through its aligned span is passed as that span (one dimension)."""
        import jax
        out = list(structs)
        for k, lead in self.spans.items():
            a = out[k]
            out[k] = jax.ShapeDtypeStruct((span_size(lead, int(np.prod(a.shape)), np.dtype(a.dtype).itemsize),),
                                          a.dtype)
        return out

    def as_text(self) -> str:
        """The StableHLO text of the lowered function (what XLA compiles)."""
        return self._lowered().as_text()

    def compile(self):
        """Trace and compile for the bound arrays' shapes (and shardings): once per build."""
        if self._compiled is None:
            self._compiled = self._lowered().compile()
            lw = self.lowering            # traced now: its host nodes and trip checks are known
            self._lean = self.on_jax and not (lw.trip_checks or lw.has_host)
            self._numpy_lean = not (self.on_jax or lw.trip_checks or lw.has_host or self.shardings)
        return self._compiled

    # -- running -------------------------------------------------------------------------------
    def _check_trips(self):
        for k, cap in self.lowering.trip_checks:
            t = int(np.max(np.asarray(self.arrays[k])))
            if t > cap:
                raise RuntimeError(f"eagle: a differentiated counted loop asks for {t} turns ({_arg(self.names, k)}); "
                                   f"its stack of saved turns holds {cap} (the trip count when the derivative was "
                                   "built): build it again with the larger count")

    def _inputs(self):
        if self.on_jax:
            return self.arrays
        if self.shardings is None:
            return self._aligned_inputs()
        import jax
        return [jax.device_put(a, s) for a, s in zip(self.arrays, self.shardings)]

    def _aligned_inputs(self):
        """The NumPy arguments as XLA takes them without a copy of its own: XLA on the CPU reads a
        64-byte-aligned C-contiguous array in place, and copies any other far slower than NumPy
        does. So a large argument that is not (NumPy aligns to 16) is copied into an aligned buffer
        of the executable's first. Written (donated) arguments are passed as they are."""
        staged = self._staged
        if staged is None:
            staged = self._staged = [None if k in self.donated or a.nbytes < ALIGNED_BYTES else
                                     SpanInput(a, self.spans[k]) if k in self.spans else
                                     aligned_empty(a.shape, a.dtype) for k, a in enumerate(self.arrays)]
            self._any_staged = any(s is not None for s in staged)
        if not self._any_staged:
            return self.arrays
        out = []
        for a, s in zip(self.arrays, staged):
            if s is None or type(s) is not SpanInput and is_aligned(a):
                out.append(a)
            elif type(s) is SpanInput:
                out.append(s.of(a))
            else:
                np.copyto(s, a)
                out.append(s)
        return out

    def _mirrored_inputs(self):
        """The arguments of a NumPy-mode replay: a small argument whose bytes are those it had at the
        last replay's end is passed as the device array holding them (that replay's output for a
        written one, or the argument returned back for a read-only one), not converted again: that
        conversion is most of a small replay's dispatch. Equal bytes, equal values: nothing else
        decides, so a write to the caller's array, or a bind, is always seen."""
        inputs = list(self._aligned_inputs())
        mirror = self._mirror
        for k in self.mirrored:
            b = inputs[k].tobytes()
            snap, dev = mirror[k]
            if dev is not None and b == snap:
                inputs[k] = dev
            mirror[k] = (b, None)          # a donated one is used up by the call; a failed call leaves none
        return inputs

    def _copy_plan(self):
        """(output index, written argument index, None) per written argument, then (output index,
        None, result array) per result handed out, and (output index, Var) per result not handed out
        (kept as XLA's output): made at the first replay, after a tiered executable has pointed
        `stable` at its own result arrays (it calls `results_moved`), and again when array_of hands
        out another."""
        plan = [(j, i, None) for j, i in self.written]
        plan += [(j, None, self.stable[v]) for j, v in enumerate(self.out_vars) if v in self.stable and v in self._shown]
        later = [(j, v) for j, v in enumerate(self.out_vars) if v in self.stable and v not in self._shown]
        self._back = plan, later
        return self._back

    def results_moved(self):
        """`stable` changed: the next replay makes its copy plan again."""
        self._back = None

    def _show(self, var):
        """`var`'s stable array is handed out: bring it up to date, and copy it at every replay from now on."""
        self._shown.add(var)
        self._back = None
        self.catch_up(var)

    def show(self, planes):
        """Treat the stable arrays of `planes` as handed out (a tiered executable's NumPy side gave
        them out before the swap)."""
        for v in planes:
            if v in self.stable and v not in self._shown:
                self._show(v)

    def catch_up(self, var=None):
        """Copy the last replay's value of `var` (of every plane: None) into its stable array, where
        it was kept as XLA's output."""
        for v in list(self._pending) if var is None else (var,):
            x = self._pending.pop(v, None)
            if x is not None:
                np.copyto(self.stable[v], np.asarray(x))

    @property
    def take(self):
        """`_take`, where a result is large enough to be given away (else None: the caller copies,
        with nothing more to ask per call)."""
        return self._take if self._takes else None

    def _take(self, var):
        """The value of `var` from the last replay as a new writable NumPy array over XLA's output
        (no copy), given away: the caller promises not to read `var` through array_of before the
        next replay (a transformed function's graph, whose results are read once per call). None
        where that cannot be had (a small plane: copying it costs less; a plane handed out or taken
        already; an output XLA shares with an argument): the caller copies array_of(var)."""
        x = self._pending.get(var)
        if x is None or x.nbytes < TAKE_BYTES:
            return None
        own = writable_over(x)
        if own is None or any(_overlaps(own, a) for k, a in enumerate(self._passed) if k not in self.donated):
            return None
        del self._pending[var]
        return own

    def replay(self, times: int = 1):
        # The last replay's outputs are let go before the next one runs: unless the caller holds
        # them, their memory is free for it, so a replay needs one set of outputs at a time, not two.
        run = self._compiled or self.compile()
        # the compiled function's C++ entry, past its Python wrapper (1.5 us of a 17 us call at n = 8);
        # made by its first call, so the first replay goes through the wrapper
        run = getattr(run, "_call", None) or run
        if self._lean:              # jax.Arrays, no host node, no trip check: nothing but the calls
            arrays, written = self.arrays, self.written
            for _ in range(times):
                self.values = None
                outs = run(*arrays)
                for j, i in written:
                    arrays[i] = outs[j]
                self.values = outs
                del outs
            return
        lw = self.lowering
        if self._numpy_lean:        # NumPy arguments, no host node, no trip check, no mesh
            inputs, arrays, mirror, mirror_out = self._mirrored_inputs, self.arrays, self._mirror, self._mirror_out
            back, later = self._back or self._copy_plan()
            for _ in range(times):
                self._passed = passed = inputs()
                outs = run(*passed)
                for j, i, dst in back:
                    np.copyto(arrays[i] if dst is None else dst, np.asarray(outs[j]))
                if later:
                    self._pending = {v: outs[j] for j, v in later}
                for j, k, written in mirror_out:        # what the next replay may pass instead of the NumPy array
                    mirror[k] = (arrays[k].tobytes() if written else mirror[k][0], outs[j])
                del outs
            return
        for _ in range(times):
            self.values = outs = None
            if lw.trip_checks:
                self._check_trips()
            outs = run(*self._inputs())
            if lw.has_host:
                import jax
                jax.block_until_ready(outs)
            if lw.host_errors:
                errors, lw.host_errors[:] = list(lw.host_errors), []
                raise errors[0]
            if self.on_jax:
                for j, i in self.written:
                    self.arrays[i] = outs[j]
                self.values = outs
                continue
            for j, i in self.written:
                np.copyto(self.arrays[i], np.asarray(outs[j]))
            for v, x in zip(self.out_vars, outs):
                dst = self.stable.get(v)
                if dst is not None:
                    np.copyto(dst, np.asarray(x))

    def rebind(self, input_index: int, arr):
        old = self.arrays[input_index]
        if self.on_jax and not arr.committed and not _same_sharding(arr, old):
            import jax
            arr = jax.device_put(arr, old.sharding)       # as follow_committed placed the first one
        if self.on_jax:
            check_processes_agree([arr], [self.names[input_index]] if input_index < len(self.names) else None,
                                  "eagle.Graph.bind")
        if self.on_jax and not _same_sharding(arr, old):
            raise ValueError(f"eagle.Graph.bind: {_arg(self.names, input_index)} has another sharding than the array "
                             "the graph was built with; jax.device_put it with the same sharding")
        if self.late_reads:                 # most graphs read no argument after writing another
            arrays = self.arrays[:input_index] + [arr] + self.arrays[input_index + 1:]
            refuse_overlap(arrays, self.late_reads, self.names, api="eagle.Graph.bind")
        self.arrays[input_index] = arr

    def array_of(self, var, show=True):
        """The array `var` reads as now. show=False: only to compare which array it is (its value
        may be a replay behind)."""
        w = self.where.get(var)
        if w is None:
            arr = self.stable.get(var)
            if show and arr is not None and var not in self._shown:
                self._show(var)
            return arr
        kind, k = w
        if kind == "arg":
            return self.arrays[k]
        return None if self.values is None else self.values[k]


def writable_over(x):
    """A writable NumPy array over the memory of the jax.Array `x` (XLA's output, held by nobody
    else: its buffer is never donated or reused while the array lives), which keeps `x` alive;
    None where its NumPy value is not one contiguous block."""
    import ctypes
    view = np.asarray(x)
    if not view.flags.c_contiguous or view.dtype.hasobject or view.nbytes == 0:
        return None
    raw = (ctypes.c_char * view.nbytes).from_address(view.ctypes.data)
    raw._keeps = (x, view)                  # the memory is x's (or view's, copied from a device)
    return np.frombuffer(raw, view.dtype).reshape(view.shape)


def _overlaps(own, a) -> bool:
    """Whether `own` shares memory with the argument `a` (a NumPy array or a jax.Array) passed to
    the replay that made it: XLA may hand an argument back as an output."""
    if is_jax_array(a):
        if a.is_deleted():
            return False
        a = np.asarray(a)
    return np.may_share_memory(own, a)


def _same_sharding(a, b) -> bool:
    """Whether two arrays are laid out alike: equal shardings, or equivalent ones (a written
    argument comes back from the executable with a sharding of its own making, the same layout)."""
    sa, sb = getattr(a, "sharding", None), getattr(b, "sharding", None)
    if sa == sb:
        return True
    try:
        return sa.is_equivalent_to(sb, a.ndim)
    except (AttributeError, TypeError, ValueError):
        return False
