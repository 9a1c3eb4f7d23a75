"""Graphs and gradients on a mesh of 2 processes x 2 host devices on this machine (JAX's gloo CPU
collectives), started by `python -m eagle_fx.launch`, checked shard by shard against the
single-process run (tests/multiprocess_check.py); and the launcher's own behaviour: a dead process
fails the run within its grace period instead of hanging, bad usage is refused."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from eagle_fx import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def run_launcher(*args, timeout=280):
    return subprocess.run([sys.executable, "-m", "eagle_fx.launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=ROOT)


@pytest.mark.slow
def test_two_processes_give_the_single_process_results():
    pytest.importorskip("jax")
    r = run_launcher("-n", "2", "--devices", "2", "--timeout", "240", str(ROOT / "tests" / "multiprocess_check.py"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for pid in (0, 1):
        assert f"[{pid}] multiprocess checks passed in process {pid}" in out, out[-4000:]


@pytest.mark.slow
def test_a_killed_process_fails_the_run_without_hanging(tmp_path):
    pytest.importorskip("jax")
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent("""
        import os
        import numpy as np
        from eagle_fx import launch
        pid, n = launch.initialize()
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((2,), ("s",))
        if pid == 1:
            os.kill(os.getpid(), 9)                  # dies before the collective process 0 waits in
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("s")), np.ones(4))
        print(float(jax.jit(lambda a: a.sum())(x)))
    """))
    r = run_launcher("-n", "2", "--grace", "3", "--timeout", "200", str(script), timeout=240)
    assert r.returncode == 128 + 9, (r.returncode, r.stdout[-3000:])
    assert "a process exited with status" in r.stdout and "stopping the others" in r.stdout


def test_a_failing_process_sets_the_status_and_the_output_names_each_process(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import os, sys\npid = int(os.environ['EAGLE_FX_PROCESS_ID'])\nprint('hello from', pid)\n"
                      "sys.exit(5 if pid == 1 else 0)\n")
    r = run_launcher("-n", "2", str(script), timeout=60)
    assert r.returncode == 5
    assert "[0] hello from 0" in r.stdout and "[1] hello from 1" in r.stdout


def test_bad_usage_is_refused():
    r = run_launcher("-n", "0", "x.py", timeout=60)
    assert r.returncode != 0 and "start at least one process" in r.stderr
    r = run_launcher("-n", "2", timeout=60)
    assert r.returncode != 0 and "give the script to run" in r.stderr


def test_initialize_alone_is_one_process_and_half_an_environment_is_refused(monkeypatch):
    for v in (launch.COORDINATOR, launch.NUM_PROCESSES, launch.PROCESS_ID):
        monkeypatch.delenv(v, raising=False)
    assert launch.initialize() == (0, 1)
    monkeypatch.setenv(launch.COORDINATOR, "127.0.0.1:1")
    with pytest.raises(RuntimeError, match="EAGLE_FX_NUM_PROCESSES, EAGLE_FX_PROCESS_ID is not"):
        launch.initialize()
