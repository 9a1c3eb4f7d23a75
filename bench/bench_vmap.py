"""vmap against a Python loop of replays and against one graph over all samples.

    python bench/bench_vmap.py

W-chain (10 x (dbl, inc)) batched over B = 1000 instances of n = 8, against (a) 1000 replays of the
n = 8 graph, one per instance (bind + replay), and (b) one graph over 8000 samples; and the
50-turn capped loop batched over B = 1000 with per-instance trip counts, against the unbatched
loop over 8000 samples. Medians over repeats, in this process. Targets: >= 20x faster than (a),
within 1.3x of (b); the batched loop within 1.5x of the unbatched one.
"""

import numpy as np

import eagle_fx as eagle


from timing import median_time
from workloads import w_chain, w_loop_to as w_loop


def main():
    B, n = 1000, 8
    xs = np.random.rand(B, n) + 1.0
    gb = eagle.vmap(w_chain)(xs)
    g1 = w_chain(xs[0].copy())
    flat = w_chain(xs.reshape(-1).copy())
    views = [xs[b] for b in range(B)]

    def loop_of_replays():
        for v in views:
            g1.bind(x=v)
            g1.launch()

    graphs = [w_chain(v.copy()) for v in views]

    def loop_of_prebuilt():
        for g in graphs:
            g.launch()

    t_v = median_time(gb.launch, 20)
    t_a = median_time(loop_of_replays, 1, 3)
    t_p = median_time(loop_of_prebuilt, 1, 3)
    t_b = median_time(flat.launch, 20)
    assert np.allclose(gb(), flat().reshape(B, n))
    print(f"W-chain vmap B={B} n={n}: {t_a / t_v:6.1f}x faster than {B} bind+replays of one graph, "
          f"{t_p / t_v:6.1f}x faster than replays of {B} prebuilt graphs (target >= 20); "
          f"vmap / one graph of {B * n} samples = {t_v / t_b:4.2f} (target <= 1.3)")

    # lim = 2 ** k * start: instance b stops after k(b) doublings, between 1 and 50 turns
    turns = np.random.randint(1, 51, B)
    lims = np.ldexp(1.0, turns)[:, None] * 1.0
    x0 = np.ones((B, n))
    flags = np.ones((B, 1), np.uint32)
    gl = eagle.vmap(w_loop)(x0, flags, lims)
    fflag = np.ones(1, np.uint32)
    gflat = w_loop(np.ones(B * n), fflag, np.array([np.ldexp(1.0, 50)]))

    def run_batched():
        flags[...] = 1
        gl.launch()

    def run_flat():
        fflag[0] = 1
        gflat.launch()
    t_lb, t_lf = median_time(run_batched, 5), median_time(run_flat, 5)
    run_batched()
    assert np.allclose(gl.result, np.ldexp(1.0, turns)[:, None] * np.ones((B, n)))
    print(f"W-loop vmap B={B} n={n}, trips 1..50: vmap / unbatched loop over {B * n} samples (50 turns) = "
          f"{t_lb / t_lf:4.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
