"""Gradient cost: a recorded forward plus its reverse, against the plain forward of the same graph.

    python bench/bench_grad.py                 # W-chain and W-trans at n = 1e6, W-loop (50 turns) at n = 1e5
    python bench/bench_grad.py 1e5 1e4         # other sizes: chain/trans n, loop n
    python bench/bench_grad.py --profile       # also cProfile one forward + reverse of each

Per workload: the median time (timeit.repeat) of the plain forward `g.launch()`, of the recorded
forward `gr.launch()` and of `eagle_fx.diff.reverse(gr.record, ...)`, and the ratio
(recorded forward + reverse) / forward (target <= 4). Memory: the bytes of the record
(`gr.record.nbytes`) and the residuals the backward needs: for each kernel call the inputs its
vjp reads (a linear kernel's vjp reads none), once per loop turn it ran; and the graph's own
buffers, recorded (a recorded forward reuses none, the reverse reads its values there) vs plain.
"""
import cProfile
import pstats
import sys
import timeit

import numpy as np

import eagle_fx as eagle
from eagle_fx import ir
from hawk_fx.core import Var
from hawk_fx.diff import kernel_vjp

TARGET = 4.0


from workloads import w_chain, w_loop, w_trans


# ---------------------------------------------------------------------------------------------
# memory accounting

def _vjp_reads(spec):
    """Which primal inputs the kernel's vjp program reads (the residuals a backward needs)."""
    kv = kernel_vjp(spec)
    prims = kv.prog.inputs[:len(spec.prog.inputs)]
    used = set()
    for e in kv.prog.eqns:
        used.update(a for a in e.inputs if isinstance(a, Var))
    used.update(a for a in kv.prog.outputs if isinstance(a, Var))
    return [v in used for v in prims]


def _needed_bytes(prog, turns_of, mult=1):
    """Bytes of the inputs the vjps read, per call, times the turns of the enclosing loops."""
    total = 0
    for e in prog.eqns:
        if e.prim is ir.call_p:
            spec = e.params["spec"]
            if not any(a.aval.dtype.kind == "f" for a in spec.prog.outputs):
                continue                                  # no float output: no cotangent reaches it
            for a, read in zip(e.inputs, _vjp_reads(spec)):
                if read and isinstance(a, Var):
                    total += mult * int(np.prod(a.aval.shape)) * a.aval.dtype.itemsize
        elif e.prim in (ir.cond_p, ir.switch_p):
            total += mult * 4 + max(_needed_bytes(b, turns_of, mult) for b in e.params["branches"])
        elif e.prim is ir.while_p:
            turns = turns_of(e)
            total += mult * 8 + _needed_bytes(e.params["body"], turns_of, mult * turns)
    return total


def memory(gr):
    rec = gr.record
    res = gr._residuals

    def turns_of(e):
        return int(np.asarray(rec.buffers()[res.turns[id(e)]]).reshape(-1)[0])

    needed = _needed_bytes(gr._grad_program, turns_of)
    return rec.nbytes, needed


def buffer_bytes(g):
    """Bytes of a graph's own buffers (its temporaries and results; the caller's arrays excluded)."""
    inputs = {id(g._exe.slots[k]) for k in g._exe.input_slots}
    return sum(a.nbytes for a in {id(a): a for a in g._exe.slots}.values() if id(a) not in inputs)


# ---------------------------------------------------------------------------------------------

def measure(label, build, args, reset=lambda: None, profile=False, number=3, repeat=11):
    g = build(**args)
    gr = build(**args, record=True)
    seed = {"result": np.ones_like(np.asarray(g.result if g.result is not None else gr.result))}

    def fwd():
        reset()
        g.launch()

    def rec():
        reset()
        gr.launch()

    def rev():
        return eagle.diff.reverse(gr.record, seed, wrt=("x",))

    fwd(), rec()
    grad = rev()["x"]
    assert np.all(np.isfinite(grad))
    # interleaved, so that a change of machine load between them hits all three alike
    times = {"f": [], "r": [], "b": []}
    for _ in range(repeat):
        for key, fn in (("f", fwd), ("r", rec), ("b", rev)):
            times[key] += timeit.repeat(fn, number=number, repeat=1)
    tf, tr, tb = (float(np.median(times[k])) / number for k in "frb")
    ratio = (tr + tb) / tf
    rec_bytes, needed = memory(gr)
    n = np.asarray(args["x"]).size
    print(f"{label:<8} n={n:<7.0e} forward {tf * 1e3:7.2f} ms | recorded forward {tr * 1e3:7.2f} ms + reverse "
          f"{tb * 1e3:7.2f} ms | ratio {ratio:5.2f} ({'ok' if ratio <= TARGET else 'MISSES'} <= {TARGET:g})")
    print(f"{'':<8} memory: record {rec_bytes / 1e6:.2f} MB, residuals the backward needs {needed / 1e6:.2f} MB; "
          f"graph buffers {buffer_bytes(gr) / 1e6:.2f} MB recorded (kept for the reverse) vs "
          f"{buffer_bytes(g) / 1e6:.2f} MB plain")
    if profile:
        rec()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            rec()
            rev()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
    return ratio


def main(argv):
    profile = "--profile" in argv
    sizes = [int(float(a)) for a in argv if not a.startswith("--")]
    n = sizes[0] if sizes else 1_000_000
    n_loop = sizes[1] if len(sizes) > 1 else 100_000
    rng = np.random.default_rng(0)
    ratios = {}
    ratios["W-chain"] = measure("W-chain", w_chain, {"x": rng.random(n)}, profile=profile)
    ratios["W-trans"] = measure("W-trans", w_trans, {"x": rng.random(n)}, profile=profile)
    flags = []

    def build_loop(x, record=False):
        flags.append(np.array([1], np.uint32))
        return w_loop(x, flags[-1], record=record)

    def reset():
        for f in flags:
            f[0] = 1
    ratios["W-loop"] = measure("W-loop", build_loop, {"x": rng.random(n_loop)}, reset=reset, profile=profile)
    return ratios


if __name__ == "__main__":
    main(sys.argv[1:])
