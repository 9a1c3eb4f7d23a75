"""Samples sharded over 4 simulated CPU devices: tests/sharding_check.py in a fresh process (the
device count is fixed when JAX starts)."""
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def test_samples_sharded_over_four_devices():
    pytest.importorskip("jax")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    run = subprocess.run([sys.executable, str(HERE / "sharding_check.py")], capture_output=True, text=True,
                         timeout=300, env=env, cwd=HERE.parent)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "sharding checks passed" in run.stdout
