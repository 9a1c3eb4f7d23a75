"""Start a script as N JAX processes that form one mesh: the way out of one machine.

    python -m eagle_fx.launch -n 2 script.py [args]              # 2 processes on this machine
    python -m eagle_fx.launch -n 2 --devices 2 script.py         # each with 2 host (CPU) devices

The script calls `eagle_fx.launch.initialize()` before it touches a device; it reads what this
launcher puts in the environment and calls `jax.distributed.initialize`, after which
`jax.devices()` lists the devices of every process and a mesh over them is global (build arrays
with `jax.make_array_from_process_local_data`). Each process's output is printed with its id; the
launcher exits with the first nonzero status, and when one process fails it stops the others after
`--grace` seconds (a collective waiting on a dead peer would otherwise wait for the coordinator's
timeout).

On several hosts, run the launcher on each with the same `--coordinator HOST:PORT` (a port on the
first host that the others reach), the total `--num-processes`, and this host's first process id
(`--first-id`): host 0 `-n 4 --first-id 0`, host 1 `-n 4 --first-id 4`, with `--num-processes 8`.
Without the launcher, set the variables below yourself (a cluster scheduler usually does).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

COORDINATOR = "EAGLE_FX_COORDINATOR"          # host:port of process 0's coordinator service
NUM_PROCESSES = "EAGLE_FX_NUM_PROCESSES"
PROCESS_ID = "EAGLE_FX_PROCESS_ID"
TIMEOUT = "EAGLE_FX_INIT_TIMEOUT"             # seconds to wait for every process to join


def initialize():
    """Join the processes the launcher started into one JAX runtime (jax.distributed.initialize),
    from the environment it set; on CPU, with JAX's gloo collectives. Returns (process id, number of
    processes); (0, 1) when the script runs alone (no launcher), so it also runs as a plain script."""
    if COORDINATOR not in os.environ:
        return 0, 1
    missing = [v for v in (NUM_PROCESSES, PROCESS_ID) if v not in os.environ]
    if missing:
        raise RuntimeError(f"eagle_fx.launch.initialize: {COORDINATOR} is set but {', '.join(missing)} is not; "
                           "start the script with `python -m eagle_fx.launch -n N script.py`, or set all three")
    import jax
    pid, n = int(os.environ[PROCESS_ID]), int(os.environ[NUM_PROCESSES])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ[COORDINATOR], num_processes=n, process_id=pid,
                               initialization_timeout=int(os.environ.get(TIMEOUT, "60")))
    return pid, n


def free_port() -> int:
    """A TCP port free on this machine now (the coordinator binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script_args, n, devices=None, coordinator=None, num_processes=None, first_id=0, timeout=None,
           grace=10.0, init_timeout=60, out=None):
    """Run `python script_args...` as processes first_id .. first_id + n - 1 of `num_processes`
    (default n); returns the exit status (0 when every process succeeded). `devices`: host (CPU)
    devices per process. `timeout`: seconds for the whole run; past it every process is killed."""
    out = out or sys.stdout
    num_processes = num_processes or n
    coordinator = coordinator or f"127.0.0.1:{free_port()}"
    env = dict(os.environ, **{COORDINATOR: coordinator, NUM_PROCESSES: str(num_processes),
                              TIMEOUT: str(init_timeout)})
    if devices:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    procs, lock = [], threading.Lock()
    for i in range(first_id, first_id + n):
        procs.append(subprocess.Popen([sys.executable, *script_args], env=dict(env, **{PROCESS_ID: str(i)}),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    readers = [threading.Thread(target=_relay, args=(p, i, out, lock), daemon=True)
               for i, p in zip(range(first_id, first_id + n), procs)]
    for r in readers:
        r.start()
    status = _wait(procs, timeout, grace, out, lock)
    for r in readers:
        r.join(timeout=5)
    return status


def _relay(proc, pid, out, lock):
    for line in proc.stdout:
        with lock:
            out.write(f"[{pid}] {line}")
            out.flush()


def _wait(procs, timeout, grace, out, lock):
    """The first nonzero status (or 0); a failure stops the others after `grace` seconds."""
    start, failed_at, status = time.monotonic(), None, 0
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        for p in procs:
            rc = p.poll()
            if rc not in (None, 0) and failed_at is None:
                failed_at, status = now, rc
        if timeout is not None and now - start > timeout:
            with lock:
                out.write(f"eagle_fx.launch: the run passed its timeout of {timeout} s; stopping every process\n")
            status = status or 124
            break
        if failed_at is not None and now - failed_at > grace:
            with lock:
                out.write(f"eagle_fx.launch: a process exited with status {status}; stopping the others\n")
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        rc = p.wait()
        if rc != 0 and status == 0:
            status = rc
    return 128 - status if status < 0 else status      # killed by signal k: 128 + k, as a shell says


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m eagle_fx.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, required=True, help="processes to start on this machine")
    ap.add_argument("--devices", type=int, default=None, help="host (CPU) devices per process")
    ap.add_argument("--coordinator", default=None, help="host:port of process 0 (default: a free local port)")
    ap.add_argument("--num-processes", type=int, default=None, help="processes over all hosts (default: -n)")
    ap.add_argument("--first-id", type=int, default=0, help="the id of this machine's first process")
    ap.add_argument("--timeout", type=float, default=None, help="seconds before every process is killed")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds the others get after one fails")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="the script and its arguments")
    a = ap.parse_args(argv)
    if not a.script:
        ap.error("give the script to run: python -m eagle_fx.launch -n 2 script.py")
    if a.n < 1:
        ap.error(f"-n {a.n}: start at least one process")
    return launch(a.script, a.n, a.devices, a.coordinator, a.num_processes, a.first_id, a.timeout, a.grace)


if __name__ == "__main__":
    sys.exit(main())
