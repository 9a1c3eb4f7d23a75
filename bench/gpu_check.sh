#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one go (a machine with an NVIDIA GPU, driver >= 12.8):
#   1. installs the package with its CUDA 12 and test extras (CuPy, cuda.core, NVRTC) - nothing else
#   2. python -m pytest tests/gpu -q   the builder tour, the combination tests and the derivative
#                                      programs (record=True, grad, checkpoints=) on CuPy arrays
#                                      against the NumPy backend (a skip is an error here)
#   3. python bench/bench_gpu.py       replay vs one-by-one launches, per-node cost, device loops
#   4. python bench/bench_reverse.py --cuda   recorded forward + reverse / forward, and the
#                                      checkpointing table (device bytes), on CuPy arrays
# Run from anywhere: bash bench/gpu_check.sh   (about 4-6 minutes; every step has its own time limit,
# 9 minutes in all). Extra arguments go to bench_gpu.py (e.g. --quick).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
step() { echo; echo "== $1 ($(( SECONDS - start )) s)"; }

step "install: pip install -e '.[cuda12,test]'"
if ! timeout 200 python -m pip install -q --disable-pip-version-check -e '.[cuda12,test]'; then
    echo "pip install failed (no index reachable?); going on if the packages are already installed"
    python -c "import cupy, cuda.core, cuda.bindings.nvrtc, pytest, eagle_fx"
fi
python - <<'PY'
import cupy, cuda.core
print(f"cupy {cupy.__version__}, cuda.core {cuda.core.__version__}, "
      f"devices {cupy.cuda.runtime.getDeviceCount()}, driver {cupy.cuda.runtime.driverGetVersion()}")
PY
command -v nvidia-smi >/dev/null && nvidia-smi -L || true

step "tests: python -m pytest tests/gpu -q"
EAGLE_FX_REQUIRE_GPU=1 timeout 180 python -m pytest tests/gpu -q -p no:cacheprovider -rs

step "benchmarks: python bench/bench_gpu.py $*"
timeout 90 python bench/bench_gpu.py "$@"

step "reverse benchmarks: python bench/bench_reverse.py 1e6 --cuda --turns 2000"
timeout 90 python bench/bench_reverse.py 1e6 --cuda --turns 2000

step "gpu_check: all passed in $(( SECONDS - start )) s"
