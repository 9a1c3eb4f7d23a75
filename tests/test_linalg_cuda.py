"""hawk_fx.linalg and the new math on the CUDA emitter: the C of a kernel using them compiles with
NVRTC, and, run in the host emulation (g++), gives the NumPy emitter's values."""
import numpy as np
import pytest

import hawk_fx as hawk
from hawk_fx import Matrix, Vector
from hawk_fx import math as hm
from hawk_fx.emit import cuda
from test_cuda_emit import EMU_N, Batch, emu_build, emu_check, layout_for

FLOATS = [np.dtype(np.float32), np.dtype(np.float64)]


@hawk.kernel
def small_la(a: Matrix[3, 3], b: Vector[3]):
    s = a @ hm.transpose(a)
    w, v = hm.linalg.eigh(s)
    return (hm.linalg.solve(a, b), hm.linalg.det(a), hm.linalg.cholesky(s), hm.linalg.qr(a)[1], w,
            hm.linalg.lstsq(a, b), hm.argmax(b), hm.argmin(b), hm.copysign(b[0], b[1]), hm.spacing(b[2]),
            hm.fdim(b[0], b[1]), hm.fma(b[0], b[1], b[2]), hm.rint(b[0] * 3.0), hm.remainder(b[0], 0.7))


def _specs(dt):
    return [small_la.specialize(layout_for(small_la, dt))]


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_linalg_kernel_compiles(nvrtc, dt):
    b = Batch()
    for k, spec in enumerate(_specs(dt)):
        b.bodies.append(cuda.emit_specialization(spec, f"small_la_{k}", prelude=False))
    b.compile()


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_linalg_kernel_emulated_matches_numpy(dt, tmp_path):
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("no g++ for the host emulation")
    rng = np.random.default_rng(11)
    spec = _specs(dt)[0]
    ek = cuda.emit_specialization(spec, "small_la_emu", prelude=False)
    lib = emu_build([ek], tmp_path)
    a = (rng.normal(size=(3, 3, EMU_N)) + 4.0 * np.eye(3)[:, :, None]).astype(dt)     # well conditioned
    b = rng.normal(size=(3, EMU_N)).astype(dt)
    b[:, :5] = [[1.0, 1.0, 0.0, -0.0, 2.0], [1.0, -0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 1.0, 1.0, 2.0]]   # ties, zeros
    emu_check(lib, ek, spec.prog, [a, b], 2e-5 if dt == np.float32 else 1e-12)
