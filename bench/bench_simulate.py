"""eagle_fx.simulate against hand-written run-until-done loops, in one process.

    python bench/bench_simulate.py            # n = 1e5 samples; --quick: fewer repeats; --n N: N samples

The workload: a 2-state ODE (a falling ball, semi-implicit Euler) per sample until it lands, the
landing step spread from 100 to 2 000 (median 500). Prints the median time ratios of
  * simulate on the NumPy backend (a built graph replayed) / a hand-written masked NumPy loop with
    the same stop rule (target <= 1.0), for every = 1 and every = 16, and with event= (the
    crossing found by an event function and refined) instead of the step's own mark;
  * simulate on the JAX backend (jax.Array state) / jax.jit of lax.while_loop with the same stop
    rule (target <= 1.2);
  * simulate(..., compact=True) (called as a function: the running samples packed as they
    finish) / the masked NumPy loop, and / the same call without compact; and the same on a
    workload where 90% of the samples land within 100 to 150 steps and 10% run on to 2 000
    (compaction at 10% active);
and the peak host memory (tracemalloc) of the reverse pass on the NumPy backend with every turn
stored against checkpoints=K.
"""
import sys
import time
import tracemalloc

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import eagle_fx as eagle  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from hawk_fx import Mutable, Scalar, Terminated  # noqa: E402
from timing import median_ratio  # noqa: E402

DT, G = 1e-3, 9.81
CAP = 2100


@hawk.kernel
def fall(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated):
    v = v - 9.81 * 1e-3
    y = y + v * 1e-3
    done = y < 0.0


@hawk.kernel
def fall_dt(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated, dt: Scalar):
    v = v - 9.81 * dt
    y = y + v * dt


@hawk.kernel
def height(y: Scalar) -> Scalar:
    return y


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x)


@eagle.Graph.builder
def run_event(y, v):
    """The same fall stopped by event=height instead of the step's own mark: the crossing found
    after each step, then refined (secant iterations, a Newton step) after the loop."""
    g = eagle.Graph()
    r = eagle.simulate(lambda s, done, dt: fall_dt(s["y"], s["v"], done, dt), {"y": y, "v": v},
                       event=lambda s: height(s["y"]), max_steps=CAP, dt=DT)
    g.result = (r.state["y"], r.state["v"], r.steps, r.t_event)
    return g


def heights(n, rng):
    """Drop heights whose landing step is log-normal around 500, clipped to [100, 2000]."""
    k = np.clip(np.exp(rng.normal(np.log(500.0), 0.6, n)), 100, 2000)
    return 0.5 * G * (k * DT) ** 2


def make_builder(every):
    @eagle.Graph.builder
    def run(y, v):
        g = eagle.Graph()
        r = eagle.simulate(fall, {"y": y, "v": v}, max_steps=CAP, every=every)
        g.result = (r.state["y"], r.state["v"], r.steps)
        return g
    return run


def tail_heights(n, rng):
    """90% of the samples land within 100 to 150 steps, the other 10% at 2 000: a run that spends
    most of its steps with 10% of the samples active."""
    k = np.where(rng.random(n) < 0.9, rng.uniform(100, 150, n), 2000.0)
    return 0.5 * G * (k * DT) ** 2


def run_eager(y, v, compact):
    r = eagle.simulate(fall, {"y": y, "v": v}, max_steps=CAP, compact=compact)
    return r.state["y"], r.state["v"], r.steps


def masked_numpy(y, v):
    """The hand-written NumPy loop: masked update, stop when every sample has landed."""
    y, v = y.copy(), v.copy()
    done = np.zeros(y.shape, bool)
    steps = np.zeros(y.shape, np.int32)
    for _ in range(CAP):
        active = ~done
        vn = v - G * DT
        yn = y + vn * DT
        np.copyto(v, vn, where=active)
        np.copyto(y, yn, where=active)
        steps += active
        done |= yn < 0.0
        if done.all():
            break
    return y, v, steps


@jax.jit
def jax_loop(y, v):
    def cond(c):
        return ~jnp.all(c[2]) & (c[3] < CAP)

    def body(c):
        y, v, done, k, steps = c
        vn = v - G * DT
        yn = y + vn * DT
        return (jnp.where(done, y, yn), jnp.where(done, v, vn), done | (yn < 0.0), k + 1,
                steps + (~done).astype(jnp.int32))
    y, v, _, _, steps = lax.while_loop(cond, body, (y, v, jnp.zeros(y.shape, bool), 0, jnp.zeros(y.shape, jnp.int32)))
    return y, v, steps


def peak_bytes(fn):
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main():
    quick = "--quick" in sys.argv
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 10_000 if quick else 100_000
    number, repeat = (1, 3) if quick else (1, 7)
    rng = np.random.default_rng(0)
    y0, v0 = heights(n, rng), np.zeros(n)
    want = masked_numpy(y0, v0)
    print(f"n = {n}, landing steps median {int(np.median(want[2]))}, range {want[2].min()}..{want[2].max()}")

    for every in (1, 16):
        g = make_builder(every)(y0, v0)
        got = g()
        assert np.array_equal(got[2], want[2]) and np.allclose(got[0], want[0], rtol=0, atol=1e-12)
        r = median_ratio(g, lambda: masked_numpy(y0, v0), number, repeat)
        print(f"numpy backend, every={every:>2}: simulate / masked NumPy loop = {r:.2f}  (target <= 1.0)")

    ge = run_event(y0, v0)
    assert np.array_equal(ge()[2], want[2])
    r = median_ratio(ge, lambda: masked_numpy(y0, v0), number, repeat)
    print(f"numpy backend, event=  : simulate / masked NumPy loop = {r:.2f}  (the crossing refined too)")

    yj, vj = jnp.asarray(y0), jnp.asarray(v0)
    with use_backend("jax"):
        gj = make_builder(1)(yj, vj)
    out = gj()
    assert np.array_equal(np.asarray(out[2]), want[2])
    r = median_ratio(lambda: jax.block_until_ready(gj()), lambda: jax.block_until_ready(jax_loop(yj, vj)),
                     number, repeat)
    print(f"jax backend,   every= 1: simulate / jax.jit(lax.while_loop) = {r:.2f}  (target <= 1.2)")

    for name, (ya, va) in (("spread 100..2000", (y0, v0)), ("10% active", (tail_heights(n, rng), np.zeros(n)))):
        ref = masked_numpy(ya, va)
        got = run_eager(ya, va, True)
        assert all(np.array_equal(a, b) for a, b in zip(got, ref[:2])) and np.array_equal(got[2], ref[2])
        r = median_ratio(lambda: run_eager(ya, va, True), lambda: masked_numpy(ya, va), number, repeat)
        r2 = median_ratio(lambda: run_eager(ya, va, True), lambda: run_eager(ya, va, False), number, repeat)
        print(f"numpy backend, {name:>16}: simulate(compact=True) / masked NumPy loop = {r:.2f}, "
              f"/ simulate(compact=False) = {r2:.2f}")

    m = min(n, 10_000) if "--reverse-n" not in sys.argv else int(sys.argv[sys.argv.index("--reverse-n") + 1])

    @eagle.Graph.builder
    def loss(y, v):
        g = eagle.Graph()
        r = eagle.simulate(fall, {"y": y, "v": v}, max_steps=CAP)
        g.result = total(r.state["v"] * r.state["v"])
        return g
    ys, vs = y0[:m].copy(), v0[:m].copy()
    stored = eagle.grad(loss)
    ck = eagle.grad(loss, checkpoints=16)
    stored(ys, vs), ck(ys, vs)
    t0 = time.perf_counter()
    a = stored(ys, vs)
    t1 = time.perf_counter()
    b = ck(ys, vs)
    t2 = time.perf_counter()
    assert np.allclose(a, b, rtol=1e-12)
    ps, pk = peak_bytes(lambda: stored(ys, vs)), peak_bytes(lambda: ck(ys, vs))
    print(f"reverse, n = {m}: peak host memory stored {ps / 2**20:.1f} MiB, checkpoints=16 {pk / 2**20:.1f} MiB; "
          f"time {t1 - t0:.2f} s vs {t2 - t1:.2f} s")


if __name__ == "__main__":
    main()
