"""Gradient cost: a recorded forward plus its reverse, against the plain forward of the same graph.

    python bench/bench_grad.py                 # W-chain and W-trans at n = 1e6, W-loop (50 turns) at n = 1e5
    python bench/bench_grad.py 1e5 1e4         # other sizes: chain/trans n, loop n
    python bench/bench_grad.py --profile       # also cProfile one forward + reverse of each

Per workload: the median time (timeit.repeat) of the plain forward `g.launch()`, of the recorded
forward `gr.launch()` and of `eagle_fx.diff.reverse(gr.record, ...)`, and the ratio
(recorded forward + reverse) / forward (target <= 4). Memory: the bytes of the record
(`gr.record.nbytes`: the residuals the forward half of the vjp saves for its backward half) and
the graph's own buffers, recorded vs plain.
"""
import cProfile
import pstats
import sys
import timeit

import numpy as np

import eagle_fx as eagle

TARGET = 4.0


from workloads import w_chain, w_loop, w_trans


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
    rec_bytes = gr.record.nbytes
    n = np.asarray(args["x"]).size
    print(f"{label:<8} n={n:<7.0e} forward {tf * 1e3:7.2f} ms | recorded forward {tr * 1e3:7.2f} ms + reverse "
          f"{tb * 1e3:7.2f} ms | ratio {ratio:5.2f} ({'ok' if ratio <= TARGET else 'MISSES'} <= {TARGET:g})")
    print(f"{'':<8} memory: residuals {rec_bytes / 1e6:.2f} MB; "
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
