"""One mesh of 2 CPU devices, held by 1 process or by 2: what the collectives between processes cost.

    python bench/bench_multiprocess.py            # n = 1e6
    python bench/bench_multiprocess.py --quick    # n = 1e5, fewer repeats

Workloads on backend="jax", samples split over the mesh: W-chain (10 x (dbl, inc)), the capped loop
W-loop (50 turns; its guard, a sum over samples, is a collective each turn), and a
value_and_grad step of L-loop through to_jax under jax.jit (a loss summed over samples, and the
reverse pass through the loop). Each runs (a) in 1 process with 2 host devices and (b) in 2
processes with 1 device each (`python -m eagle_fx.launch -n 2`); the figure is the median time of
(b) over (a), measured in each setting's own processes. The communication per call is read from
the compiled HLO: the bytes of the all-reduce / all-gather / collective-permute results.
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
QUICK = "--quick" in sys.argv
N = 100_000 if QUICK else 1_000_000
REPEAT = 5 if QUICK else 11
TARGET = 1.3
BYTES = {"f64": 8, "f32": 4, "u32": 4, "s32": 4, "pred": 1, "s64": 8, "u64": 8}


def worker():
    sys.path[:0] = [HERE, ROOT]
    from eagle_fx import launch
    pid, nproc = launch.initialize()
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import eagle_fx
    from timing import median_time
    from workloads import l_loop, w_chain, w_loop

    mesh = Mesh(np.array(jax.devices()), ("s",))
    split, repl = NamedSharding(mesh, P("s")), NamedSharding(mesh, P())
    full = np.linspace(0.1, 1.0, N)
    per = N // nproc
    x = jax.make_array_from_process_local_data(split, full[pid * per:(pid + 1) * per])
    flag = jax.make_array_from_process_local_data(repl, np.array([1], np.uint32))
    g_chain, g_loop = w_chain(x), w_loop(x, flag)
    f = eagle_fx.to_jax(l_loop)
    step = jax.jit(jax.value_and_grad(lambda u: f(u, jnp.asarray(np.array([1], np.uint32)))[0]))

    def hlo_bytes(text):
        total = 0
        for m in re.finditer(r"= \(?([a-z0-9]+)\[([0-9,]*)\][^=]*? (all-reduce|all-gather|collective-permute|"
                             r"all-to-all|reduce-scatter)(-start)?\(", text):
            dims = [int(d) for d in m.group(2).split(",") if d]
            total += BYTES.get(m.group(1), 8) * int(np.prod(dims)) if dims else BYTES.get(m.group(1), 8)
        return total

    out = {"chain": median_time(lambda: jax.block_until_ready(g_chain()), 3, REPEAT),
           "loop": median_time(lambda: jax.block_until_ready(g_loop()), 3, REPEAT),
           "grad step": median_time(lambda: jax.block_until_ready(step(x)), 3, REPEAT),
           "bytes": {"loop": hlo_bytes(g_loop._exe.compile().as_text()),
                     "grad step": hlo_bytes(step.lower(x).compile().as_text())}}
    if pid == 0:
        print("RESULT " + json.dumps(out), flush=True)


def run(args, env_extra):
    env = dict(os.environ, PYTHONPATH=ROOT, **env_extra)
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=1200)
    line = next((ln for ln in r.stdout.splitlines() if "RESULT " in ln), None)
    if line is None:
        raise RuntimeError(f"bench worker failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(line.split("RESULT ", 1)[1])


def main():
    me = os.path.abspath(__file__)
    flags = ["--worker"] + (["--quick"] if QUICK else [])
    one = run([me, *flags], {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    two = run(["-m", "eagle_fx.launch", "-n", "2", "--devices", "1", "--timeout", "1100", me, *flags], {})
    print(f"n = {N}: 2 processes x 1 device / 1 process x 2 devices (target <= {TARGET}):")
    for k in ("chain", "loop", "grad step"):
        r = two[k] / one[k]
        print(f"  {k:>9}: {r:5.2f}x  {'ok' if r <= TARGET else 'OVER'}")
    for k, b in two["bytes"].items():
        print(f"  collective results in the compiled HLO ({k}; a loop's run every turn): {b} bytes in 2 processes, "
              f"{one['bytes'][k]} in 1")


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
